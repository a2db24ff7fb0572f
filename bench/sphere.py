"""Spheres (recipe ``sphere``): what rotations do to a planar ViT, absolute SH positions and the invariant bias.

Runs the recipe's default command with its table (``tokennet train sphere --set ablation=true``) in this
process: a planar
ViT on the lat/lon-sampled projected images, the sphere transformer with absolute spherical-harmonic
positions and the rotation-invariant one, each trained unrotated (NR) and under uniformly random
rotations (R) with the same steps, images and seed, and tested unrotated and rotated. Prints the table
(train/test: NR/NR, R/R, NR/R) and each model's NR/R − NR/NR gap (the goal: the invariant model within
2 points), and writes
``bench/results/sphere.json``. Anchor (MNIST, Cohen et al. 2018): planar CNN NR/R 11 %, spherical CNN
R/R 95 %, NR/R 94 %. Run it on an otherwise idle machine.

    python bench/sphere.py
    python bench/sphere.py --data fashion-mnist
    python bench/sphere.py --set max_iters=600
    python bench/sphere.py --from-run RUN_DIR     # tabulate a finished `tokennet train sphere` run instead
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/_record.py, also when a test loads this file
from _record import write  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--set", dest="sets", nargs="*", default=[], metavar="KEY=VALUE")
    p.add_argument("--data", default=None, help="digits (default), fashion-mnist or a Fashion-MNIST directory")
    p.add_argument("--from-run", default=None, help="read the table from this finished sphere run")
    p.add_argument("--out", default=None, help="JSON file (default bench/results/sphere.json)")
    args = p.parse_args()
    args.out = args.out or str(ROOT / "bench" / "results" / "sphere.json")
    from tokennet.recipes import get_recipe, parse_sets, train

    recipe = get_recipe("sphere")
    if args.from_run:
        run_dir = Path(args.from_run)
        metrics = json.loads((run_dir / "metrics.json").read_text())
        info = json.loads((run_dir / "run.json").read_text())
        s, data = info["settings"], info.get("data")
        # The whole run (ablation included): metrics.json is written last, run.json when training starts.
        wall = (run_dir / "metrics.json").stat().st_mtime - (run_dir / "run.json").stat().st_mtime
    else:
        data = args.data
        sets = {"progress": False, "ablation": True, **parse_sets(args.sets, recipe.defaults(data))}
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as d:
            _, metrics = train("sphere", data=data, out=Path(d) / "run", sets=sets, device="cpu")
        wall = time.perf_counter() - t0
        s = {**recipe.defaults(data), **sets}
    rows = metrics["ablation"]
    regimes = list(next(iter(rows.values())))
    print(f"\n| model | {' | '.join(regimes)} | NR/R − NR/NR |\n| --- |{' --- |' * (len(regimes) + 1)}")
    for name, row in rows.items():
        gap = 100 * (row["NR/R"] - row["NR/NR"])
        print(f"| {name} | {' | '.join(f'{100 * row[r]:.1f} %' for r in regimes)} | {gap:+.1f} points |")
    inv = rows.get("sphere, invariant angle bias")
    goal = inv is not None and inv["NR/NR"] - inv["NR/R"] <= 0.02
    print(f"\n{data or 'digits'}: {metrics.get('test_size')} test images; {s['max_iters']} steps × batch "
          f"{s['batch_size']} per model and regime; wall {wall:.0f} s (all models, projection included); "
          f"goal (invariant NR/R within 2 points of NR/NR): {'met' if goal else 'NOT met'}")
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?") \
        if Path("/proc/cpuinfo").exists() else platform.processor()
    result = {"ablation": rows, "goal_met": goal, "data": data or "digits", "test_size": metrics.get("test_size"),
              "settings": s, "wall_seconds": round(wall, 1), "from_run": args.from_run, "torch": torch.__version__,
              "threads": torch.get_num_threads(), "cpu": cpu, "python": sys.version.split()[0],
              "load_avg_1min_at_end": os.getloadavg()[0]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write(args.out, {**result, "args": vars(args)})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
