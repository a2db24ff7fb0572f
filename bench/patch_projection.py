"""The lecture's W_tokenize, learned against hard-coded: ``tokennet train vit`` (digits) with each patch projection.

The lecture (transcript): "you could use some matrix that you multiply the pixel values by W tokenize to get a D
dimensional vector. And that could be a learned matrix, or it could be somehow hard-coded." Each row is the digits
recipe's own run, ``tokennet train vit --set patch_projection=P``, in a process of its own:

- ``learned``: the patch matrix is trained (the default);
- ``random``: a Gaussian matrix, variance 1/(C·p²), drawn from the run's seed and never trained;
- ``dct``: the patch's 2-D DCT basis (16 frequencies of the 4×4 patch, zero-padded to D = 64), never trained.

Every run has the same step count (``--steps``) and a time budget far above what it needs, so the accuracy does not
depend on the machine's load (the seconds do); the SVM baseline is off (it is the same for every row). Writes
``bench/results/patch_projection.json``: each run's test accuracy and loss, and per projection the median over the
seeds.

    OMP_NUM_THREADS=1 python bench/patch_projection.py                       # 1,000 steps, seeds 0 1 2
    OMP_NUM_THREADS=1 python bench/patch_projection.py --steps 2500 --seeds 0
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

RESULTS = _record.ROOT / "bench" / "results" / "patch_projection.json"
PROJECTIONS = ("learned", "random", "dct")


def train(projection: str, seed: int, steps: int, directory: str) -> dict:
    """One ``tokennet train vit`` run in its own process; its metrics.json and its wall seconds."""
    out = os.path.join(directory, f"{projection}-{seed}")
    argv = [sys.executable, "-m", "tokennet.cli", "-q", "train", "vit", "--seed", str(seed), "--out", out,
            "--max-iters", str(steps), "--time-budget", "3600",
            "--set", f"patch_projection={projection}", "svm_baseline=false"]
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    metrics = json.loads(Path(out, "metrics.json").read_text())
    return {"projection": projection, "seed": seed, "steps": metrics["step"],
            "test_accuracy": metrics["test_accuracy"], "test_loss": metrics["test_loss"],
            "num_parameters": metrics["num_parameters"], "wall_s": round(time.perf_counter() - start, 1)}


def medians(runs: list[dict]) -> dict:
    """Per projection: the median test accuracy and loss over its seeds, and the seeds' accuracies."""
    out = {}
    for projection in PROJECTIONS:
        rows = [run for run in runs if run["projection"] == projection]
        if rows:
            out[projection] = {"median_test_accuracy": statistics.median(run["test_accuracy"] for run in rows),
                               "median_test_loss": statistics.median(run["test_loss"] for run in rows),
                               "test_accuracies": [run["test_accuracy"] for run in rows],
                               "num_parameters": rows[0]["num_parameters"]}
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--projections", nargs="+", default=list(PROJECTIONS), choices=PROJECTIONS)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory() as directory:
        for seed in args.seeds:
            for projection in args.projections:
                runs.append(train(projection, seed, args.steps, directory))
                print(json.dumps(runs[-1]), flush=True)
    summary = medians(runs)
    for projection, row in summary.items():
        print(f"{projection:8s} median test accuracy {row['median_test_accuracy']:.4f}  seeds {row['test_accuracies']}")
    return _record.write(args.out, {"runs": runs, "medians": summary}, argv=argv,
                         settings={"recipe": "vit", "data": "digits", "steps": args.steps, "seeds": args.seeds,
                                   "set": "patch_projection=P svm_baseline=false", "time_budget": 3600},
                         torch_threads=os.environ.get("OMP_NUM_THREADS"))


if __name__ == "__main__":
    main()
