"""DeiT's ablation on a dataset of the vit recipe: ViT alone, + DeiT's augmentation, + distillation from a teacher —
at one data size or across several (DeiT is "data-efficient": the question is how the rows move as data shrinks).

Every row is ``tokennet train vit --data DATA --max-iters STEPS`` with the dataset's profile, in a fresh process,
at the same number of steps (accuracy at a fixed step count does not depend on the machine's load); the rows
differ only in what the table names:

- **ViT**: the profile as it is; the same run also trains the ``cnn`` recipe's CNN for the same steps, batch,
  learning rate and augmentation (``cnn_baseline=true``), reported as the **CNN, same budget** row;
- **+ augmentation**: DeiT's — RandAugment (n = 2, m = 9), mixup 0.8 / cutmix 1.0 (one per batch), random
  erasing 0.25, repeated augmentation ×3, stochastic depth 0.1 (``--aug`` replaces them);
- **+ distillation**: the augmentation, and ``teacher=RUN_DIR``: the distillation token learns the teacher's
  hard labels;
- **distillation alone**: the profile's own augmentation and ``teacher=RUN_DIR`` (what the token adds without
  DeiT's heavy augmentation, which a short schedule may not pay for).

``--sizes N ...`` repeats the table on the first N training images of one fixed shuffle (the recipes'
``train_size``; 0 = all): the teacher, trained on the same N images, is a run of ``--teacher-recipe`` (``cnn``:
DeiT's best teacher was a convnet; ``vit`` with ``--teacher-set``, by default a Swin) for ``--teacher-steps``.
``--teacher RUN_DIR`` gives one teacher instead (one size only). ``--jobs J`` trains J sizes at once, each
process on ``--threads`` threads. ``--rows`` runs some of the rows; rows measured before at the same data, steps
and size stay in the results file.

The file's ``claim`` (read by ``tokennet demo claims``, claim ``deit-data-efficient``) judges the lecture's "effective
with data-efficient training strategies": it holds when, at the smallest size measured, DeiT (augmentation and
distillation) beats the plain ViT on every seed by ≥ 2 points in the median. ``--rejudge`` judges the results file
again without training (after the rule changed).

Usage::

    python bench/deit.py --data fashion-mnist --steps 4000 --teacher runs/swin-fashion
    python bench/deit.py --data digits --sizes 100 200 400 0 --teacher-recipe cnn --threads 1 --jobs 2
    python bench/deit.py --data digits --rejudge

Writes ``bench/results/deit-DATA.json`` (``--results`` elsewhere) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/_record.py, also when a test loads this file
from _record import commit, write  # noqa: E402

from tokennet.fileio import atomic_write_text  # noqa: E402

DEIT_AUG = ["randaugment=2", "magnitude=9", "mixup=0.8", "cutmix=1.0", "erase=0.25", "repeats=3", "drop_path=0.1"]
ROWS = ("ViT", "+ augmentation", "+ distillation", "distillation alone")
MIN_GAIN = 0.02  # the claim's median gain of DeiT over the plain ViT at the smallest size
TEACHER = ["arch=swin", "patch_size=2", "dim=32", "num_heads=2", "depths=2,2,2", "window_size=7"]


def train(data: str, out: Path, steps: int, sets: list[str], threads: int | None, recipe: str = "vit") -> dict:
    """One ``tokennet train RECIPE`` process at a fixed step count; its metrics, wall time and command."""
    extra = ["svm_baseline=false"] if recipe == "vit" else []
    cmd = [sys.executable, "-m", "tokennet", "-q", "train", recipe, "--data", data, "--out", str(out), "--overwrite",
           "--no-progress", "--max-iters", str(steps), "--set", "time_budget=none", "report=false", *extra, *sets]
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{p.stderr.strip()}")
    m = json.loads((out / "metrics.json").read_text())
    return {"test_accuracy": m["test_accuracy"], "steps": m["step"], "epochs": m.get("epochs"),
            "train_size": m.get("train_size"), "wall_s": round(time.perf_counter() - t0, 1),
            "teacher_test_accuracy": m.get("teacher_test_accuracy"),
            "baseline_cnn_accuracy": m.get("baseline_cnn_accuracy"), "load_average": os.getloadavg(),
            "command": " ".join(["tokennet", *cmd[3:]])}


def one_size(args, size: int, seed: int) -> dict:
    """The table's rows at one training-set size (0 = all) and seed: the teacher first where none is given, then the
    rows, every run with ``--seed seed`` (its initialisation, batch order and augmentation; the subset is the same)."""
    out = Path(args.out) / args.data.replace("/", "_") / f"n{size or 'all'}-seed{seed}"
    sized = [*args.sets, f"train_size={size}", f"seed={seed}"]
    rows, teacher = {}, args.teacher
    if teacher is None and any("distillation" in name for name in args.rows):
        teacher = str(out / "teacher")
        print(f"[n={size or 'all'}] training the teacher ({args.teacher_recipe}) ...", file=sys.stderr, flush=True)
        rows["teacher"] = train(args.data, Path(teacher), args.teacher_steps or args.steps,
                                [*args.teacher_set, *sized], args.threads, recipe=args.teacher_recipe)
    plan = {"ViT": [*sized, "cnn_baseline=true"], "+ augmentation": [*sized, *args.aug],
            "+ distillation": [*sized, *args.aug, f"teacher={teacher}"],
            "distillation alone": [*sized, f"teacher={teacher}"]}
    for name in args.rows:
        print(f"[n={size or 'all'}] {name} ...", file=sys.stderr, flush=True)
        rows[name] = train(args.data, out / name.strip("+ ").replace(" ", "-"), args.steps, plan[name], args.threads)
        print(json.dumps(rows[name]), file=sys.stderr, flush=True)
    if "ViT" in rows and rows["ViT"]["baseline_cnn_accuracy"] is not None:
        rows["CNN, same budget"] = {**rows["ViT"], "test_accuracy": rows["ViT"]["baseline_cnn_accuracy"]}
    return {"train_size": size, "seed": seed, "teacher": teacher, "rows": rows}


def medians(results: list[dict]) -> dict[str, dict[str, dict]]:
    """Per training-set size (the images trained on) and row: the median test accuracy over the seeds, and each
    seed's."""
    out: dict[str, dict[str, dict]] = {}
    for r in sorted(results, key=lambda r: (r["train_size"] or float("inf"), r.get("seed", 0))):
        images = str(next(iter(r["rows"].values()))["train_size"])
        for name, row in r["rows"].items():
            cell = out.setdefault(images, {}).setdefault(name, {"per_seed": {}})
            cell["per_seed"][str(r.get("seed", 0))] = row["test_accuracy"]
            cell["median"] = statistics.median(cell["per_seed"].values())
    return out


