"""tokennet: turn any data into tokens, then one generic transformer processes the tokens.

The public API is re-exported here; see the package map in the README.
"""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"

__all__ = ["__version__", "load", "create_model", "list_models", "generate", "attention", "MultiHeadAttention"]


def load(run_dir: str | Path, *, allow_pickle: bool = False):
    """Load a trained run (or saved model) directory; ``model.tokenizer`` is set for text models (else None).

    Weights come from ``model.safetensors`` only, unless ``allow_pickle=True`` (see
    :func:`tokennet.models.load_pretrained`).
    """
    from .models.registry import load_pretrained
    from .tokens.text import load_tokenizer

    run_dir = Path(run_dir)
    model = load_pretrained(run_dir, allow_pickle=allow_pickle)
    model.tokenizer = load_tokenizer(run_dir) if (run_dir / "tokenizer.json").is_file() else None
    model.eval()
    return model


def __getattr__(name: str):
    # Lazy re-exports keep `import tokennet` (and `tokennet --help`) fast.
    if name in ("create_model", "list_models"):
        from . import models

        return getattr(models, name)
    if name == "generate":
        from .generate import generate

        return generate
    if name in ("attention", "MultiHeadAttention"):
        from . import attention

        return getattr(attention, name)
    raise AttributeError(f"module 'tokennet' has no attribute {name!r}")
