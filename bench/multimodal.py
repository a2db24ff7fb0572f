"""What sharing one trunk does: the multimodal run against single-task runs, across modalities, and as a start.

Three measurements, each a subcommand that prints a table and writes a JSON file to ``bench/results/`` (the command,
the commit, the machine):

    python bench/multimodal.py sharing [--seeds 0 1 2] [--set K=V ...] [--work DIR]
        -> multimodal-sharing.json
    python bench/multimodal.py finetune RUN [RUN ...] [--data mnist1d] [--steps 300 3000]
        -> multimodal-finetune.json
    python bench/multimodal.py record RUN --command "the train command" [--load "uptime"]
        -> multimodal.json (one finished run: its metrics and parameters)

``sharing``, per seed: ``tokennet train multimodal`` (the default run, or with ``--set``), then per task a single-task
run of the same trunk shape for the same number of that task's steps — the same recipe with ``tasks=<task>`` (the
task's own tokens, positions, mask, head, data and settings; nothing shared with anything) and ``max_iters`` the number
of steps the multimodal run drew that task (its mix is a pure function of the step). It reports each task's metric
beside its single run's (text: validation loss, lower is better; the others: test accuracy), the parameters of the
one run against the sum of the single runs', and the multimodal run's ``cross_modal`` metrics (computed by
``tokennet eval`` from the saved run: :func:`tokennet.tasks.multimodal.cross_modal`); medians over the seeds, and the
``claim`` record ``tokennet demo claims`` reads.

``finetune``, per multimodal run and step count: ``tokennet train vit --data DATA --init RUN`` (a new ViT around the
run's shared trunk: :func:`tokennet.interop.init.from_trunk`) against the same ViT from scratch (the trunk's shape
set explicitly), both for exactly that many steps with the run's seed.
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
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/_record.py, also when a test loads this file
import _record  # noqa: E402

from tokennet.data.multimodal import TASKS  # noqa: E402
from tokennet.models.multimodal import TRUNK_FIELDS  # noqa: E402
from tokennet.models.registry import model_from_config, parameter_count  # noqa: E402
from tokennet.recipes.multimodal import MixedBatches, parse_weights  # noqa: E402
from tokennet.run import load  # noqa: E402

RESULTS = Path(__file__).parent / "results"
# The metric each task is compared on: (key in metrics.json[task], higher is better?)
METRIC = {"text": ("val_loss", False), "image": ("test_accuracy", True), "audio": ("test_accuracy", True),
          "sphere": ("test_accuracy", True), "graph": ("test_accuracy", True)}
# The targets: each task at ≥ 95% of its single run's accuracy (text: validation loss within 5%), the one
# run at ≤ 0.5× the single runs' parameters, and the shared head's agreement ≥ 90% on same-digit pairs.
ACCURACY_SHARE, LOSS_SLACK, PARAMETER_RATIO, AGREEMENT = 0.95, 1.05, 0.5, 0.90
# What a single-task run does not take from the multimodal command's settings: the mixing (one task) and the budget
# (its own: that task's steps).
NOT_FOR_SINGLE = ("tasks", "mix", "loss_weights", "max_iters", "time_budget")


# -- running tokennet --------------------------------------------------------------------------------------------

def train(argv: list[str], out: Path) -> dict:
    """``tokennet train ARGV --out OUT`` in its own process; its ``metrics.json``, with the wall time of the whole
    process and the command as a user types it."""
    cmd = [sys.executable, "-m", "tokennet.cli", "-q", "train", *argv, "--out", str(out), "--no-progress"]
    started = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(_record.ROOT / "src")}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"tokennet train {' '.join(argv)} failed: {done.stderr.strip()[-600:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    return {"command": " ".join(["tokennet", "train", *argv]),
            "process_seconds": round(time.perf_counter() - started, 1), "metrics": metrics}


def steps_per_task(run_dir: Path) -> dict[str, int]:
    """How many of a finished multimodal run's steps trained each task: the run's mix drawn again for steps
    ``0 … step − 1`` (the trainer's batch index is the step)."""
    info = json.loads((run_dir / "run.json").read_text())
    names = info["data_spec"]["tasks"].split(",")
    settings = info["settings"]
    steps = json.loads((run_dir / "metrics.json").read_text())["step"]
    mix = MixedBatches(dict.fromkeys(names), parse_weights(settings["mix"], names, "mix"), settings["seed"])
    drawn = Counter(mix.task(i) for i in range(steps))
    return {t: drawn[t] for t in names}


def single_sets(sets: list[str], task: str) -> list[str]:
    """The ``--set`` items of the multimodal command that apply to a single-task run of ``task``."""
    keep = []
    for item in sets:
        key = item.split("=", 1)[0]
        prefix = key.split("_", 1)[0]
        if key in NOT_FOR_SINGLE or (prefix in TASKS and prefix != task):
            continue
        keep.append(item)
    return keep


# -- sharing -------------------------------------------------------------------------------------------------------

def sharing_seed(seed: int, sets: list[str], work: Path) -> dict:
    """One seed: the multimodal run, then each task's single-task run at that task's steps."""
    multi_dir = work / f"seed{seed}" / "multimodal"
    multi = train(["multimodal", "--seed", str(seed), "--set", "report=false", *sets], multi_dir)
    m = multi["metrics"]
    per_task = steps_per_task(multi_dir)
    record = {"seed": seed, "run": str(multi_dir), "one_run": {
        "command": multi["command"], "steps": m["step"], "steps_per_task": per_task,
        "training_seconds": m.get("elapsed"), "process_seconds": multi["process_seconds"],
        "num_parameters": m["num_parameters"],
        "metrics": {t: m[t][METRIC[t][0]] for t in per_task}, "cross_modal": m.get("cross_modal")}, "single": {}}
    for task, steps in per_task.items():
        if steps == 0:
            raise SystemExit(f"seed {seed}: the multimodal run never drew {task} in its {m['step']} steps")
        one = train(["multimodal", "--seed", str(seed), "--set", f"tasks={task}", f"max_iters={steps}", "report=false",
                     *single_sets(sets, task)], work / f"seed{seed}" / f"single-{task}")
        s = one["metrics"]
        record["single"][task] = {"command": one["command"], "steps": s["step"], "training_seconds": s.get("elapsed"),
                                  "process_seconds": one["process_seconds"], "num_parameters": s["num_parameters"],
                                  "metric": s[task][METRIC[task][0]]}
    return record


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize_sharing(runs: list[dict]) -> dict:
    """Medians over the seeds' records (:func:`sharing_seed`): per task its metric in the one run and its single run,
    their ratio against the issue's target; the parameters; the cross-modal metrics; and the claim's verdict."""
    tasks: dict[str, dict] = {}
    for task in runs[0]["one_run"]["metrics"]:
        key, higher = METRIC[task]
        one = _median([r["one_run"]["metrics"][task] for r in runs])
        single = _median([r["single"][task]["metric"] for r in runs])
        ratio = one / single if single else None
        reached = ratio is not None and (ratio >= ACCURACY_SHARE if higher else ratio <= LOSS_SLACK)
        tasks[task] = {"metric": key, "higher_is_better": higher, "one_run": one, "single_run": single,
                       "ratio": None if ratio is None else round(ratio, 4),
                       "target": f"≥ {ACCURACY_SHARE}" if higher else f"≤ {LOSS_SLACK}", "reached": reached,
                       "steps": _median([r["one_run"]["steps_per_task"][task] for r in runs])}
    one_params = _median([r["one_run"]["num_parameters"] for r in runs])
    single_params = _median([sum(s["num_parameters"] for s in r["single"].values()) for r in runs])
    parameters = {"one_run": one_params, "single_runs_sum": single_params,
                  "ratio": round(one_params / single_params, 4), "target": f"≤ {PARAMETER_RATIO}"}
    parameters["reached"] = parameters["ratio"] <= PARAMETER_RATIO
    cross = {}
    crosses = [r["one_run"]["cross_modal"] for r in runs if r["one_run"].get("cross_modal")]
    for kind in ("agreement", "both_right", "nearest", "class_mean"):
        if crosses:
            cross[kind] = {pair: _median([c[kind][pair] for c in crosses]) for pair in crosses[0][kind]}
    if cross.get("agreement"):
        cross["lowest_agreement"] = min(cross["agreement"].values())
        cross["target"] = f"≥ {AGREEMENT}"
        cross["reached"] = cross["lowest_agreement"] >= AGREEMENT
    out = {"tasks": tasks, "parameters": parameters, "cross_modal": cross,
           "training_seconds": _median([r["one_run"]["training_seconds"] for r in runs]),
           "process_seconds": _median([r["one_run"]["process_seconds"] for r in runs])}
    out["claim"] = sharing_claim(out, len(runs))
    return out


def sharing_claim(summary: dict, seeds: int) -> dict:
    """The record ``tokennet demo claims`` reads: holds when every target of the issue is reached."""
    parts = []
    for task, row in summary["tasks"].items():
        what = "loss" if not row["higher_is_better"] else "accuracy"
        parts.append(f"{task} {row['ratio']}x its single run's {what}" if row["ratio"] is not None
                     else f"{task}: its single run scored 0")
    params = summary["parameters"]
    measured = "; ".join(parts) + f"; {params['ratio']}x the single runs' parameters"
    checks = [row["reached"] for row in summary["tasks"].values()] + [params["reached"]]
    cross = summary["cross_modal"]
    if "lowest_agreement" in cross:
        measured += f"; the shared digit head agrees on ≥ {cross['lowest_agreement']:.3f} of same-digit pairs"
        checks.append(cross["reached"])
    run = (f"one trunk trained on {', '.join(summary['tasks'])} at once against each task alone with the same trunk "
           f"shape for the same steps (medians of {seeds} seed{'s' * (seeds != 1)})")
    return {"holds": all(checks), "measured": measured, "run": run}


def sharing_table(summary: dict) -> str:
    rows = [f"{'task':8} {'metric':14} {'one run':>9} {'alone':>9} {'ratio':>7} {'target':>7} {'steps':>6}"]
    for task, row in summary["tasks"].items():
        fmt = lambda v: "-" if v is None else f"{v:.4f}"  # noqa: E731
        rows.append(f"{task:8} {row['metric']:14} {fmt(row['one_run']):>9} {fmt(row['single_run']):>9} "
                    f"{fmt(row['ratio']):>7} {row['target']:>7} {row['steps']:>6}")
    params = summary["parameters"]
    rows.append(f"parameters: one run {params['one_run']:,} against {params['single_runs_sum']:,} alone "
                f"({params['ratio']}x, target {params['target']})")
    for kind, values in summary["cross_modal"].items():
        if isinstance(values, dict):
            rows.append(f"{kind}: " + ", ".join(f"{pair} {v:.3f}" for pair, v in values.items()))
    rows.append(f"claim holds: {summary['claim']['holds']} ({summary['claim']['measured']})")
    return "\n".join(rows)


def cmd_sharing(a, argv) -> dict:
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="multimodal-sharing-"))
    runs = [sharing_seed(seed, a.set, work) for seed in a.seeds]
    summary = summarize_sharing(runs)
    record = _record.write(a.out or RESULTS / "multimodal-sharing.json",
                           {"benchmark": "multimodal-sharing", **summary, "runs": runs},
                           settings={"seeds": a.seeds, "set": a.set, "work": str(work)}, argv=argv,
                           script="multimodal.py", threads=int(os.environ.get("OMP_NUM_THREADS", "0") or 0))
    print(sharing_table(summary))
    return record


