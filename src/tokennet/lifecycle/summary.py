"""The end of ``tokennet train`` as a person reads it: a few lines and a small table, not every metric.

The first line repeats the last progress line's step and seconds (the run's clock when training stopped: a resumed
run's earlier sessions and the preparation included), then the seconds in all and the model's size. The table has
the recipe's headline metrics as columns (:attr:`~tokennet.lifecycle.recipe.Recipe.headline`) and a row for the
model and for each baseline it declares (:attr:`~tokennet.lifecycle.recipe.Recipe.baselines`); every other metric
stays in ``metrics.json``. A recipe that declares no headline (a plugin's) shows its numeric metrics on one line,
as before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..run_files import REPORT_FILE
from .recipe import Recipe

__all__ = ["summary", "headline_rows", "stopped_line"]

# Bookkeeping, not results: left out of the one-line fallback.
_NOT_RESULTS = {"step", "elapsed", "wall", "wall_seconds", "run_seconds", "time_budget", "num_parameters", "world_size",
                "test_size", "train_size", "epochs"}


def _lookup(metrics: dict[str, Any], key: str | None) -> Any:
    """``metrics[key]``, where ``task.key`` reaches into a run of several tasks' nested metrics; None if absent."""
    if key is None:
        return None
    if key in metrics:
        return metrics[key]
    part, _, rest = key.partition(".")
    inner = metrics.get(part)
    return inner.get(rest) if rest and isinstance(inner, dict) else None


def _number(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return "–"


def headline_rows(recipe: Recipe, metrics: dict[str, Any]) -> tuple[list[str], list[tuple[str, list[Any]]]]:
    """``(columns, rows)``: the headline metrics this run has, and per row (the model, then each baseline that
    reported one of them) its values in those columns (None where it has none)."""
    keep = [i for i, key in enumerate(recipe.headline) if _lookup(metrics, key) is not None]
    columns = [recipe.headline[i] for i in keep]
    rows = [(recipe.model, [_lookup(metrics, recipe.headline[i]) for i in keep])]
    for name, keys in recipe.baselines.items():
        values = [_lookup(metrics, keys[i]) for i in keep]
        if any(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            rows.append((name, values))
    return columns, rows


def _table(columns: list[str], rows: list[tuple[str, list[Any]]]) -> list[str]:
    """A plain-text table: a header, then a row per model, columns aligned."""
    cells = [["", *columns]] + [[name, *map(_number, values)] for name, values in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return ["  " + "  ".join(cell.ljust(width) if i == 0 else cell.rjust(width)
                             for i, (cell, width) in enumerate(zip(row, widths, strict=True))).rstrip()
            for row in cells]


def stopped_line(name: str, metrics: dict[str, Any]) -> str:
    """``trained gpt: 347 steps in 58 s of a 60 s budget, 63 s in all, 0.94M parameters``: the steps and seconds of
    the last progress line, then the run's seconds up to its metrics and its size."""
    budget = metrics.get("time_budget")
    seconds = metrics.get("run_seconds", metrics.get("wall_seconds", 0.0))
    out_of = f" of a {budget:g} s budget" if isinstance(budget, (int, float)) and not isinstance(budget, bool) else ""
    size = metrics.get("num_parameters", 0) / 1e6
    return (f"trained {name}: {metrics.get('step', '?')} steps in {seconds:.0f} s{out_of}, "
            f"{metrics.get('wall_seconds', 0.0):.0f} s in all, {size:.2f}M parameters")


def summary(recipe: Recipe, run_dir: Path, metrics: dict[str, Any], *, report_next: bool = False,
            time_budget: float | None = None) -> str:
    """The end of ``tokennet train``: where training stopped, the headline table, the sample (a language model's),
    where the run and its report are (``report_next``: the page is written right after this is printed).
    ``time_budget``: the run's setting, where its metrics do not say the budget training ran under."""
    lines = [stopped_line(recipe.name, {"time_budget": time_budget, **metrics})]  # the budget training ran under
    columns, rows = headline_rows(recipe, metrics)
    if columns:
        lines += ["", *_table(columns, rows)]
    else:
        scalars = [(k, v) for k, v in metrics.items() if k not in _NOT_RESULTS and isinstance(v, (int, float))
                   and not isinstance(v, bool)]
        if scalars:
            lines.append("  " + "  ".join(f"{k} {_number(v)}" for k, v in scalars))
    if isinstance(metrics.get("sample"), str):
        lines += ["", "--- sample ---", metrics["sample"].strip("\n"), "--- end of sample ---"]
    lines += ["", f"run directory: {run_dir}  (metrics.json has every metric)"]
    if report_next:
        lines.append(f"report: {run_dir / REPORT_FILE}  (being written)")
    elif (run_dir / REPORT_FILE).is_file():
        lines.append(f"report: {run_dir / REPORT_FILE}")
    return "\n".join(lines)
