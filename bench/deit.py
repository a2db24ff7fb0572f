"""DeiT's ablation on a dataset of the vit recipe: ViT alone, + DeiT's augmentation, + distillation from a teacher.

Every row is ``tokennet train vit --data DATA --max-iters STEPS`` with the dataset's profile, in a fresh process,
at the same number of steps (accuracy at a fixed step count does not depend on the machine's load); the rows
differ only in what the table names:

- **ViT**: the profile as it is;
- **+ augmentation**: DeiT's — RandAugment (n = 2, m = 9), mixup 0.8 / cutmix 1.0 (one per batch), random
  erasing 0.25, repeated augmentation ×3, stochastic depth 0.1 (``--aug`` replaces them);
- **+ distillation**: the augmentation, and ``teacher=RUN_DIR``: the distillation token learns the teacher's
  hard labels;
- **distillation alone**: the profile's own augmentation and ``teacher=RUN_DIR`` (what the token adds without
  DeiT's heavy augmentation, which a short schedule may not pay for).

``--rows`` runs some of them; rows measured before at the same data and steps stay in the results file.

The teacher is ``--teacher RUN_DIR`` (any image classifier run on the same data: a CNN, a Swin, a longer ViT),
or, without it, a run this script trains first with ``--teacher-set`` (default: Swin, ``--teacher-steps``).

Usage::

    python bench/deit.py --data fashion-mnist --steps 4000 --teacher runs/swin-fashion
    python bench/deit.py --data mnist1d --steps 3000          # trains its own teacher first

Writes ``bench/results/deit-DATA.json`` and prints the table.
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

DEIT_AUG = ["randaugment=2", "magnitude=9", "mixup=0.8", "cutmix=1.0", "erase=0.25", "repeats=3", "drop_path=0.1"]
ROWS = ("ViT", "+ augmentation", "+ distillation", "distillation alone")
TEACHER = ["arch=swin", "patch_size=2", "dim=32", "num_heads=2", "depths=2,2,2", "window_size=7"]


def train(data: str, out: Path, steps: int, sets: list[str], threads: int | None) -> dict:
    cmd = [sys.executable, "-m", "tokennet", "-q", "train", "vit", "--data", data, "--out", str(out), "--overwrite",
           "--no-progress", "--max-iters", str(steps), "--set", "time_budget=none", "report=false",
           "svm_baseline=false", *sets]
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr.strip()}")
    m = json.loads((out / "metrics.json").read_text())
    return {"test_accuracy": m["test_accuracy"], "steps": m["step"], "epochs": m.get("epochs"),
            "wall_s": round(time.perf_counter() - t0, 1), "teacher_test_accuracy": m.get("teacher_test_accuracy"),
            "command": " ".join(["tokennet", *cmd[3:]])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="fashion-mnist")
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--teacher", default=None, help="a trained image classifier run (default: train one)")
    ap.add_argument("--teacher-set", nargs="+", default=TEACHER)
    ap.add_argument("--teacher-steps", type=int, default=None, help="default: --steps")
    ap.add_argument("--aug", nargs="+", default=DEIT_AUG, help="the augmentation row's settings")
    ap.add_argument("--set", dest="sets", nargs="+", default=[], help="settings added to every row")
    ap.add_argument("--out", default="runs/bench-deit")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    args = ap.parse_args()
    out = Path(args.out) / args.data.replace("/", "_")
    rows = {}
    teacher = args.teacher
    if teacher is None:
        teacher = str(out / "teacher")
        print("training the teacher ...", file=sys.stderr, flush=True)
        rows["teacher"] = train(args.data, Path(teacher), args.teacher_steps or args.steps, args.teacher_set,
                                args.threads)
    plan = {"ViT": args.sets, "+ augmentation": [*args.sets, *args.aug],
            "+ distillation": [*args.sets, *args.aug, f"teacher={teacher}"],
            "distillation alone": [*args.sets, f"teacher={teacher}"]}
    res = Path(__file__).parent / "results" / f"deit-{args.data.replace('/', '_')}.json"
    if res.exists():  # rows measured before on the same data, steps and teacher stay in the table
        old = json.loads(res.read_text())
        if (old.get("steps"), old.get("teacher")) == (args.steps, teacher):
            rows = {**old["rows"], **rows}
    for name, sets in plan.items():
        if name not in args.rows:
            continue
        print(f"{name} ...", file=sys.stderr, flush=True)
        rows[name] = train(args.data, out / name.strip("+ ").replace(" ", "-"), args.steps, sets, args.threads)
        rows[name]["load_average"] = os.getloadavg()
        print(json.dumps(rows[name]), file=sys.stderr, flush=True)
    print(f"\n{args.data}, {args.steps} steps each (teacher: {teacher})\n")
    print("| row | test accuracy | epochs | wall s (shared machine?) |")
    print("| --- | --- | --- | --- |")
    for name, r in rows.items():
        print(f"| {name} | {r['test_accuracy']:.4f} | {r['epochs']} | {r['wall_s']} |")
    res.parent.mkdir(parents=True, exist_ok=True)
    write(res, {"data": args.data, "steps": args.steps, "teacher": teacher, "load_average": os.getloadavg(),
                "rows": rows}, settings=vars(args), indent=1)
    print(f"\nwrote {res}")


if __name__ == "__main__":
    main()