# -- a new task from the shared trunk -------------------------------------------------------------------------------

def finetune_pair(run_dir: Path, data: str, steps: int, work: Path) -> dict:
    """One multimodal run and one step count: the new task fine-tuned from the run's trunk, and from scratch."""
    info = json.loads((run_dir / "run.json").read_text())
    config = json.loads((run_dir / "config.json").read_text())
    seed = info["settings"]["seed"]
    common = ["--seed", str(seed), "--set", f"max_iters={steps}", "report=false"]
    tag = f"{run_dir.parent.name}-{run_dir.name}-{steps}"
    tuned = train(["vit", "--data", data, "--init", str(run_dir), *common], work / f"{tag}-init")
    shape = [f"{k}={str(config[k]).lower() if isinstance(config[k], bool) else config[k]}" for k in TRUNK_FIELDS]
    scratch = train(["vit", "--data", data, *common, *shape], work / f"{tag}-scratch")
    row = {"init": str(run_dir), "seed": seed, "steps": steps}
    for name, done in (("fine_tuned", tuned), ("scratch", scratch)):
        m = done["metrics"]
        row[name] = {"command": done["command"], "steps": m["step"], "test_accuracy": m["test_accuracy"],
                     "test_loss": m.get("test_loss"), "num_parameters": m["num_parameters"],
                     "training_seconds": m.get("elapsed")}
    return row