def table(summary: dict[str, dict[str, dict]], data: str, steps: int) -> str:
    """The printed table: one row per model, one column per training-set size, the median over the seeds."""
    sizes = list(summary)
    names = list(dict.fromkeys(name for rows in summary.values() for name in rows))
    seeds = max(len(cell["per_seed"]) for rows in summary.values() for cell in rows.values())
    lines = [f"{data}, {steps} steps each; test accuracy by training images (median of {seeds} seeds)", "",
             "| row | " + " | ".join(sizes) + " |", "| --- |" + " --- |" * len(sizes)]
    for name in names:
        cells = [f"{summary[n][name]['median']:.4f}" if name in summary[n] else "" for n in sizes]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def claim(summary: dict[str, dict[str, dict]]) -> dict:
    """The lecture's "effective with data-efficient training strategies of DeiT", judged at the smallest size in
    ``summary``: holds when DeiT (augmentation and distillation) beats the plain ViT on every seed and by
    ≥ ``MIN_GAIN`` in the median; ``None`` when either row is missing there."""
    smallest = min(summary, key=int)
    rows = summary[smallest]
    if "ViT" not in rows or "+ distillation" not in rows:
        return {"holds": None, "measured": f"no ViT and DeiT pair at {smallest} images",
                "run": "python bench/deit.py --sizes ... (ViT and + distillation rows)"}
    vit, deit = rows["ViT"], rows["+ distillation"]
    seeds = sorted(set(vit["per_seed"]) & set(deit["per_seed"]), key=int)
    wins = sum(deit["per_seed"][s] > vit["per_seed"][s] for s in seeds)
    gain = deit["median"] - vit["median"]
    largest = max(summary, key=int)
    at_largest = summary[largest]
    measured = (f"{smallest} images: DeiT {deit['median']:.1%} against the plain ViT's {vit['median']:.1%} "
                f"({gain * 100:+.1f} points; higher on {wins} of {len(seeds)} seeds)")
    if largest != smallest and {"ViT", "+ distillation"} <= set(at_largest):
        measured += (f"; {largest} images: {at_largest['+ distillation']['median']:.1%} against "
                     f"{at_largest['ViT']['median']:.1%}")
    if "CNN, same budget" in rows:
        measured += f"; the CNN of the same budget {rows['CNN, same budget']['median']:.1%} at {smallest}"
    run = (f"ViT and DeiT (DeiT's augmentation, distillation from a teacher trained on the same images) on the first "
           f"N training images, N = {', '.join(sorted(summary, key=int))}; medians of {len(seeds)} seeds; holds when "
           f"DeiT beats the ViT on every seed and by ≥ {MIN_GAIN * 100:.0f} points at the smallest N")
    return {"holds": bool(seeds) and wins == len(seeds) and gain >= MIN_GAIN, "measured": measured, "run": run}


