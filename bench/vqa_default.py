"""The default ``tokennet train vqa`` run (the transformer and both CNN baselines), per seed and the median over
seeds: exact match per template, held-out counts, attention against the other animals, the sink, and each run's
wall time (process start to exit, as a user waits for it).

    python bench/vqa_default.py --seeds 0 1 2                     # one run after another, each on all cores
    python bench/vqa_default.py --seeds 1 2 --parallel 2          # two at once, one thread each (times not idle)
    python bench/vqa_default.py --seeds 0 1 2 --collect           # only read runs already in --runs-dir
    python bench/vqa_default.py --seeds 0 --set transformer=generic --out bench/results/vqa_default_generic.json

Each run is ``tokennet train vqa --seed S --out RUNS_DIR/seedS`` (the recipe's defaults otherwise; ``--set`` passes
settings on, e.g. the lecture's generic transformer), so its report
and ``tokennet eval`` are there to look at. Prints a markdown table and writes ``bench/results/vqa_default.json``
(the command, the commit, the machine; each run's own wall time, threads and load average, since runs measured
at different times can be collected into one file).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import commit, machine  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ("count", "count_colour", "same_species", "species", "colour", "unseen_count")
MODELS = (("", "transformer"), ("cnn_", "cnn_"), ("shallow_cnn_", "shallow_cnn_"))  # the CNNs' fields: from the runs
FIELDS = ("cnn_receptive_field", "shallow_cnn_receptive_field", "cnn_readout")
EXTRA = ("attention_vs_other_animals", "attention_vs_other_animals_layer0", "attention_vs_other_animals_layer1",
         "attention_vs_other_animals_layer2", "attention_mass_ratio",
         "attention_image_share", "sink_vs_inverse_count_r", "sink_weight_k0", "sink_weight_k9",
         "head_distance_min", "head_distance_max", "head_grouping_max", "patch_grouping_ratio_layer0",
         "patch_grouping_ratio_layer1", "patch_grouping_ratio_layer2", "patch_grouping_ratio")
RUN_INFO = "bench_run.json"  # beside a run's metrics.json: how this script ran it


def run_seed(seed: int, runs_dir: Path, threads: int | None, sets: list[str]) -> dict:
    out = runs_dir / f"seed{seed}"
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    cmd = [sys.executable, "-m", "tokennet.cli", "train", "vqa", "--seed", str(seed), "--out", str(out),
           "--overwrite", "--set", "progress=false", *sets]  # a seed measured again replaces its earlier run
    load = list(os.getloadavg())
    t = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    info = {"command": " ".join(["tokennet", *cmd[3:]]), "wall_seconds": round(time.perf_counter() - t, 1),
            "threads": threads or int(env.get("OMP_NUM_THREADS") or 0) or "all", "load_before": load,
            "load_after": list(os.getloadavg()),
            "commit": commit(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    (out / RUN_INFO).write_text(json.dumps(info, indent=2) + "\n")
    return info


def collect(seed: int, runs_dir: Path) -> dict:
    d = runs_dir / f"seed{seed}"
    metrics = json.loads((d / "metrics.json").read_text())
    info = json.loads((d / RUN_INFO).read_text()) if (d / RUN_INFO).is_file() else {}
    keys = [f"{p}exact_match" for p, _ in MODELS] + [f"{p}exact_match_{t}" for p, _ in MODELS for t in TEMPLATES]
    return {"seed": seed, "run": str(d), **info, "metrics": {k: metrics.get(k) for k in [*keys, *EXTRA, *FIELDS,
                                                                                         "cnn_precision",
                                                                                         "cnn_parallel"]}}


def median(rows: list[dict], key: str):
    vals = [r["metrics"][key] for r in rows if isinstance(r["metrics"].get(key), (int, float))]
    return round(statistics.median(vals), 3) if vals else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--runs-dir", default="/tmp/tokennet-vqa-default", help="where the runs go (seedS each)")
    ap.add_argument("--parallel", type=int, default=1, help="runs at once (each with --threads, default 1 then)")
    ap.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS per run (default: all cores)")
    ap.add_argument("--collect", action="store_true", help="read the runs already in --runs-dir, train nothing")
    ap.add_argument("--set", dest="sets", nargs="+", default=[], metavar="KEY=VALUE",
                    help="settings passed to every run's tokennet train (default: the recipe's)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "vqa_default.json"))
    ap.add_argument("--note", default=None, help="how the runs were made, written into the JSON (e.g. for --collect)")
    args = ap.parse_args(argv)
    if args.parallel < 1:
        print("error: --parallel must be >= 1", file=sys.stderr)
        return 2
    runs_dir = Path(args.runs_dir)
    runs_dir.mkdir(parents=True, exist_ok=True)
    if not args.collect:
        threads = args.threads or (1 if args.parallel > 1 else None)
        with ThreadPoolExecutor(args.parallel) as ex:
            list(ex.map(lambda s: run_seed(s, runs_dir, threads, args.sets), args.seeds))
    missing = [s for s in args.seeds if not (runs_dir / f"seed{s}" / "metrics.json").is_file()]
    if missing:
        print(f"error: no finished run for seeds {missing} in {runs_dir}", file=sys.stderr)
        return 2
    rows = [collect(s, runs_dir) for s in args.seeds]
    med = {k: median(rows, k) for k in rows[0]["metrics"] if k not in ("cnn_precision", "cnn_parallel", "cnn_readout")}
    print(f"\nvqa default run, seeds {args.seeds}: exact match % (median over seeds; per seed in the JSON)\n")
    print("| model | all | " + " | ".join(TEMPLATES) + " |")
    print("| --- | ---: | " + " | ".join("---:" for _ in TEMPLATES) + " |")
    for p, name in MODELS:
        field = med.get(f"{p}receptive_field")
        name += f" ({field} px)" if field else ""
        print(f"| {name} | {med[f'{p}exact_match']} | " + " | ".join(str(med[f"{p}exact_match_{t}"]) for t in TEMPLATES)
              + " |")
    print("\n" + ", ".join(f"{k} {med[k]}" for k in EXTRA))
    print("wall seconds per run: " + ", ".join(f"seed {r['seed']}: {r.get('wall_seconds')} ({r.get('threads')} "
                                               f"threads)" for r in rows))
    result = {"benchmark": "vqa_default", "command": "python " + " ".join([sys.argv[0], *sys.argv[1:]]),
              "commit": commit(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "seeds": args.seeds, "sets": args.sets, **({"note": args.note} if args.note else {}), "median": med,
              "runs": rows,
              "machine": machine(cpus_used=os.cpu_count())}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
