"""What one multimodal run measured: per-task metrics, wall time, and the parameters of the one trunk against five.

    tokennet train multimodal --out RUN --set time_budget=150
    python bench/multimodal.py RUN --command "the train command" [--load "uptime before/after"]

Reads the finished run (``metrics.json``, ``config.json``) and writes ``bench/results/multimodal.json``: each
task's held-out metrics, the run's wall time, its parameter count, and the parameter count of the single-task
models its parts are (each part's config built alone, with its own stack of blocks of the same shape), summed.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from _record import commit, machine

from tokennet.models.registry import model_from_config, parameter_count
from tokennet.run import load


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run")
    p.add_argument("--command", required=True, help="the command that trained the run")
    p.add_argument("--load", default="", help="the machine's load while it trained (uptime)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "multimodal.json"))
    a = p.parse_args(argv)
    run = load(a.run)
    m, model = run.metrics, run.model
    apart = {t: parameter_count(model_from_config(model.config.part_config(t))) for t in model.tasks}
    trunk = sum(x.numel() for x in model.trunk.parameters())
    keys = ("val_loss", "val_perplexity", "test_accuracy", "test_accuracy_rotated", "test_loss")
    out = {
        "benchmark": "multimodal", "command": a.command, "commit": commit(), "machine": machine(),
        "load": a.load, "threads": int(os.environ.get("OMP_NUM_THREADS", "0") or 0),
        "steps": m.get("step"), "wall_seconds": m.get("wall_seconds"), "training_seconds": m.get("elapsed"),
        "tasks": {t: {k: m[t][k] for k in keys if k in m.get(t, {})} for t in model.tasks},
        "parameters": {"one_run": parameter_count(model), "trunk": trunk, "single_task_models": apart,
                       "single_task_models_sum": sum(apart.values()),
                       "ratio": round(parameter_count(model) / sum(apart.values()), 4)},
        "text_sample": m.get("text_sample"),
    }
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