def rejudge(res: Path) -> dict:
    """Recompute the medians and the claim of the results file ``res`` from its results, without training; the
    measurement's command, commit and date stay, ``judged`` says when and at which commit."""
    record = json.loads(res.read_text())
    record["medians"] = medians(record["results"])
    record["claim"] = claim(record["medians"])
    record["judged"] = {"commit": commit(), "date": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())}
    atomic_write_text(res, json.dumps(record, indent=1) + "\n")
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="fashion-mnist")
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--sizes", type=int, nargs="+", default=[0],
                    help="training-set sizes, each the first N of one fixed shuffle (0 = all; default: 0)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="every row's --seed (default: 0)")
    ap.add_argument("--teacher", default=None, help="a trained image classifier run (default: train one per size)")
    ap.add_argument("--teacher-recipe", choices=("vit", "cnn"), default="vit",
                    help="the recipe that trains the teacher (vit: with --teacher-set, by default a Swin)")
    ap.add_argument("--teacher-set", nargs="+", default=None,
                    help=f"the teacher's settings (default with vit: {' '.join(TEACHER)}; with cnn: none)")
    ap.add_argument("--teacher-steps", type=int, default=None, help="default: --steps")
    ap.add_argument("--aug", nargs="+", default=DEIT_AUG, help="the augmentation row's settings")
    ap.add_argument("--set", dest="sets", nargs="+", default=[], help="settings added to every row")
    ap.add_argument("--out", default="runs/bench-deit", help="where the runs go")
    ap.add_argument("--results", default=None, help="the results file (default: bench/results/deit-DATA.json)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--jobs", type=int, default=1, help="(size, seed) pairs trained at once")
    ap.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    ap.add_argument("--rejudge", action="store_true",
                    help="recompute the results file's medians and claim without training, and exit")
    args = ap.parse_args(argv)
    res = Path(args.results or Path(__file__).parent / "results" / f"deit-{args.data.replace('/', '_')}.json")
    if args.rejudge:
        if not res.is_file():
            ap.error(f"--rejudge: no results file {res}")
        record = rejudge(res)
        print(table(record["medians"], record["data"], record["steps"]))
        verdict = {True: "holds", False: "does not hold", None: "not decided"}[record["claim"]["holds"]]
        print(f"\nclaim: {verdict}: {record['claim']['measured']}")
        return 0
    if args.teacher is not None and len(args.sizes) > 1:
        ap.error("--teacher gives one teacher for one size: a teacher must learn from the student's images")
    if any(n < 0 for n in args.sizes) or args.jobs < 1:
        ap.error("--sizes must be ≥ 0 (0 = all) and --jobs ≥ 1")
    if args.teacher_set is None:
        args.teacher_set = TEACHER if args.teacher_recipe == "vit" else []
    jobs = [(n, seed) for seed in args.seeds for n in args.sizes]
    with ThreadPoolExecutor(args.jobs) as pool:  # each job is its own processes; threads only wait on them
        results = list(pool.map(lambda job: one_size(args, *job), jobs))
    if res.exists():  # what was measured before on the same data and steps stays, unless measured again
        old = json.loads(res.read_text())
        if old.get("steps") == args.steps:
            key = {(r["train_size"], r.get("seed", 0)): r for r in results}
            for r in old.get("results", []):
                now = key.get((r["train_size"], r.get("seed", 0)))
                if now is None:
                    results.append({"seed": 0, **r})  # files written before --seeds: the recipe's default seed
                elif now["teacher"] == r["teacher"]:
                    now["rows"] = {**r["rows"], **now["rows"]}
    summary = medians(results)
    print("\n" + table(summary, args.data, args.steps))
    write(res, {"data": args.data, "steps": args.steps, "medians": summary, "claim": claim(summary),
                "results": results}, settings=vars(args), indent=1)
    print(f"\nwrote {res}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
