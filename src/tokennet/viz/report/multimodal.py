"""The report panel of multimodal runs: every task's validation loss on one figure, how the shared digit head agrees
across modalities, then each task's own panel."""

from __future__ import annotations

from .curves import _axes
from .html import Section, esc, img, number, png_of, table

__all__ = ["multimodal_panel", "loss_figure", "cross_modal_table"]


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


def cross_modal_table(cross: dict) -> str:
    """``metrics.json``'s ``cross_modal`` as a table: per pair of digit tasks, the agreement of the shared head on
    same-digit pairs, how often both are right, and each direction's retrieval accuracies."""
    rows = []
    for pair in cross.get("agreement", {}):
        first, second = pair.split("_", 1)
        cells = [esc(f"{first} · {second}"), number(cross["agreement"][pair], f"cross_modal.agreement.{pair}"),
                 number(cross["both_right"][pair], f"cross_modal.both_right.{pair}")]
        for kind in ("nearest", "class_mean"):
            cells.append(" / ".join(number(cross[kind][f"{x}_to_{y}"], f"cross_modal.{kind}.{x}_to_{y}")
                                    for x, y in ((first, second), (second, first))))
        rows.append(cells)
    return table(["digit tasks a · b", "same answer (same-digit pairs)", "both right",
                  "nearest-neighbour retrieval a→b / b→a", "class-mean retrieval a→b / b→a"], rows,
                 num_cols=(1, 2, 3, 4))


def multimodal_panel(run, log, parts) -> list[Section]:
    """``parts``: ``[(task, that task's run)]``. The loss figure, then each part's panel, its headings prefixed by
    the task and its metrics' ``data-metric`` keys by ``<task>.`` (where ``metrics.json`` nests them)."""
    out: list[Section] = []
    png = loss_figure(log, [task for task, _ in parts])
    if png is not None:
        out.append(("Held-out loss per task (one trunk)", img(png, "held-out loss per task")))
    cross = run.metrics.get("cross_modal")
    if isinstance(cross, dict) and cross.get("agreement"):
        out.append(("The shared digit head across modalities", cross_modal_table(cross)))
    for task, part in parts:
        for heading, body in part.task.panel(part, log):
            out.append((f"{esc(task)}: {heading}", body.replace('data-metric="', f'data-metric="{task}.')))
    return out
