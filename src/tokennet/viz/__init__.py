"""Pictures of trained models: attention maps, attention rollout, position similarity.

``tokennet viz RUN_DIR`` dispatches on the run's model family (``config.json``'s ``family``) to a
function registered with :func:`register_viz`. A viz function has the signature::

    fn(run_dir: Path, out_dir: Path, **options) -> list[Path]   # the PNG files it wrote

where ``options`` are the CLI's optional arguments (``index``, ``patch``, ``layer``, ``head``, ``data``,
``device``, …; None when not given). A function uses those it understands and ignores the rest, so a
family can add its own CLI options without touching the others. Expected failures (an option out of
range, data missing) raise ``ValueError`` / ``FileNotFoundError``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

__all__ = ["register_viz", "get_viz", "list_viz", "visualize"]

_VIZ: dict[str, Callable[..., list[Path]]] = {}


def register_viz(family: str, fn: Callable[..., list[Path]]) -> None:
    """Register the viz function of a model family (see the module docstring for its signature)."""
    _VIZ[family] = fn


def list_viz() -> list[str]:
    """The model families ``tokennet viz`` can draw."""
    return sorted(_VIZ)


def get_viz(family: str) -> Callable[..., list[Path]]:
    if family not in _VIZ:
        raise ValueError(f"no visualization for model family {family!r}; available for: {', '.join(list_viz())}")
    return _VIZ[family]


def visualize(run_dir: str | Path, out_dir: str | Path | None = None, **options) -> list[Path]:
    """Draw the pictures of a trained run (a ``tokennet train`` directory) into ``out_dir``.

    Args:
        run_dir: the run directory (``config.json``, ``model.safetensors``, ``run.json``).
        out_dir: where the PNGs go (default ``RUN_DIR/viz``).
        **options: passed to the family's viz function.
    """
    run_dir = Path(run_dir)
    cfg = run_dir / "config.json"
    if not run_dir.is_dir() or not cfg.is_file():
        raise FileNotFoundError(f"{run_dir} is not a run directory (expected config.json and model.safetensors)")
    try:
        family = json.loads(cfg.read_text()).get("family")
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg} is not valid JSON: {e}") from None
    fn = get_viz(family)
    out = Path(out_dir) if out_dir is not None else run_dir / "viz"
    out.mkdir(parents=True, exist_ok=True)
    return fn(run_dir, out, **options)


# Families register on import, after register_viz exists.
from . import alignment as _alignment  # noqa: E402, F401
from . import vit as _vit  # noqa: E402, F401
