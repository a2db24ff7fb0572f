"""Pictures of trained models: attention maps, attention rollout, position similarity, alignments.

``tokennet viz RUN_DIR`` loads the run (:func:`tokennet.load`) and draws what its *task* declares: the
task's :meth:`~tokennet.tasks.Task.draw` (see :mod:`tokennet.tasks`), which usually calls a drawing
function of this package::

    draw(run: Run, out_dir: Path, **options) -> list[Path]   # the PNG files it wrote

``options`` are the CLI's optional arguments (``index``, ``patch``, ``layer``, ``head``, ``data``,
``text``, ``image``, ``audio``, and any a task declares; None when not given). A function uses those it
understands and ignores the rest. Attention comes from each model's ``attention_maps`` (returned data, the
plain formula), so runs trained with a fused backend work. Expected failures (an option out of range,
data missing) raise ``ValueError`` / ``FileNotFoundError``.

The modules here are the drawing functions (this package sits below :mod:`tokennet.tasks` and never imports
it): ``attention_maps`` (patch attention, rollout, position similarity, and the plotting helpers),
``alignment`` (cross-attention), and one per family of pictures (``vit``, ``audio``, ``language``, ``graph``,
``sphere``). :func:`register_viz` (kept from before tasks declared their pictures) replaces the pictures of
a task kind.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

__all__ = ["register_viz", "get_viz", "list_viz", "visualize"]

_VIZ: dict[str, Callable[..., list[Path]]] = {}


def register_viz(kind: str, fn: Callable[..., list[Path]]) -> None:
    """Replace the pictures of a task kind with ``fn`` (see the module docstring for the signature)."""
    _VIZ[kind] = fn


def list_viz() -> list[str]:
    """The task kinds ``tokennet viz`` can draw: every registered task that declares pictures."""
    from ..plugins import list_tasks

    return sorted({t.kind for t in list_tasks().values() if t.declares("draw")} | set(_VIZ))


def get_viz(kind: str) -> Callable[..., list[Path]]:
    """The pictures of a task kind: ``fn(run, out_dir, **options)``."""
    from ..errors import RunError
    from ..plugins import list_tasks

    if kind in _VIZ:
        return _VIZ[kind]
    for task in list_tasks().values():
        if task.kind == kind and task.declares("draw"):
            return task.draw
    raise RunError(f"no pictures for a {kind!r} run; available for: {', '.join(list_viz())}")


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
    draw = _VIZ.get(run.task.kind, run.task.draw)
    out = Path(out_dir) if out_dir is not None else run.path / "viz"
    out.mkdir(parents=True, exist_ok=True)
    return draw(run, out, **options)

