"""Heads × groups: what each attention head is necessary for, drawn from ``tokennet heads``' measurements
(:func:`~tokennet.tasks.heads.head_jobs`, as a dict)."""

from __future__ import annotations

import io

from .attention_maps import pyplot

__all__ = ["draw_head_costs"]


def _panel(ax, jobs: dict, limit: float) -> object:
    """One heat map: a row per head, a column per group, the cost of ablating that head on that group."""
    names = [f"L{job['layer']}H{job['head']}" for job in jobs["heads"]]
    groups = jobs["groups"]
    costs = [[job["cost"][group] for group in groups] for job in jobs["heads"]]
    image = ax.imshow(costs, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto")
    for row, values in enumerate(costs):
        for col, value in enumerate(values):
            bold = value > jobs["threshold"]
            ax.text(col, row, f"{value:.1f}" if jobs["unit"] != "nats" else f"{value:.2f}", ha="center",
                    va="center", fontsize=6.5, fontweight="bold" if bold else "normal")
    ax.set_xticks(range(len(groups)), groups, rotation=35, ha="right", fontsize=7)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.set_title(f"ablation: {jobs['ablation']}", fontsize=8)
    return image


def draw_head_costs(measured: list[dict]) -> bytes:
    """A heat map per ablation in ``measured`` (each a :meth:`~tokennet.tasks.heads.HeadJobs.to_dict`): rows are
    heads, columns groups (question templates), each cell how much worse the metric got with that head ablated
    (accuracy points lost, or nats gained); bold above the threshold that makes a head necessary. PNG bytes."""
    plt = pyplot()
    first = measured[0]
    limit = max([abs(value) for jobs in measured for job in jobs["heads"] for value in job["cost"].values()]
                + [2 * first["threshold"]])
    rows = len(first["heads"])
    fig, axes = plt.subplots(1, len(measured), figsize=(1.2 + 0.75 * len(first["groups"]) * len(measured),
                                                        1.2 + 0.28 * rows), squeeze=False)
    image = None
    for ax, jobs in zip(axes[0], measured, strict=True):
        image = _panel(ax, jobs, limit)
    lost = "accuracy points lost" if first["higher_is_better"] else "nats of loss gained"
    fig.colorbar(image, ax=list(axes[0]), shrink=0.8, label=lost)
    fig.suptitle(f"what each head is necessary for ({first['metric']}, {first['examples']} held-out "
                 f"{first['example_name']}; bold: > {first['threshold']:g})", fontsize=8)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()
