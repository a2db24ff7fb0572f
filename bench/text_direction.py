"""Forward against reversed text: ``tokennet train gpt-char`` on Tiny Shakespeare, read forwards and backwards.

The lecture (transcript): "The earlier words in the sentence are causally determining the next words, but there's
not quite the anti-causal direction. The statistics are different. It's not like a reversible sequence". Each row is
the recipe's own run in a process of its own, ``tokennet train gpt-char --set reverse=R``: with ``reverse=true`` the
model trains on the training part read backwards and is validated on the validation part read backwards — the same
characters as the forward run's, so the two validation losses (nats per character) compare directly.

Every run has the same step count (``--steps``) and a time budget far above what it needs, so the losses do not
depend on the machine's load (the seconds do); no sample is drawn, no evaluation happens before the last step.
Writes ``bench/results/text_direction.json``: each run's validation loss, per direction the median over the seeds,
and per seed the difference reversed − forward.

    OMP_NUM_THREADS=1 python bench/text_direction.py                     # 300 steps, seeds 0 1 2
    OMP_NUM_THREADS=1 python bench/text_direction.py --steps 600 --seeds 0
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/_record.py
import _record  # noqa: E402

RESULTS = _record.ROOT / "bench" / "results" / "text_direction.json"
DIRECTIONS = {"forward": "false", "reversed": "true"}


def train(direction: str, seed: int, steps: int, directory: str) -> dict:
    """One ``tokennet train gpt-char`` run in its own process; its validation loss and its wall seconds."""
    out = os.path.join(directory, f"{direction}-{seed}")
    argv = [sys.executable, "-m", "tokennet.cli", "-q", "train", "gpt-char", "--seed", str(seed), "--out", out,
            "--max-iters", str(steps), "--time-budget", "3600",
            "--set", f"reverse={DIRECTIONS[direction]}", "sample_tokens=0", f"eval_interval={steps}"]
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    metrics = json.loads(Path(out, "metrics.json").read_text())
    return {"direction": direction, "seed": seed, "steps": metrics["step"], "val_loss": metrics["val_loss"],
            "train_loss": metrics.get("train_loss"), "wall_s": round(time.perf_counter() - start, 1)}


def summarize(runs: list[dict]) -> dict:
    """Per direction the median validation loss; per seed reversed − forward, and its median."""
    out = {direction: {"median_val_loss": statistics.median(run["val_loss"] for run in runs
                                                            if run["direction"] == direction),
                       "val_losses": [run["val_loss"] for run in runs if run["direction"] == direction]}
           for direction in DIRECTIONS if any(run["direction"] == direction for run in runs)}
    by_seed = {}
    for run in runs:
        by_seed.setdefault(run["seed"], {})[run["direction"]] = run["val_loss"]
    gaps = {seed: pair["reversed"] - pair["forward"] for seed, pair in by_seed.items() if len(pair) == 2}
    if gaps:
        out["reversed_minus_forward"] = {"per_seed": gaps, "median": statistics.median(gaps.values())}
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory() as directory:
        for seed in args.seeds:
            for direction in DIRECTIONS:
                runs.append(train(direction, seed, args.steps, directory))
                print(json.dumps(runs[-1]), flush=True)
    summary = summarize(runs)
    for direction in DIRECTIONS:
        if direction in summary:
            print(f"{direction:9s} median val loss {summary[direction]['median_val_loss']:.4f}  "
                  f"seeds {summary[direction]['val_losses']}")
    if "reversed_minus_forward" in summary:
        print(f"reversed − forward: median {summary['reversed_minus_forward']['median']:+.4f}")
    return _record.write(args.out, {"runs": runs, **summary}, argv=argv,
                         settings={"recipe": "gpt-char", "data": "shakespeare", "steps": args.steps,
                                   "seeds": args.seeds, "set": "reverse=R sample_tokens=0 eval_interval=STEPS",
                                   "time_budget": 3600},
                         torch_threads=os.environ.get("OMP_NUM_THREADS"))


if __name__ == "__main__":
    main()
