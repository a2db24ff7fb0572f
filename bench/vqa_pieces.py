"""What each task-specific piece adds to the lecture's generic transformer on ``vqa``, one at a time, on the same seeds.

The ``vqa`` default is the lecture's model (linear patch embeddings, full self-attention, no sink, the answer read
from the summary token by one linear map). The tuned model (``--set transformer=tuned``) is that model with five
pieces built for the task; here each is added to the generic default alone, everything else as the default run
trains it (``tokennet train vqa --seed S --set baselines=false PIECE``, the CNN baselines not trained: they do not
change the transformer's figures):

    PYTHONPATH=src python bench/vqa_pieces.py --seeds 0 1 2 --parallel 2     # every piece, two runs at once
    PYTHONPATH=src python bench/vqa_pieces.py --pieces generic mask --seeds 0   # some of them
    PYTHONPATH=src python bench/vqa_pieces.py --collect                       # only read runs in --runs-dir

Prints the medians over seeds per template and each piece's change against ``generic`` (the same seeds), and
writes ``bench/results/vqa_pieces.json`` (the command, the commit, the machine, every run's metrics and wall time,
the medians and each piece's change against ``generic``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import commit, machine  # noqa: E402
from vqa_default import TEMPLATES, collect, run_seed  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# name → the settings that add the piece to the generic default (docs/experiments/vqa.md measures each on the tuned
# model; tokennet.recipes.vqa.TUNED holds them all)
PIECES = {
    "generic": [],
    "stem": ["patch_stem=shape,colour", "stem_channels=48"],  # two tokens a patch: a shape and a colour stem
    "mask": ["modality_mask=patch-local"],  # a patch's tokens attend only to each other
    "read_layers": ["read_layers=1,2"],  # the question meets the patches in layers 1 and 2 only
    "sink": ["sink=true", "sink_logit=2.0"],  # a sink token with a learned score per head, starting at 2
    "points": ["answer_readout=points"],  # counts and colours read as points on a line and in RGB
}
KEYS = ["exact_match", *(f"exact_match_{t}" for t in TEMPLATES)]


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pieces", nargs="+", default=list(PIECES), choices=list(PIECES), metavar="PIECE",
                    help=f"which rows to run ({', '.join(PIECES)}; default: all)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--parallel", type=int, default=2, help="runs at once (one thread each when more than one)")
    ap.add_argument("--runs-dir", default="/tmp/tokennet-vqa-pieces", help="where the runs go (PIECE/seedS)")
    ap.add_argument("--collect", action="store_true", help="read the runs already in --runs-dir, train nothing")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "vqa_pieces.json"))
    ap.add_argument("--note", help="how the runs were made, kept in the JSON (with --collect: what the command cannot "
                    "say)")
    args = ap.parse_args(argv)
    if args.parallel < 1:
        ap.error("--parallel must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    runs_dir = Path(args.runs_dir)
    jobs = [(piece, seed) for piece in args.pieces for seed in args.seeds]
    failed = []
    if not args.collect:  # every run is tried: one that fails does not cancel the others (hours of them)
        threads = 1 if args.parallel > 1 else None
        with ThreadPoolExecutor(args.parallel) as ex:
            futures = {job: ex.submit(run_seed, job[1], runs_dir / job[0], threads,
                                      ["baselines=false", *PIECES[job[0]]]) for job in jobs}
        failed = [f"{p}/seed{s}" for (p, s), future in futures.items() if future.exception() is not None]
    missing = [f"{p}/seed{s}" for p, s in jobs
               if f"{p}/seed{s}" in failed or not (runs_dir / p / f"seed{s}" / "metrics.json").is_file()]
    if missing:
        print(f"error: no finished run for {', '.join(missing)} in {runs_dir}", file=sys.stderr)
        return 2
    rows = {p: [collect(s, runs_dir / p) for s in args.seeds] for p in args.pieces}
    medians = {p: {k: statistics.median(r["metrics"][k] for r in rows[p]) for k in KEYS} for p in args.pieces}
    print(f"\nvqa: the generic default with one piece added, seeds {args.seeds} (median exact match %; "
          "in brackets the change against generic)\n")
    print("| piece | settings | " + " | ".join(k.removeprefix("exact_match_") for k in KEYS) + " |")
    print("| --- | --- | " + " | ".join("---:" for _ in KEYS) + " |")
    change = {p: {k: round(medians[p][k] - medians["generic"][k], 3) for k in KEYS}
              for p in args.pieces if p != "generic"} if "generic" in medians else {}
    for p in args.pieces:
        cells = [f"{medians[p][k]:.1f}" + (f" ({change[p][k]:+.1f})" if p in change else "") for k in KEYS]
        print(f"| {p} | {' '.join(PIECES[p]) or '(default)'} | " + " | ".join(cells) + " |")
    result = {"benchmark": "vqa_pieces", "command": "python " + " ".join([sys.argv[0], *sys.argv[1:]]),
              "commit": commit(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "seeds": args.seeds, "pieces": {p: PIECES[p] for p in args.pieces}, "median": medians,
              "change_against_generic": change, **({"note": args.note} if args.note else {}),
              "runs": rows, "machine": machine(cpus_used=os.cpu_count())}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
