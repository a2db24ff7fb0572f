"""Does ``--time-budget`` hold through the command a user types? Whole processes of ``tokennet train RECIPE
--time-budget B``, timed from process start to exit: the first with an empty cache (``TOKENNET_CACHE`` a new
folder: the first run of a setting on a machine, whose reserve for what follows training is estimated before
training), then ``--runs - 1`` more with what the earlier runs left there (their measured timings).

    python bench/time_budget.py vqa --budget 300 --set patch_size=8
    python bench/time_budget.py gpt-char --budget 60 --runs 2

Prints a table (each run's wall against the budget, the steps it trained and the reserve it said it kept) and
writes ``bench/results/time-budget-RECIPE.json`` (the command, the commit, the machine).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import write  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESERVE_LINE = re.compile(r"time budget \d+ s: .*")


def run_once(recipe: str, budget: float, sets: list[str], cache: Path, out: Path, seed: int) -> dict:
    """One ``tokennet train`` process with the cache ``cache``: its wall, what its metrics say, its reserve line."""
    env = {**os.environ, "TOKENNET_CACHE": str(cache)}
    cmd = [sys.executable, "-m", "tokennet.cli", "train", recipe, "--seed", str(seed), "--time-budget", f"{budget:g}",
           "--out", str(out), "--overwrite", "--no-progress", *(["--set", *sets] if sets else [])]
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd[3:])} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    reserve = RESERVE_LINE.search(done.stderr)
    return {"command": " ".join(["tokennet", *cmd[3:]]), "wall_s": round(wall, 1),
            "wall_over_budget": round(wall / budget, 3), "wall_seconds": metrics.get("wall_seconds"),
            "steps": metrics.get("step"), "stopped_training_at_s": metrics.get("run_seconds"),
            "reserve_line": reserve.group(0) if reserve else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe")
    ap.add_argument("--budget", type=float, required=True, help="--time-budget of every run, seconds")
    ap.add_argument("--runs", type=int, default=2, help="runs in all: the first on an empty cache (default 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", dest="sets", nargs="+", default=[], metavar="KEY=VALUE", help="settings of every run")
    ap.add_argument("--out", default=None, help="default bench/results/time-budget-RECIPE.json")
    args = ap.parse_args(argv)
    if args.runs < 1 or args.budget <= 0:
        print("error: --runs must be >= 1 and --budget > 0", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="tokennet-budget-") as scratch:
        cache, out = Path(scratch) / "cache", Path(scratch) / "run"
        for i in range(args.runs):
            row = {"run": i + 1, "cache": "empty" if i == 0 else "what the earlier runs left",
                   "load_before": list(os.getloadavg())}
            row.update(run_once(args.recipe, args.budget, args.sets, cache, out, args.seed))
            rows.append(row)
    print(f"\ntokennet train {args.recipe} --time-budget {args.budget:g} {' '.join(args.sets)}: whole processes\n")
    print("| run | cache | wall s | wall / budget | steps | training stopped at s |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['run']} | {r['cache']} | {r['wall_s']} | {r['wall_over_budget']} | {r['steps']} | "
              f"{r['stopped_training_at_s']} |")
    for r in rows:
        print(f"run {r['run']}: {r['reserve_line']}")
    path = Path(args.out or ROOT / "bench" / "results" / f"time-budget-{args.recipe}.json")
    write(path, {"benchmark": "time_budget", "recipe": args.recipe, "budget_s": args.budget, "sets": args.sets,
                 "runs": rows}, argv=argv, script="time_budget.py", cpus_used=os.cpu_count())
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
