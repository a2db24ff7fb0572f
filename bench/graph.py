"""Graphs (recipe ``graph``): what each way of giving attention the structure buys, measured.

Runs the recipe's default command with its table (``tokennet train graph --set ablation=true``) in this
process: every structural variant — no positions (a set model), Laplacian positions, random-walk positions, an
adjacency mask, a shortest-path distance bias — trained with the same steps, batches and seed on the generated task
"how far apart are the two marked nodes?", and reports the held-out test accuracy of each next to the
majority-class rate, plus the wall time. Writes ``bench/results/graph.json``. Run it on an otherwise idle machine.

With ``--qm9`` it runs the QM9 profile instead (``tokennet train graph --data qm9``: HOMO–LUMO gap,
20 minutes of training on 2 cores) and reports the validation MAE against training time, the test MAE
and the in-run baselines (mean predictor, linear model on atom-type counts); ``bench/results/graph-qm9.json``.
Published anchors (full training on GPUs for days): SchNet 63 meV, PaiNN 46 meV, DimeNet++ 33 meV.

    python bench/graph.py
    python bench/graph.py --set max_iters=2000 lr=2e-3
    python bench/graph.py --qm9 [--set attention=full]     # 2-D bond graph only, no 3-D distances
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/_record.py, also when a test loads this file
from _record import write  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--set", dest="sets", nargs="*", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", default=None, help="JSON file (default bench/results/graph[-qm9].json)")
    p.add_argument("--qm9", action="store_true", help="the QM9 molecule profile instead of the generated task")
    args = p.parse_args()
    name = "graph-qm9.json" if args.qm9 else "graph.json"
    args.out = args.out or str(ROOT / "bench" / "results" / name)
    if args.qm9:
        return qm9(args)
    from tokennet.data.graphs import marked_distance_set
    from tokennet.recipes import get_recipe, parse_sets, train

    recipe = get_recipe("graph")
    sets = {"progress": False, "ablation": True, **parse_sets(args.sets, recipe.defaults())}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        _, metrics = train("graph", out=Path(d) / "run", sets=sets, device="cpu")
    wall = time.perf_counter() - t0
    s = {**recipe.defaults(), **sets}
    _, labels = marked_distance_set(s["test_size"], f"test-{s['seed']}", pe_dim=s["pe_dim"],
                                    max_distance=s["num_outputs"], graph_max_distance=s["max_distance"])
    majority = max(Counter(labels.tolist()).values()) / len(labels)
    rows = metrics["ablation"]
    print("\n| variant | test accuracy |\n| --- | --- |")
    for name, acc in rows.items():
        print(f"| {name} | {100 * acc:.1f} % |")
    print(f"| (majority class) | {100 * majority:.1f} % |")
    print(f"\n{s['max_iters']} steps × batch {s['batch_size']} per variant, {len(rows)} variants, wall {wall:.0f} s "
          f"(all variants, data generation included)")
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?") \
        if Path("/proc/cpuinfo").exists() else platform.processor()
    result = {"ablation": rows, "majority_class": majority, "test_size": len(labels), "settings": s,
              "wall_seconds": round(wall, 1), "torch": torch.__version__, "threads": torch.get_num_threads(),
              "cpu": cpu, "python": sys.version.split()[0], "load_avg_1min_at_end": os.getloadavg()[0]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write(args.out, {**result, "args": vars(args)})
    print(f"wrote {args.out}")


def qm9(args) -> None:
    from tokennet.recipes import get_recipe, parse_sets, train

    recipe = get_recipe("graph")
    sets = {"progress": False, **parse_sets(args.sets, recipe.defaults("qm9"))}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        run_dir, metrics = train("graph", data="qm9", out=Path(d) / "run", sets=sets, device="cpu")
        curve = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    wall = time.perf_counter() - t0
    curve = [{"step": r["step"], "train_s": r["elapsed"], "val_mae": r["val_mae"]} for r in curve if "val_mae" in r]
    print("\n| step | training s | validation MAE |\n| --- | --- | --- |")
    for r in curve:
        print(f"| {r['step']} | {r['train_s']:.0f} | {r['val_mae']:.4f} |")
    print(f"\ntest MAE {metrics['test_mae']:.4f} ({metrics['target']}); baselines: mean "
          f"{metrics['baseline_mean_mae']:.4f}, linear on atom counts {metrics['baseline_linear_counts_mae']:.4f}; "
          f"wall {wall:.0f} s")
    result = {"metrics": metrics, "curve": curve, "wall_seconds": round(wall, 1), "settings": sets,
              "torch": torch.__version__, "threads": torch.get_num_threads(),
              "load_avg_1min_at_end": os.getloadavg()[0]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write(args.out, {**result, "args": vars(args)})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
