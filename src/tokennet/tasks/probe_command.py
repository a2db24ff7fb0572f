"""``tokennet probe RUN``: what each animal patch's token knows of its species, depth by depth, with and without the
patches that look like it (:mod:`tokennet.tasks.vqa_probe`); the CLI registers it."""

from __future__ import annotations

import argparse
import json

from ..device import resolve_device
from ..errors import ConfigError
from .vqa_probe import PROBE_CUTS, probe_run

__all__ = ["add_probe_parser", "probe_command", "format_probe"]

DESCRIPTION = (
    "The lecture's impala and gazelle: \"I'm not sure if I'm an impala or I'm a gazelle ... So I will attend to "
    "other things that look like me in the image.\" For a question-answering run on tokennet's generated scenes, "
    "draw new pictures, read every animal patch's token at the trunk's input and after each block, and fit a "
    "linear probe (logistic regression) on 70% of the pictures to name the animal's species; print its accuracy "
    "on the other 30% per depth. Controls: the same trained model with attention cut, in every layer, from a "
    "patch to the other patches of its own animal (own), or to every patch of an animal of its species (alike). "
    "Writes nothing. A run of another task, on your own pictures, or whose model has no patch tokens (a CNN) is "
    "refused in one line.")


def add_probe_parser(sub) -> None:
    """Add ``probe`` to the CLI's subcommands."""
    cmd = sub.add_parser("probe", help="a linear probe of each animal patch's species, depth by depth, with its "
                         "look-alikes' attention cut as the control (vqa runs)", description=DESCRIPTION)
    cmd.add_argument("run_dir", help="a vqa run directory (tokennet train vqa)")
    cmd.add_argument("--pictures", type=int, default=400,
                     help="pictures to draw (default 400: 70%% fit the probe, 30%% score it)")
    cmd.add_argument("--cut", choices=PROBE_CUTS, action="append", default=None,
                     help="the runs to probe (repeatable; default all three: none, own, alike)")
    cmd.add_argument("--json", action="store_true", help="print the measurements as JSON instead of a table")
    cmd.add_argument("--device", default="cpu", help="cpu (default), cuda, ...")


def probe_command(args: argparse.Namespace) -> int:
    """Load the run, check it, probe it, print the table or the JSON."""
    from ..run import load

    if not 10 <= args.pictures <= 100_000:
        raise ConfigError(f"--pictures must be in 10..100000, got {args.pictures}")
    run = load(args.run_dir, device=str(resolve_device(args.device)))
    cuts = tuple(dict.fromkeys(args.cut)) if args.cut else PROBE_CUTS
    result = probe_run(run, pictures=args.pictures, cuts=cuts)
    print(json.dumps(result, indent=1) if args.json else format_probe(result, cuts))
    return 0


def format_probe(result: dict, cuts) -> str:
    """The table: one row per depth, one column per cut, accuracies in %."""
    names = {"none": "as trained", "own": "own patches cut", "alike": "look-alikes cut"}
    header = ["depth", *(names[cut] for cut in cuts)]
    rows = [[("input" if depth == 0 else f"after block {depth - 1}"), *(f"{result[cut][depth]:.1f}" for cut in cuts)]
            for depth in range(result["depths"])]
    widths = [max(len(row[col]) for row in [header, *rows]) for col in range(len(header))]
    lines = [f"species of each animal patch from its token, linear probe: test accuracy (%) on "
             f"{result['test_patches']} patches of {result['test_pictures']} pictures (chance {result['chance']:.1f}; "
             f"{result['patches_per_animal']:.2f} patches per animal)"]
    lines += ["  ".join(cell.ljust(width) if col == 0 else cell.rjust(width) for col, (cell, width)
                        in enumerate(zip(row, widths, strict=True))).rstrip() for row in [header, *rows]]
    if result["patches_per_animal"] <= 1.0 and "own" in cuts:
        lines.append("every animal fits in one patch here: 'own' cuts nothing (patch_size=8 gives four per animal)")
    return "\n".join(lines)
