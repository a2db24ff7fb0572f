"""Records a laptop can set: the best result per modality on 2 CPU cores, kept like a speedrun's table.

Each row is one task, one metric and one wall-time budget (2 cores, the whole ``tokennet train`` process: data
loading, training, final evaluation and report included). A record is the median over at least three seeds of
the same command; it replaces the row's record only when it beats it beyond the seeds' spread (modded-nanogpt's
rule: a new record states its change and shows it is not noise). Every attempt is kept in the row's history.

    python bench/records.py run mnist1d --change "what this attempt changed"   # 3 seeds, then the verdict
    python bench/records.py run characters --change "..." -- --time-budget 840  # with more `train` arguments
    python bench/records.py table                                              # the markdown table
    python bench/records.py table --write docs/records.md                      # the page, and README's table

``bench/results/records.json`` holds the rows; ``docs/records.md`` and the README's table are rendered from it (a
test checks that they match), so the table is never copied by hand.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _record  # noqa: E402

RESULTS = _record.ROOT / "bench" / "results" / "records.json"
PAGE = _record.ROOT / "docs" / "records.md"
README = _record.ROOT / "README.md"
BEGIN, END = "<!-- records: rendered by bench/records.py, do not edit -->", "<!-- records: end -->"
MIN_SEEDS = 3


@dataclasses.dataclass(frozen=True)
class Task:
    """One row of the table: what is trained, what is measured, against what reference."""

    title: str
    recipe: str
    metric: str  # a key of the run's metrics.json
    higher_is_better: bool
    budget_s: float  # the wall time a record may take, the whole process
    goal: float  # the number to reach
    reference: tuple[tuple[str, float | None, str], ...]  # what a reader compares it with: (label, value, unit)
    args: tuple[str, ...] = ()  # the documented settings: what `tokennet train RECIPE` is given

    def command(self, seed: int, out: str, extra: tuple[str, ...] = ()) -> list[str]:
        """The ``tokennet train`` process of one seed: the row's documented settings, then this attempt's."""
        return [sys.executable, "-m", "tokennet.cli", "-q", "train", self.recipe, *self.args, *extra, "--seed",
                str(seed), "--out", out, "--no-progress"]


TASKS = {
    "characters": Task("Tiny Shakespeare, characters (val loss)", "gpt-char", "val_loss", False, 900, 1.47,
                       (("nanoGPT's A100 config: val", 1.4697, ""),), ("--data", "shakespeare")),
    "fashion-mnist": Task("Fashion-MNIST (test accuracy)", "vit", "test_accuracy", True, 600, 0.95,
                          (("ResNet-18", 94.9, "%"), ("WRN-40-4", 96.7, "%")), ("--data", "fashion-mnist")),
    "mnist1d": Task("MNIST-1D (test accuracy)", "vit", "test_accuracy", True, 600, 0.99,
                    (("CNN", 94, "%"), ("human", 96, "%")), ("--data", "mnist1d")),
    "spoken-digits": Task("spoken digits, unheard synthesizers: Flite and Festival (accuracy)", "audio",
                          "test_accuracy_other_synth", True, 600, 0.90,
                          (("espeak-ng voices only in training", None, ""),)),
    "graph": Task("graph shortest path (test accuracy)", "graph", "test_accuracy", True, 300, 0.0,
                  (("the configured model alone (ablation off)", None, ""),)),
    "sphere": Task("digits on the sphere, rotated test (accuracy)", "sphere", "test_accuracy_rotated", True, 300,
                   0.0, (("trained unrotated, tested rotated (NR/R)", None, ""),)),
}


def run_seed(task: Task, seed: int, extra: tuple[str, ...] = ()) -> dict:
    """One ``tokennet train`` process, timed from its start to its end; its metric read back from the run."""
    with tempfile.TemporaryDirectory(prefix="record-") as tmp:
        out = str(Path(tmp) / "run")
        started = time.perf_counter()
        done = subprocess.run(task.command(seed, out, extra), capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(_record.ROOT / "src")})
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"seed {seed}: tokennet train exited {done.returncode}: {done.stderr.strip()[-500:]}")
        metrics = json.loads((Path(out) / "metrics.json").read_text())
    if task.metric not in metrics:
        raise SystemExit(f"seed {seed}: metrics.json has no {task.metric!r} (it has {', '.join(sorted(metrics))})")
    return {"seed": seed, "value": float(metrics[task.metric]), "wall_s": round(wall, 1)}


def summarize(runs: list[dict]) -> dict:
    """Median and spread (max − min) of the metric and the wall time over the seeds."""
    values, walls = [r["value"] for r in runs], [r["wall_s"] for r in runs]
    return {"median": statistics.median(values), "spread": max(values) - min(values),
            "wall_s_median": statistics.median(walls), "runs": runs}


def beats(task: Task, new: dict, old: dict | None) -> bool:
    """A new record beats the old one beyond the larger of the two spreads (never within the seeds' noise)."""
    if old is None:
        return True
    margin = max(new["spread"], old["spread"])
    gain = new["median"] - old["median"] if task.higher_is_better else old["median"] - new["median"]
    return gain > margin


def load_rows(path: Path = RESULTS) -> dict:
    return json.loads(path.read_text())["rows"] if path.exists() else {}


def settings() -> dict:
    """What every attempt is judged by: the tasks (their goals and references as numbers) and the seeds needed."""
    return {"min_seeds": MIN_SEEDS, "tasks": {name: dataclasses.asdict(task) for name, task in TASKS.items()}}


def attempt(name: str, seeds: list[int], change: str, path: Path = RESULTS, extra: tuple[str, ...] = ()) -> dict:
    """Run ``seeds`` of task ``name`` (``extra``: this attempt's ``tokennet train`` arguments after the row's own),
    judge the attempt against the row's record and write the file."""
    if len(seeds) < MIN_SEEDS:
        raise SystemExit(f"a record needs at least {MIN_SEEDS} seeds, got {len(seeds)}")
    task = TASKS[name]
    new = {**summarize([run_seed(task, s, extra) for s in seeds]), "change": change, "commit": _record.commit(),
           "command": " ".join(["tokennet", "train", task.recipe, *task.args, *extra, "--seed", "S"]),
           "load_average": os.getloadavg()}
    rows = load_rows(path)
    rows.setdefault(name, {"record": None, "history": []})["history"].append(new)
    _record.write(path, {"rows": judge(rows)}, settings=settings())
    return new


def judge(rows: dict) -> dict:
    """Judge every row's attempts in order: within the budget (the median wall, as the issue's numbers are medians)
    and beating the record standing before it beyond the spread. Run again after a rule changes (``rejudge``)."""
    for name, row in rows.items():
        task, row["record"] = TASKS[name], None
        for tried in row["history"]:
            tried["within_budget"] = tried["wall_s_median"] <= task.budget_s
            tried["record"] = tried["within_budget"] and beats(task, tried, row["record"])
            if tried["record"]:
                row["record"] = tried
    return rows


def rejudge(path: Path = RESULTS) -> dict:
    """Judge every attempt again by today's rules and write the file."""
    rows = judge(load_rows(path))
    _record.write(path, {"rows": rows}, settings=settings())
    return rows


def table(rows: dict, results: str = "../bench/results") -> str:
    """The markdown table of the records, rendered from the JSON (never edited by hand); ``results``: the path
    of bench/results from the page that shows it."""
    lines = ["| task | reference | goal | record: median (spread) | wall (median) | budget | command | change | file |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    link = f"[records.json]({results}/records.json)"
    for name, task in TASKS.items():
        rec = (rows.get(name) or {}).get("record")
        goal = f"{'≥' if task.higher_is_better else '≤'} {task.goal:g}" if task.goal else "—"
        reference = ", ".join(label if value is None else f"{label} {value:g}{unit}"
                              for label, value, unit in task.reference)
        if rec is None:
            tried = (rows.get(name) or {}).get("history") or []
            best = f"no record yet ({len(tried)} attempts)" if tried else "not yet run"
            lines.append(f"| {task.title} | {reference} | {goal} | {best} | | {task.budget_s:g} s | | | {link} |")
            continue
        lines.append(f"| {task.title} | {reference} | {goal} | {rec['median']:.4g} ({rec['spread']:.2g}) "
                     f"| {rec['wall_s_median']:g} s | {task.budget_s:g} s | `{rec['command']}` | {rec['change']} "
                     f"| {link} |")
    return "\n".join(lines)


def history(rows: dict) -> str:
    """Each row's story: every attempt in order — its change, its median and spread, its wall, the verdict."""
    parts = []
    for name, task in TASKS.items():
        tried = (rows.get(name) or {}).get("history") or []
        if not tried:
            continue
        parts.append(f"### {task.title}\n")
        for number, entry in enumerate(tried, 1):
            verdict = "**record**" if entry["record"] else "not a record" + (
                "" if entry["within_budget"] else " (over the budget)")
            parts.append(f"{number}. {entry['change']}: {entry['median']:.4g} (spread "
                         f"{entry['spread']:.2g}), {entry['wall_s_median']:g} s, `{entry['command']}`, "
                         f"commit `{(entry.get('commit') or '?')[:12]}` — {verdict} "
                         "([records.json](../bench/results/records.json))")
        parts.append("")
    return "\n".join(parts)


def page(rows: dict) -> str:
    return ("# Records on 2 CPU cores\n\n<!-- rendered by `python bench/records.py table --write docs/records.md` "
            "from bench/results/records.json; do not edit -->\n\nEach record is the median over at least "
            f"{MIN_SEEDS} seeds of `tokennet train`, timed as a whole process on 2 cores; it stands until an "
            "attempt beats it beyond the seeds' spread. Every attempt, record or not, is in "
            "[records.json](../bench/results/records.json).\n\n" + table(rows) + "\n\n## Every attempt, in order\n\n"
            "What each attempt changed and how it was judged: a record must beat the one before it beyond the "
            "seeds' spread, within the budget.\n\n" + history(rows))


def readme_with_table(readme: str, rows: dict) -> str:
    """README.md's text with the table between its BEGIN and END markers rendered anew."""
    return _record.between_markers(readme, BEGIN, END, table(rows, "bench/results"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    go = sub.add_parser("run", help="run one task's seeds and judge them against its record",
                        epilog="After --: more `tokennet train` arguments for this attempt (-- --time-budget 840).")
    go.add_argument("task", choices=sorted(TASKS))
    go.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    go.add_argument("--change", required=True, help="what this attempt changed (stated in the table)")
    sub.add_parser("rejudge", help="judge every attempt again by today's rules (after a rule changed)")
    show = sub.add_parser("table", help="print the table (or write the docs page) from records.json")
    show.add_argument("--write", metavar="PATH", help="write the docs page there (and the README's table)")
    argv = sys.argv[1:] if argv is None else argv
    extra = tuple(argv[argv.index("--") + 1:]) if "--" in argv else ()
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if args.command == "run":
        new = attempt(args.task, args.seeds, args.change, extra=extra)
        verdict = "a new record" if new["record"] else "not a record" + (
            "" if new["within_budget"] else " (over the budget)")
        print(f"{args.task}: median {new['median']:.4g}, spread {new['spread']:.2g}, wall {new['wall_s_median']:g} s"
              f" — {verdict}")
        return 0
    if args.command == "rejudge":
        for name, row in rejudge().items():
            print(f"{name}: record {row['record']['median'] if row['record'] else None}")
        return 0
    if not RESULTS.exists():  # the tasks, goals and references the page shows, before any attempt
        _record.write(RESULTS, {"rows": {}}, settings=settings())
    text = page(load_rows())
    if args.write:
        Path(args.write).write_text(text)
        README.write_text(readme_with_table(README.read_text(), load_rows()))
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
