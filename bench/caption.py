"""Captioning shapes (recipe ``caption``): encoder–decoder vs decoder-only (prefix mask), back to back.

Trains both forms in one process with the recipe's defaults (``tokennet train caption`` and
``--set form=decoder-only``), validating on held-out combinations every ``--eval-interval`` steps, and
reports per form: parameters, steps, wall time, the first step at which validation exact match
reached the goal (95%), and the held-out test exact match (overall and by number of shapes).

Goal (issue #5): ≥ 95% exact caption match on the held-out combinations for at least one form.
Run it on an otherwise idle machine.

    python bench/caption.py
    python bench/caption.py --forms decoder-only --set max_iters=3000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from seq2seq import _env, _parse_sets, run  # noqa: E402  (same runner, another recipe)

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/_record.py, also when a test loads this file
from _record import write  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GOAL = 95.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--forms", nargs="+", default=["encoder-decoder", "decoder-only"],
                   choices=["encoder-decoder", "decoder-only"])
    p.add_argument("--eval-interval", type=int, default=None, help="validation every N steps (default: the recipe's)")
    p.add_argument("--set", dest="sets", nargs="*", default=[], help="recipe settings, key=value")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = p.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    extra = _parse_sets(args.sets)
    every = {} if args.eval_interval is None else {"eval_interval": args.eval_interval}
    results = [run("caption", {"form": f, **every, **extra}, f, goal=GOAL) for f in args.forms]
    print("\n| form | params | steps | wall s | first step ≥ 95% val (s) | test exact match % | by shapes 1/2/3 "
          "| token acc % |\n| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        m, h = r["metrics"], r["first_at_goal"]
        at = f"{h['step']} ({h['seconds']} s)" if h else "not reached"
        by = "/".join(str(m["exact_match_by_objects"].get(k, "-")) for k in ("1", "2", "3"))
        print(f"| {r['label']} | {m['num_parameters']:,} | {m['step']} | {r['wall_seconds']} | {at} | "
              f"{m['exact_match']:.2f} | {by} | {m['token_accuracy']:.2f} |")
    if len(results) == 2:
        print(f"\nwall-time ratio {results[0]['label']} / {results[1]['label']}: "
              f"{results[0]['wall_seconds'] / results[1]['wall_seconds']:.2f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "caption.json"
    write(path, {"results": results, "env": _env()}, settings=vars(args))
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
