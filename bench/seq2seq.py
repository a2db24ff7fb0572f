"""Date translation (recipe ``seq2seq``): the encoder–decoder Transformer next to the Bahdanau RNN baseline.

Trains both architectures back to back in one process with the recipe's defaults (the CLI's
``tokennet train seq2seq`` and ``tokennet train seq2seq --set arch=bahdanau``), evaluating on the
validation dates every ``--eval-interval`` steps, and reports per system: parameters, steps, seconds
from launch, the first step/second at which validation exact match reached the goal (99.5%), and the
held-out test exact match, BLEU and chrF (beam search) — plus the ratio of the two wall times.

Goal (issue #5): ≥ 99.5% exact match within 3 minutes on 2 cores. Run it on an otherwise idle
machine; 2-thread PyTorch slows down many times when other processes share the cores.

    python bench/seq2seq.py                      # both systems, recipe defaults
    python bench/seq2seq.py --archs transformer --eval-interval 100 --set max_iters=1500
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
GOAL = 99.5


def _env() -> dict:
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?") \
        if Path("/proc/cpuinfo").exists() else platform.processor()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpu": cpu,
            "python": sys.version.split()[0], "load_avg_1min_at_end": load}


def _parse_sets(items: list[str]) -> dict:
    out = {}
    for s in items:
        k, v = s.split("=", 1)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def run(recipe: str, sets: dict, label: str, metric: str = "val_exact_match", goal: float = GOAL) -> dict:
    """Train one recipe in a temporary directory; return its curve, wall time and final metrics."""
    from tokennet.recipes import train

    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        out, metrics = train(recipe, out=Path(d) / "run", sets={**sets, "progress": False}, device="cpu")
        wall = time.perf_counter() - t0
        log = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
        used = json.loads((out / "run.json").read_text())["settings"]  # every setting, defaults included
    setup = wall - metrics.get("wall", wall)  # building data/model and the final test evaluation
    curve = [{"step": r["step"], "seconds": round(r["wall"], 1), metric: round(r[metric], 2),
              "val_loss": round(r["val_loss"], 5)} for r in log if metric in r and "wall" in r]
    hit = next((c for c in curve if c[metric] >= goal), None)
    print(f"\n{label}: {metrics['step']} steps, test exact match {metrics['exact_match']:.2f}%, "
          f"wall {wall:.1f} s (of which training {metrics.get('wall', 0):.1f} s)")
    print(f"| step | seconds (training) | {metric} | val loss |\n| --- | --- | --- | --- |")
    for c in curve:
        print(f"| {c['step']} | {c['seconds']} | {c[metric]} | {c['val_loss']} |")
    keep = {k: v for k, v in metrics.items() if k not in ("errors",)}
    print(f"settings: max_iters={used['max_iters']} batch_size={used['batch_size']} lr={used['lr']} "
          f"dim={used['dim']} num_layers={used['num_layers']}")
    return {"label": label, "settings": used, "wall_seconds": round(wall, 2), "setup_and_test_seconds": round(setup, 2),
            "curve": curve, "first_at_goal": hit, "metrics": keep, "errors": metrics.get("errors", [])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--archs", nargs="+", default=["transformer", "bahdanau"], choices=["transformer", "bahdanau"])
    p.add_argument("--eval-interval", type=int, default=None,
                   help="validation every N steps, for a finer curve (default: the recipe's; evaluation takes time)")
    p.add_argument("--set", dest="sets", nargs="*", default=[], help="recipe settings, key=value")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = p.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # progress shows when the output goes to a file
    extra = _parse_sets(args.sets)
    results = []
    for arch in args.archs:
        every = {} if args.eval_interval is None else {"eval_interval": args.eval_interval}
        results.append(run("seq2seq", {"arch": arch, **every, **extra}, arch))
    print("\n| system | params | steps | wall s (launch → metrics) | first step ≥ 99.5% val (s) | test exact match % "
          "| BLEU | chrF |\n| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        m, h = r["metrics"], r["first_at_goal"]
        at = f"{h['step']} ({h['seconds']} s)" if h else "not reached"
        print(f"| {r['label']} | {m['num_parameters']:,} | {m['step']} | {r['wall_seconds']} | {at} | "
              f"{m['exact_match']:.2f} | {m['bleu']:.2f} | {m['chrf']:.2f} |")
    if len(results) == 2:
        print(f"\nwall-time ratio {results[0]['label']} / {results[1]['label']}: "
              f"{results[0]['wall_seconds'] / results[1]['wall_seconds']:.2f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "seq2seq.json"
    write(path, {"results": results, "env": _env()}, settings=vars(args))
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
