"""Pictures of trained models: attention maps, attention rollout, position similarity, alignments.

``tokennet viz RUN_DIR`` loads the run (:func:`tokennet.load`) and draws what its *task* calls for
(:mod:`tokennet.tasks`: the task's ``kind``), with a function registered by :func:`register_viz`::

    fn(run: Run, out_dir: Path, **options) -> list[Path]   # the PNG files it wrote

``options`` are the CLI's optional arguments (``index``, ``patch``, ``layer``, ``head``, ``data``,
``text``, ``image``; None when not given). A function uses those it understands and ignores the rest,
so a task can add its own options without touching the others. Attention comes from each model's
``attention_maps`` (returned data, the plain formula), so runs trained with a fused backend work.
Expected failures (an option out of range, data missing) raise ``ValueError`` / ``FileNotFoundError``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

__all__ = ["register_viz", "get_viz", "list_viz", "visualize"]

_VIZ: dict[str, Callable[..., list[Path]]] = {}


def register_viz(kind: str, fn: Callable[..., list[Path]]) -> None:
    """Register the pictures of a task kind (see the module docstring for the signature)."""
    _VIZ[kind] = fn


def list_viz() -> list[str]:
    """The task kinds ``tokennet viz`` can draw."""
    return sorted(_VIZ)


def get_viz(kind: str) -> Callable[..., list[Path]]:
    from ..errors import RunError

    if kind not in _VIZ:
        raise RunError(f"no pictures for a {kind!r} run; available for: {', '.join(list_viz())}")
    return _VIZ[kind]


def visualize(run, out_dir: str | Path | None = None, *, device: str = "cpu", **options) -> list[Path]:
    """Draw the pictures of a trained run into ``out_dir``.

    Args:
        run: a :class:`~tokennet.run.Run` or a run directory.
        out_dir: where the PNGs go (default ``RUN_DIR/viz``).
        device: where to run the model when ``run`` is a directory.
        **options: passed to the task's viz function.
    """
    from ..run import Run, load

    if not isinstance(run, Run):
        run = load(run, device=device)
    fn = get_viz(run.task.kind)
    out = Path(out_dir) if out_dir is not None else run.path / "viz"
    out.mkdir(parents=True, exist_ok=True)
    return fn(run, out, **options)


# Task kinds register on import, after register_viz exists.
from . import alignment as _alignment  # noqa: E402, F401
from . import audio as _audio  # noqa: E402, F401
from . import graph as _graph  # noqa: E402, F401
from . import language as _language  # noqa: E402, F401
from . import sphere as _sphere  # noqa: E402, F401
from . import vit as _vit  # noqa: E402, F401