def summarize_finetune(rows: list[dict]) -> dict:
    """Per step count, the medians over the runs: fine-tuned and scratch test accuracy, and their difference."""
    out = {}
    for steps in sorted({r["steps"] for r in rows}):
        at = [r for r in rows if r["steps"] == steps]
        tuned = _median([r["fine_tuned"]["test_accuracy"] for r in at])
        scratch = _median([r["scratch"]["test_accuracy"] for r in at])
        out[str(steps)] = {"fine_tuned": tuned, "scratch": scratch, "difference": round(tuned - scratch, 4),
                           "runs": len(at)}
    return out


def cmd_finetune(a, argv) -> dict:
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="multimodal-finetune-"))
    rows = [finetune_pair(Path(run), a.data, steps, work) for run in a.runs for steps in a.steps]
    summary = summarize_finetune(rows)
    record = _record.write(a.out or RESULTS / "multimodal-finetune.json",
                           {"benchmark": "multimodal-finetune", "data": a.data, "median": summary, "runs": rows},
                           settings={"runs": a.runs, "data": a.data, "steps": a.steps, "work": str(work)}, argv=argv,
                           script="multimodal.py", threads=int(os.environ.get("OMP_NUM_THREADS", "0") or 0))
    print(f"{'steps':>6} {'from the trunk':>15} {'from scratch':>13} {'difference':>11}   ({a.data} test accuracy)")
    for steps, row in summary.items():
        print(f"{steps:>6} {row['fine_tuned']:>15.4f} {row['scratch']:>13.4f} {row['difference']:>+11.4f}")
    return record


