"""The report's "Heads' jobs" section: each head ablated in turn, what it cost per question template (a table and a
heat map), from :func:`~tokennet.tasks.heads.head_jobs`'s measurements (as dicts)."""

from __future__ import annotations

from ..heads import draw_head_costs
from .html import esc, img, table

__all__ = ["heads_section"]

TARGETS = (("asked", "asked animal"), ("other_patches", "other patches"), ("words", "words"), ("summary", "itself"))


def _table(jobs: dict) -> str:
    groups = jobs["groups"]
    targets = TARGETS + ((("sink", "sink"),) if any(job["attends"].get("sink") for job in jobs["heads"]) else ())
    header = ["head", *(f"<code>{esc(group)}</code>" for group in groups), f"distance ({esc(jobs['distance_unit'])})",
              *(esc(label) for _, label in targets)]
    rows = [["unablated", *(f"{jobs['baseline'][group]:.1f}" for group in groups), "", *("" for _ in targets)]]
    for job in jobs["heads"]:
        costs = [f"<b>{job['cost'][group]:.1f}</b>" if job["cost"][group] > jobs["threshold"]
                 else f"{job['cost'][group]:.1f}" for group in groups]
        distance = "—" if job["distance"] is None else f"{job['distance']:.1f}"
        shares = [f"{job['attends'][key]:.2f}" if key in job["attends"] else "—" for key, _ in targets]
        rows.append([f"L{job['layer']}H{job['head']}", *costs, distance, *shares])
    return table(header, rows, num_cols=tuple(range(1, len(header))))


def _noise(jobs: dict) -> str:
    error = jobs.get("typical_error")
    per = jobs["examples"] // max(1, len(jobs["groups"]) - 1)
    return (f"; with about {per} questions a template, a cost's standard error is {error:.1f} points (median)"
            if error is not None else "")


def heads_section(measured: list[dict]) -> str:
    """The section's HTML for one or more ablations of the same run (the first one's table, every one's map)."""
    first = measured[0]
    necessary = "; ".join(f"<code>{esc(group)}</code>: {', '.join(names) or 'none'}"
                          for group, names in first["necessary"].items())
    modes = " and ".join(jobs["ablation"] for jobs in measured)
    return (
        '<p class="sub">The lecture: <i>"each attention layer can be attending to different things"</i>. Each head '
        f"of each layer is ablated in turn ({modes}: its output zeroed, or replaced by its mean over these "
        f"questions) and the {esc(first['examples'])} first held-out questions asked again; a row gives the exact "
        f"match points lost per template (the first row: the model unablated, %){_noise(first)}. "
        "Distance: how far in the picture a patch's attention reaches through that head (pixels). The last "
        "columns: where the question's summary token attends through it (shares of its attention; the asked animals "
        f"cover {first['extra'].get('asked_patch_share', 0):.2f} of the patches).</p>"
        + _table(first)
        + f'<p class="sub">Necessary (ablation {esc(first["ablation"])} costs more than {first["threshold"]:g} '
        f"points): {necessary}. Every head, on more questions: <code>tokennet heads RUN</code> (<code>--ablation "
        "mean</code>, <code>--json</code>).</p>"
        + img(draw_head_costs(measured), "heads × templates: accuracy lost with each head ablated",
              "accuracy points lost per template with each head ablated (tokennet heads)"))
