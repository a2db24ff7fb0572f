"""The audio recipe's goal run, measured: an AST on spoken digits against the MFCC + SVM baseline.

Goal (issue 12): test accuracy on held-out voices ≥ 98% and above the baseline (computed in the same run on
the same split), within 5 minutes of training on 2 cores. The benchmark first synthesizes the data (or
finds it in the cache; that time is reported apart, it happens once per machine), then runs
``tokennet train audio`` with the recipe's defaults in a fresh process and reports accuracy, baseline,
per-voice accuracy, the trainer's clock ("train s") and the whole command ("wall s"). The load average
before and after is recorded: CPU PyTorch on 2 cores slows down several times when anything else runs,
so figures from a shared machine understate what the recipe does on an idle one.

Usage::

    python bench/audio.py                          # run in runs/bench-audio/, JSON to bench/results/audio.json
    python bench/audio.py --set time_budget=600    # extra --set passed to the run
    python bench/audio.py --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/_record.py, also when a test loads this file
from _record import write  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/bench-audio", help="the run directory")
    ap.add_argument("--set", dest="sets", nargs="+", default=[], help="extra settings for the run")
    ap.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS for the run (default: torch's)")
    ap.add_argument("--results", default="bench/results/audio.json")
    args = ap.parse_args()

    from tokennet.data.spoken_digits import synthesize_spoken_digits

    t0 = time.perf_counter()
    cache = synthesize_spoken_digits(seed=0)  # the recipe's defaults (seed 0, 3 per voice, 20 test voices)
    data_s = time.perf_counter() - t0

    cmd = [sys.executable, "-m", "tokennet", "-q", "train", "audio", "--out", args.out, "--overwrite",
           "--no-progress"]
    if args.sets:
        cmd += ["--set", *args.sets]
    env = dict(os.environ)
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    load_after = os.getloadavg()
    if proc.returncode != 0:
        sys.exit(f"the run failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    m = json.loads((Path(args.out) / "metrics.json").read_text())
    train_s = m.get("elapsed")
    met = m["test_accuracy"] >= 0.98 and m["test_accuracy"] > m["baseline_accuracy"] and train_s <= 300
    row = {"test_accuracy": m["test_accuracy"], "baseline_accuracy": m["baseline_accuracy"],
           "goal": "≥ 98% and > baseline, ≤ 300 s of training", "met": met, "train_s": train_s,
           "wall_s": round(wall, 1), "data_s": round(data_s, 1), "steps": m.get("step"), "epochs": m.get("epochs"),
           "parameters": m.get("num_parameters"), "train_size": m.get("train_size"), "test_size": m.get("test_size"),
           "accuracy_by_voice": m.get("accuracy_by_voice"),
           "baseline_accuracy_by_voice": m.get("baseline_accuracy_by_voice"),
           "load_before": [round(v, 2) for v in load_before], "load_after": [round(v, 2) for v in load_after],
           "threads": args.threads, "cache": str(cache), "command": " ".join(cmd[1:])}

    print("| test accuracy | MFCC + SVM | goal | met | train s | wall s | steps | epochs | load avg before → after |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print(f"| {row['test_accuracy']:.4f} | {row['baseline_accuracy']:.4f} | {row['goal']} | {'yes' if met else 'no'} "
          f"| {train_s} | {row['wall_s']} | {row['steps']} | {row['epochs']} | "
          f"{row['load_before'][0]} → {row['load_after'][0]} |")
    print("\n| held-out voice | AST | MFCC + SVM |\n| --- | --- | --- |")
    for v, acc in (row["accuracy_by_voice"] or {}).items():
        print(f"| {v} | {acc:.4f} | {row['baseline_accuracy_by_voice'].get(v, float('nan')):.4f} |")
    res = Path(args.results)
    res.parent.mkdir(parents=True, exist_ok=True)
    write(res, {"runs": [row]}, settings=vars(args))
    print(f"\nwrote {res}")


if __name__ == "__main__":
    main()