# -- one finished run ----------------------------------------------------------------------------------------------

def cmd_record(a, argv) -> dict:
    """Reads the finished run (``metrics.json``, ``config.json``): each task's held-out metrics, the run's wall time,
    its parameter count, and the parameter count of the single-task models its parts are (each part's config built
    alone, with its own stack of blocks of the same shape), summed."""
    run = load(a.run)
    m, model = run.metrics, run.model
    apart = {t: parameter_count(model_from_config(model.config.part_config(t))) for t in model.tasks}
    trunk = sum(x.numel() for x in model.trunk.parameters())
    keys = ("val_loss", "val_perplexity", "test_accuracy", "test_accuracy_rotated", "test_loss")
    out = {
        "benchmark": "multimodal", "command": a.command, "commit": _record.commit(), "machine": _record.machine(),
        "load": a.load, "threads": int(os.environ.get("OMP_NUM_THREADS", "0") or 0),
        "steps": m.get("step"), "wall_seconds": m.get("wall_seconds"), "training_seconds": m.get("elapsed"),
        "tasks": {t: {k: m[t][k] for k in keys if k in m.get(t, {})} for t in model.tasks},
        "parameters": {"one_run": parameter_count(model), "trunk": trunk, "single_task_models": apart,
                       "single_task_models_sum": sum(apart.values()),
                       "ratio": round(parameter_count(model) / sum(apart.values()), 4)},
        "cross_modal": m.get("cross_modal"),
        "text_sample": m.get("text_sample"),
    }
    Path(a.out or RESULTS / "multimodal.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("sharing", help="the multimodal run against single-task runs at the same steps, per seed")
    s.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    s.add_argument("--set", nargs="*", default=[], metavar="K=V", help="settings of the multimodal run")
    s.add_argument("--work", help="where the runs are written (default: a new temporary directory, kept)")
    s.add_argument("--out", help="the JSON file (default: bench/results/multimodal-sharing.json)")
    f = sub.add_parser("finetune", help="a new task from the runs' shared trunk against from scratch, equal steps")
    f.add_argument("runs", nargs="+", help="multimodal run directories (e.g. sharing's WORK/seed*/multimodal)")
    f.add_argument("--data", default="mnist1d", help="the vit recipe's --data of the new task")
    f.add_argument("--steps", type=int, nargs="+", default=[300, 3000])
    f.add_argument("--work", help="where the runs are written (default: a new temporary directory, kept)")
    f.add_argument("--out", help="the JSON file (default: bench/results/multimodal-finetune.json)")
    r = sub.add_parser("record", help="one finished multimodal run: its metrics and parameters")
    r.add_argument("run")
    r.add_argument("--command", required=True, help="the command that trained the run")
    r.add_argument("--load", default="", help="the machine's load while it trained (uptime)")
    r.add_argument("--out", help="the JSON file (default: bench/results/multimodal.json)")
    a = p.parse_args(argv)
    {"sharing": cmd_sharing, "finetune": cmd_finetune, "record": cmd_record}[a.mode](a, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
