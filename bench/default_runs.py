"""How long each recipe's default run takes on this machine: ``tokennet train RECIPE`` with nothing else given.

Every recipe is trained once (seed 0) as its own process, timed from start to end (data loading, training, final
evaluation and the report included), its headline metric read back from the run's ``metrics.json``. Rows merge
into ``bench/results/default-runs.json`` by recipe, so a subset can be measured again (``--recipes``) without
losing the others; the README's recipe table is rendered from that file (``table --write``), never copied by hand.
The issue's bar: no default run above 10 minutes on 2 cores.

    python bench/default_runs.py run [--recipes vit gpt-char ...]   # one process per recipe, in turn
    python bench/default_runs.py from-records                        # rows records.py measured (same command)
    python bench/default_runs.py from-file bench/results/vqa_default.json   # a bench's own whole default runs
    python bench/default_runs.py table [--write]                     # the README's table from the JSON
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _record  # noqa: E402

RESULTS = _record.ROOT / "bench" / "results" / "default-runs.json"
RECORDS = RESULTS.with_name("records.json")  # bench/records.py's rows
README = _record.ROOT / "README.md"
BEGIN, END = "<!-- default runs: rendered by bench/default_runs.py, do not edit -->", "<!-- default runs: end -->"
LIMIT_S = 600.0  # the bar for a default run on 2 cores
# The metric a reader looks at first, per recipe (the first of these keys that the run's metrics.json has).
HEADLINES = ("test_accuracy", "exact_match", "val_loss", "accuracy")


def recipes() -> list[str]:
    """tokennet's own recipes (not a plugin's: a test session registers some)."""
    from tokennet.lifecycle import list_recipes

    return sorted(recipe.name for recipe in list_recipes() if recipe.build.__module__.startswith("tokennet."))


def headline(metrics: dict) -> tuple[str | None, float | None]:
    """The run's headline metric: the first key of :data:`HEADLINES` it has (else a task's own, ``image.test_accuracy``,
    in a run of several tasks)."""
    flat = {f"{task}.{key}": value for task, part in metrics.items() if isinstance(part, dict)
            for key, value in part.items()}  # a run of several tasks: {"image": {"test_accuracy": ...}, ...}
    numbers = {key: value for key, value in {**metrics, **flat}.items() if isinstance(value, (int, float))}
    key = next((key for key in HEADLINES if key in numbers), None)
    key = key or next((key for head in HEADLINES for key in sorted(numbers) if key.endswith("." + head)), None)
    return key, (float(numbers[key]) if key else None)


def run_default(recipe: str, seed: int = 0) -> dict:
    """One ``tokennet train RECIPE --seed S`` process, timed as a whole; its headline metric read back."""
    with tempfile.TemporaryDirectory(prefix="default-run-") as tmp:
        out = str(Path(tmp) / "run")
        argv = [sys.executable, "-m", "tokennet.cli", "-q", "train", recipe, "--seed", str(seed), "--out", out,
                "--no-progress"]
        load_before, started = os.getloadavg()[0], time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(_record.ROOT / "src")})
        wall = time.perf_counter() - started
        if done.returncode != 0:
            return {"recipe": recipe, "error": done.stderr.strip()[-400:], "wall_s": round(wall, 1)}
        metrics = json.loads((Path(out) / "metrics.json").read_text())
    key, value = headline(metrics)
    return {"recipe": recipe, "command": f"tokennet train {recipe}", "seed": seed, "wall_s": round(wall, 1),
            "within_limit": wall <= LIMIT_S, "metric": key, "value": value, "commit": _record.commit(),
            "load_average_before": load_before, "load_average_after": os.getloadavg()[0]}


def from_records(records_path: Path = RECORDS) -> dict:
    """Rows already measured by ``bench/records.py``: a records attempt whose command is the recipe's plain default
    (``tokennet train RECIPE --seed S``, nothing else) ran this very process for seed 0; its latest such seed-0 run
    is taken (wall, metric, commit), marked as coming from records.json."""
    rows = {}
    for name, row in (json.loads(records_path.read_text())["rows"] if records_path.exists() else {}).items():
        for tried in row["history"]:
            recipe = tried["command"].split()[2]
            seed0 = next((run for run in tried["runs"] if run["seed"] == 0), None)
            if tried["command"] == f"tokennet train {recipe} --seed S" and seed0 is not None:
                rows[recipe] = {"recipe": recipe, "command": f"tokennet train {recipe}", "seed": 0,
                                "wall_s": seed0["wall_s"], "within_limit": seed0["wall_s"] <= LIMIT_S,
                                "metric": _metric_of(name), "value": seed0["value"], "commit": tried.get("commit"),
                                "source": f"records.json, row {name!r}: {tried['change']}"}
    return rows


def from_runs_file(path: Path) -> dict:
    """Rows from a bench file of whole default runs (``runs``: ``command``, ``seed``, ``wall_seconds``, ``metrics``,
    ``commit``; bench/vqa_default.py's): its seed-0 run, where that run was ``tokennet train RECIPE --seed 0`` with
    nothing but where to write it and the progress bar changed, marked as coming from that file."""
    rows = {}
    for run in json.loads(path.read_text()).get("runs", []):
        words = run["command"].split()
        plain = [word for word in words if not word.startswith(("--out", "/", "--overwrite", "progress=", "--set"))]
        if run["seed"] != 0 or plain[:2] != ["tokennet", "train"] or plain[3:] != ["--seed", "0"]:
            continue
        key, value = headline(run["metrics"])
        rows[plain[2]] = {"recipe": plain[2], "command": f"tokennet train {plain[2]}", "seed": 0,
                          "wall_s": run["wall_seconds"], "within_limit": run["wall_seconds"] <= LIMIT_S,
                          "metric": key, "value": value, "commit": run.get("commit"),
                          "source": f"{path.name}: {run['command']}"}
    return rows


def _metric_of(task: str) -> str:
    import records  # bench/records.py, beside this file

    return records.TASKS[task].metric


def load_rows(path: Path = RESULTS) -> dict:
    return json.loads(path.read_text())["rows"] if path.exists() else {}


def measure(names: list[str], path: Path = RESULTS) -> dict:
    """Run each recipe's default in turn, merging each row into the file as soon as it is measured."""
    rows = load_rows(path)
    for name in names:
        rows[name] = run_default(name)
        print(f"{name}: {rows[name].get('wall_s')} s, {rows[name].get('metric')} = {rows[name].get('value')}"
              + (f" — failed: {rows[name]['error']}" if "error" in rows[name] else ""), flush=True)
        _record.write(path, {"rows": rows}, settings={"limit_s": LIMIT_S, "headlines": list(HEADLINES)})
    return rows


def table(rows: dict) -> str:
    """The README's recipe table: every recipe, its default run's wall time and headline metric on 2 cores."""
    lines = ["| recipe | default run (2 cores, whole process) | headline metric | file |", "| --- | --- | --- | --- |"]
    link = "[default-runs.json](bench/results/default-runs.json)"
    for name in recipes():
        row = rows.get(name)
        if row is None or "error" in row:
            lines.append(f"| `{name}` | not measured | | {link} |")
            continue
        over = "" if row["within_limit"] else f" (over the {LIMIT_S / 60:g}-minute bar)"
        metric = f"{row['metric']} {row['value']:.4g}" if row["metric"] else "—"
        origin = row.get("source", "").split(":")[0].split(",")[0]  # a row another bench measured, at its commit
        taken = f"; the run of [{origin}](bench/results/{origin}), commit `{(row.get('commit') or '?')[:7]}`" \
            if origin else ""
        lines.append(f"| `{name}` | {row['wall_s']:g} s{over}{taken} | {metric} | {link} |")
    return "\n".join(lines)


def readme_with_table(readme: str, rows: dict) -> str:
    """README.md's text with the recipe table between its BEGIN and END markers rendered anew."""
    return _record.between_markers(readme, BEGIN, END, table(rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    go = sub.add_parser("run", help="time each recipe's default run (all of them, or --recipes)")
    go.add_argument("--recipes", nargs="+", help="only these (default: every recipe)")
    sub.add_parser("from-records", help="take the rows bench/records.py measured with the plain default command")
    take = sub.add_parser("from-file", help="take the seed-0 default run of a bench file of whole runs")
    take.add_argument("path", type=Path)
    show = sub.add_parser("table", help="print the README's recipe table from the JSON")
    show.add_argument("--write", action="store_true", help="write it into README.md between its markers")
    args = parser.parse_args(argv)
    if args.command == "run":
        unknown = sorted(set(args.recipes or ()) - set(recipes()))
        if unknown:
            raise SystemExit(f"unknown recipes {unknown}; the recipes are {recipes()}")
        measure(args.recipes or recipes())
        return 0
    if args.command in ("from-records", "from-file"):
        rows = {**load_rows(), **(from_records() if args.command == "from-records" else from_runs_file(args.path))}
        _record.write(RESULTS, {"rows": rows}, settings={"limit_s": LIMIT_S, "headlines": list(HEADLINES)})
        print(table(rows))
        return 0
    if args.write:
        README.write_text(readme_with_table(README.read_text(), load_rows()))
    else:
        print(table(load_rows()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
