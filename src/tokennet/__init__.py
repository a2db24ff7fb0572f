"""tokennet: turn any data into tokens, then one generic transformer processes the tokens.

The public API is re-exported here (lazily, so ``import tokennet`` and ``tokennet --help`` stay fast);
see the package map in the README.

- ``tokennet.load(RUN_DIR) -> Run``: a trained run with ``.model``, ``.tokenizer``, ``.settings``,
  ``.metrics``, ``.task`` and the task's verbs (``generate``, ``translate``, ``caption``, ``classify``).
- ``tokennet.create_model(name, **config)``, ``tokennet.list_models()``: models by name.
- ``tokennet.generate(model, idx, max_new_tokens, ...)``: sampling over a KV cache.
- ``tokennet.attention``: the attention subpackage (``tokennet.attention.attention(q, k, v, mask)``, masks,
  scores, flash); ``tokennet.MultiHeadAttention``.
- ``tokennet.TokennetError``: the base of every expected error.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

__all__ = ["__version__", "load", "Run", "create_model", "list_models", "generate", "attention",
           "MultiHeadAttention", "TokennetError"]

# name -> (module, attribute or None for the module itself)
_EXPORTS = {
    "load": ("tokennet.run", "load"),
    "Run": ("tokennet.run", "Run"),
    "create_model": ("tokennet.models", "create_model"),
    "list_models": ("tokennet.models", "list_models"),
    "generate": ("tokennet.sampling", "generate"),
    "attention": ("tokennet.attention", None),
    "MultiHeadAttention": ("tokennet.attention.multihead", "MultiHeadAttention"),
    "TokennetError": ("tokennet.errors", "TokennetError"),
}


def __getattr__(name: str):
    # importlib, not `from . import x`: the latter looks the name up on this module first and re-enters
    # __getattr__ (infinite recursion for subpackages such as `attention`).
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tokennet' has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    obj = importlib.import_module(module)
    return obj if attr is None else getattr(obj, attr)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
