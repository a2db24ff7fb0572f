"""The report panel of multimodal runs: every task's validation loss on one figure, then each task's own panel."""

from __future__ import annotations

from .curves import _axes
from .html import Section, esc, img, png_of

__all__ = ["multimodal_panel", "loss_figure"]


def loss_figure(log, tasks: list[str]) -> bytes | None:
    """Each task's held-out loss (``val_loss_<task>``, else ``test_loss_<task>``) against the step, one line per
    task on one figure; None when the log has none."""
    series = []
    for task in tasks:
        for key in (f"val_loss_{task}", f"test_loss_{task}"):
            steps, losses = log.series("eval", key)
            if losses:
                series.append((task, steps, losses))
                break
    if not series:
        return None
    fig, ax = _axes("held-out loss per task", "step", "loss (nats)")
    for task, steps, losses in series:
        ax.plot(steps, losses, lw=1.6, marker="o", ms=4, label=task)
    ax.legend(fontsize=9)
    return png_of(fig)


def multimodal_panel(run, log, parts) -> list[Section]:
    """``parts``: ``[(task, that task's run)]``. The loss figure, then each part's panel, its headings prefixed by
    the task and its metrics' ``data-metric`` keys by ``<task>.`` (where ``metrics.json`` nests them)."""
    out: list[Section] = []
    png = loss_figure(log, [task for task, _ in parts])
    if png is not None:
        out.append(("Held-out loss per task (one trunk)", img(png, "held-out loss per task")))
    for task, part in parts:
        for heading, body in part.task.panel(part, log):
            out.append((f"{esc(task)}: {heading}", body.replace('data-metric="', f'data-metric="{task}.')))
    return out
