"""``tokennet heads RUN``: each head ablated in turn, the cost per group as a table (or JSON); the CLI registers it."""

from __future__ import annotations

import argparse
import json

from ..attention.ablation import ABLATIONS
from ..device import resolve_device
from .heads import THRESHOLDS, HeadJobs, head_jobs

__all__ = ["add_heads_parser", "heads_command", "format_head_jobs"]

DESCRIPTION = (
    "Which head does which job: ablate each attention head of a run in turn (its output zeroed, or replaced by its "
    "mean output over the evaluated examples) and measure what the model gets worse at. A question-answering run "
    "(vqa): exact match per question template on its held-out test questions, each head's mean attention distance "
    "(pixels) and where the question's summary token attends through it (the asked animal's patches, the other "
    "patches, the question's words, itself). A language model: the validation loss, overall and by the kind of "
    "character predicted, and each head's mean attention distance (tokens back). A head is necessary for a group "
    f"when its ablation costs more than {THRESHOLDS['vqa']:g} accuracy points (language models: "
    f"{THRESHOLDS['language-model']:g} nats). Prints a table, or JSON with --json; writes nothing. A run whose model "
    "has no attention heads (a CNN), or a layer or head outside the model, is refused in one line.")

TARGETS = (("asked", "asked"), ("other_patches", "other"), ("words", "words"), ("summary", "self"))


def add_heads_parser(sub) -> None:
    """Add ``heads`` to the CLI's subcommands."""
    cmd = sub.add_parser("heads", help="ablate each attention head of a run: what it is necessary for, how far it "
                         "looks, where the question attends through it", description=DESCRIPTION)
    cmd.add_argument("run_dir", help="a run directory (vqa or a language model)")
    cmd.add_argument("--ablation", choices=ABLATIONS, default="zero",
                     help="zero: the head's output set to 0; mean: set to its mean over the evaluated examples")
    cmd.add_argument("--limit", type=int, default=None,
                     help="held-out examples to evaluate on (vqa: questions, default 1000; a language model: "
                     "windows of its context, default 32)")
    cmd.add_argument("--layer", type=int, default=None, help="only this layer's heads (from 0)")
    cmd.add_argument("--head", type=int, default=None, help="only this head of each layer (from 0)")
    cmd.add_argument("--json", action="store_true", help="print the measurements as JSON instead of a table")
    cmd.add_argument("--device", default="cpu", help="cpu (default), cuda, ...")


def heads_command(args: argparse.Namespace) -> int:
    """Load the run, measure its heads, print the table or the JSON."""
    from ..run import load

    run = load(args.run_dir, device=str(resolve_device(args.device)))
    jobs = head_jobs(run, ablation=args.ablation, limit=args.limit, layer=args.layer, head=args.head)
    print(json.dumps(jobs.to_dict(), indent=1) if args.json else format_head_jobs(jobs))
    return 0


def _cell(value) -> str:
    return "—" if value is None else f"{value:.1f}" if abs(value) >= 0.1 or value == 0 else f"{value:.3f}"


def format_head_jobs(jobs: HeadJobs) -> str:
    """The table: the unablated metric per group, then each head's cost per group, its distance and (vqa) the
    summary token's shares; the necessary heads under it."""
    lost = "points lost" if jobs.higher_is_better else "nats gained"
    fmt = (lambda value: f"{value:.3f}") if jobs.unit == "nats" else _cell
    targets = [(key, label) for key, label in TARGETS if any(key in job.attends for job in jobs.heads)]
    if any(job.attends.get("sink") for job in jobs.heads):  # a model with a sink (transformer=tuned)
        targets.append(("sink", "sink"))
    head = ["head", *jobs.groups, f"dist {jobs.distance_unit}", *(label for _, label in targets)]
    rows = [["unablated", *(fmt(jobs.baseline[group]) for group in jobs.groups), "", *("" for _ in targets)]]
    rows += [[job.name, *(fmt(job.cost[group]) for group in jobs.groups), _cell(job.distance),
              *(f"{job.attends[key]:.2f}" for key, _ in targets)] for job in jobs.heads]
    widths = [max(len(row[col]) for row in [head, *rows]) for col in range(len(head))]
    lines = [f"{jobs.metric} ({jobs.unit}) on {jobs.examples} held-out {jobs.example_name}; each head's row: {lost} "
             f"with it ablated ({jobs.ablation})"]
    lines += ["  ".join(cell.rjust(width) if col else cell.ljust(width) for col, (cell, width)
                        in enumerate(zip(row, widths, strict=True))).rstrip() for row in [head, *rows]]
    if targets:
        lines.append(f"{'/'.join(label for _, label in targets)}: the summary token's attention through that head "
                     f"(the asked animals cover {jobs.extra.get('asked_patch_share', 0):.2f} of the patches)")
    if jobs.typical_error() is not None:
        lines.append(f"a cost's standard error (the same questions asked with and without the head): "
                     f"{jobs.typical_error():.1f} points on a template (median)")
    necessary = jobs.necessary()
    unit = "points" if jobs.higher_is_better else "nats"
    lines.append(f"necessary (cost > {jobs.threshold:g} {unit}): " + "; ".join(
        f"{group}: {', '.join(names) or 'none'}" for group, names in necessary.items()))
    return "\n".join(lines)
