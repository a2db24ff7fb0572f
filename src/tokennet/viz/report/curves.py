"""Training curves from ``log.jsonl``: loss against steps and against seconds, learning rate, gradient
norm, and the recipe's evaluation metrics. Each curve is one small PNG."""

from __future__ import annotations

from ..attention_maps import _plt
from .html import img, png_of
from .logs import LogData

__all__ = ["curve_figures"]

TRAIN, VAL = "#3b75af", "#d9622b"


def _log_scale_helps(*series: list[float]) -> bool:
    """Log scale when every value is positive and they span more than a factor of 3."""
    vals = [v for curve in series for v in curve]
    return bool(vals) and min(vals) > 0 and max(vals) / min(vals) > 3


def _log_y(ax, *series: list[float]) -> None:
    """Log-scale y with plain numbers (0.3, 1, 2) rather than 3×10⁻¹; minor ticks labelled within a decade."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    vals = [v for curve in series for v in curve]
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    # Within about a decade, label the minor ticks at 2 and 5 × 10^k (all nine would overlap).
    two_five = FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "25" else "")
    ax.yaxis.set_minor_formatter(two_five if max(vals) / min(vals) < 30 else NullFormatter())
    ax.tick_params(axis="y", which="minor", labelsize=8)


def _axes(title: str, xlabel: str, ylabel: str):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.6, 3.3))
    ax.set_title(title, fontsize=11)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _loss_figure(data: LogData, x: str, xlabel: str) -> bytes | None:
    train_x, train_y = data.series("train", "loss", x)
    val_x, val_y = data.series("eval", "val_loss", x)
    test_x, test_y = data.series("eval", "test_loss", x)
    if not (train_y or val_y or test_y):
        return None
    fig, ax = _axes(f"loss against {xlabel.split(' (')[0]}", xlabel, "loss (nats)")
    if train_y:
        ax.plot(train_x, train_y, color=TRAIN, lw=1.4, label="train (batch)")
    for curve_x, curve_y, name in ((val_x, val_y, "validation"), (test_x, test_y, "test")):
        if curve_y:
            ax.plot(curve_x, curve_y, color=VAL, lw=1.6, marker="o", ms=4, label=name)
    if _log_scale_helps(train_y, val_y, test_y):
        _log_y(ax, train_y, val_y, test_y)
    ax.legend(fontsize=9)
    return png_of(fig)


def _single(data: LogData, kind: str, key: str, title: str, ylabel: str, color: str, log: bool = False) -> bytes | None:
    steps, values = data.series(kind, key)
    if not values:
        return None
    fig, ax = _axes(title, "step", ylabel)
    ax.plot(steps, values, color=color, lw=1.4, marker="o" if len(values) < 30 else None, ms=3)
    if log and _log_scale_helps(values):
        _log_y(ax, values)
    return png_of(fig)


def curve_figures(data: LogData) -> tuple[list[str], list[str]]:
    """``(figures as HTML, notes)``: what the log can draw, and a line for each curve it cannot."""
    figs, notes = [], []
    for x, label in (("step", "step"), ("elapsed", "seconds (training, evaluation excluded)")):
        png = _loss_figure(data, x, label)
        if png is not None:
            figs.append(img(png, f"loss against {label}"))
    lr = _single(data, "train", "lr", "learning rate", "lr", "#6a4c93")
    if lr is not None:
        figs.append(img(lr, "learning rate against step"))
    grad_norm = _single(data, "train", "grad_norm", "gradient norm (before clipping)", "‖g‖₂", "#2a9d8f", log=True)
    if grad_norm is not None:
        figs.append(img(grad_norm, "gradient norm against step"))
    elif data.train:
        notes.append("This run's log has no gradient norm (it was trained before tokennet logged grad_norm).")
    for key in data.eval_keys():
        if key in ("val_loss", "test_loss", "train_loss"):
            continue
        png = _single(data, "eval", key, f"{key} (evaluations)", key, VAL)
        if png is not None:
            figs.append(img(png, f"{key} against step"))
    return figs, notes
