"""Claim 15: the lecture's three predictions about the corner pairs, read from the learning curves that
``bench/vqa_receptive_field.py --curves --transformer generic --family field`` records for the lecture's generic
transformer, the ``vqa`` recipe's default, beside the recipe's own CNN baselines — one family that differs only in
field (``bench/results/vqa_field_curves.json``: an hour of training, five seeds).

*"Is the top right bird the same species as the bottom left bird? So can a CNN do this? Well, sure, if it's deep
enough, if the receptive fields are big enough, it can do it. But it might not be the best way ... this dye just
bleeds out slowly."* Three predictions, one verdict each (:func:`verdicts`), from exact match on the corner pairs
against the training examples seen, per model and seed:

- **(a) a field smaller than the corner distance stays at chance**: every CNN whose field is below
  :data:`CORNER_DISTANCE` ends at most :data:`AT_CHANCE` % (median over seeds; chance is 50 %);
- **(b) a field that covers both corners gets above chance, but needs more examples than the transformer**: every
  CNN whose field covers the picture (:data:`COVERS` px) ends above :data:`AT_CHANCE` %, and reaches
  :data:`GOAL` % later than the transformer (or not within the budget);
- **(c) the transformer gets there first**: it reaches :data:`GOAL` % in fewer examples than every CNN.

Examples to reach a level (:func:`examples_to`) are read from each seed's curve (the first evaluation at or above
it) and their median taken over seeds, a seed that never reaches it counting as later than any that does. A
prediction the measurements contradict is reported as not holding, with the measurement that contradicts it.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from ... import jsonio
from ._registry import Result, claim, plt, png
from .architectures import bench_results_dir

__all__ = ["FILE", "CORNER_DISTANCE", "COVERS", "AT_CHANCE", "GOAL", "examples_to", "median_examples",
           "median_interval", "summarize",
           "verdicts", "read_curves"]

FILE = "vqa_field_curves.json"
SCRIPT = ("vqa_receptive_field.py --curves --transformer generic --family field --fields 36 68 --seeds 0 1 2 3 4 "
          f"--jobs 2 --out bench/results/{FILE}")
# Two corner animals sit in 16-px cells 48 px apart (cell to cell): a square field narrower than that cannot hold
# both; one of the whole 64-px picture holds both cells entirely.
CORNER_DISTANCE = 48
COVERS = 64
AT_CHANCE = 55.0  # exact match (%) at or below which a model is at chance on the yes/no corner pairs (chance 50 %)
GOAL = 75.0  # the level "getting there" means (the goal for the covering CNN)
LEVELS = (75.0, 90.0)
KEY = "same_species"  # the corner pairs' template


def examples_to(curve: list[dict[str, Any]], level: float, key: str = KEY) -> int | None:
    """The training examples seen at the first evaluation of ``curve`` at or above ``level`` % (None: never)."""
    return next((point["examples"] for point in curve if point.get(key) is not None and point[key] >= level), None)


def median_examples(values: list[int | None]) -> float | None:
    """The median over seeds of examples to a level, a seed that never reached it counting as later than all (None:
    the median seed never reached it)."""
    ranked = sorted(values, key=lambda value: (value is None, value or 0))
    if not ranked:
        return None
    lower, upper = ranked[(len(ranked) - 1) // 2], ranked[len(ranked) // 2]
    return None if upper is None or lower is None else (lower + upper) / 2


def median_interval(values: list[int | None], coverage: float = 0.9) -> tuple[list[int | None], float]:
    """An interval for the median over seeds of examples to a level, from the order statistics alone (no
    assumption about their distribution): ``[x_(k), x_(n+1−k)]`` covers the true median with probability
    ``1 − 2·P(Binomial(n, ½) < k)``; the narrowest such interval with at least ``coverage``, or, with too few seeds
    for that (fewer than 5 for 90 %), the whole range. ``None`` in it: never reached. Returns ``([low, high],
    its coverage)``."""
    ranked = sorted(values, key=lambda value: (value is None, value or 0))
    n = len(ranked)
    if not n:
        return [None, None], 0.0

    def covers(k: int) -> float:
        return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n

    k = max((k for k in range(1, (n + 1) // 2 + 1) if covers(k) >= coverage), default=1)
    return [ranked[k - 1], ranked[n - k]], round(covers(k), 4)


def _model(row: dict[str, Any]) -> tuple[str, int]:
    return row.get("family", row["model"]), int(row["receptive_field"])


def summarize(rows: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    """Per ``(family, field)``: the seeds, the median final exact match on the corner pairs, and the median examples
    to each of :data:`LEVELS` on the curves, with an interval for it (``examples_to_<level>_interval``,
    :func:`median_interval`; its coverage ``interval_coverage``)."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(_model(row), []).append(row)
    out = {}
    for model, runs in groups.items():
        stats: dict[str, Any] = {"seeds": [run.get("seed") for run in runs],
                                 "final": statistics.median(run[KEY] for run in runs)}
        for level in LEVELS:
            reached = [examples_to(run["curve"], level) for run in runs]
            stats[f"examples_to_{level:g}"] = median_examples(reached)
            stats[f"examples_to_{level:g}_interval"], stats["interval_coverage"] = median_interval(reached)
        out[model] = stats
    return out


def _later(cnn: float | None, transformer: float | None) -> bool:
    """Whether a CNN reached the goal later than the transformer (None: not within the budget)."""
    return transformer is not None and (cnn is None or cnn > transformer)


def _fmt(examples: float | None) -> str:
    return "not reached" if examples is None else f"{examples:,.0f}"


def _reached(examples: float | None) -> str:
    return f"never reached {GOAL:g} %" if examples is None else f"reached {GOAL:g} % after {examples:,.0f} examples"


def verdicts(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The three predictions, each ``{"holds": bool | None, "measured": str}`` (None: nothing measured decides
    it), from a learning-curves record (its ``rows``, one per model, field and seed, each with its ``curve``)."""
    summary = summarize(record["rows"])
    goal = f"examples_to_{GOAL:g}"
    cnns = {model: stats for model, stats in summary.items() if model[0] != "transformer"}
    transformer = next((stats for model, stats in summary.items() if model[0] == "transformer"), None)
    small = {model: stats for model, stats in cnns.items() if model[1] < CORNER_DISTANCE}
    covering = {model: stats for model, stats in cnns.items() if model[1] >= COVERS}

    def name(model: tuple[str, int]) -> str:
        return f"{model[0]} CNN, {model[1]} px"

    out: dict[str, dict[str, Any]] = {}
    missed = [f"{name(m)} {stats['final']:.1f} %" for m, stats in small.items() if stats["final"] > AT_CHANCE]
    out["a"] = {"holds": (not missed) if small else None,
                "measured": (f"fields below {CORNER_DISTANCE} px: " + ", ".join(f"{name(m)} {stats['final']:.1f} %"
                                                                          for m, stats in small.items())
                             + (f"; above {AT_CHANCE:g} %: " + ", ".join(missed) if missed else ""))
                if small else f"no CNN with a field below {CORNER_DISTANCE} px was recorded"}
    t_goal = transformer[goal] if transformer else None
    if not covering or transformer is None:
        out["b"] = {"holds": None, "measured": f"no CNN with a field of {COVERS} px (or no transformer) was recorded"}
    else:
        above = {m: stats["final"] > AT_CHANCE for m, stats in covering.items()}
        later = {m: _later(stats[goal], t_goal) for m, stats in covering.items()}
        decided = t_goal is not None or not all(above.values())
        out["b"] = {"holds": (all(above.values()) and all(later.values())) if decided else None,
                    "measured": "; ".join(f"{name(m)}: {stats['final']:.1f} % at the end, {_reached(stats[goal])}"
                                          for m, stats in covering.items())
                    + f"; the transformer {_reached(t_goal)}" + ("" if decided else " (not decided)")}
    if transformer is None or not cnns:
        out["c"] = {"holds": None, "measured": "no transformer, or no CNN, was recorded"}
    else:
        first = t_goal is not None and all(_later(stats[goal], t_goal) for stats in cnns.values())
        soonest = min(cnns.items(), key=lambda item: (item[1][goal] is None, item[1][goal] or 0))
        out["c"] = {"holds": first, "measured": f"the transformer {_reached(t_goal)}; the soonest CNN "
                    f"({name(soonest[0])}) {_reached(soonest[1][goal])}"
                    + ("" if first else _depth(record["rows"], soonest[0]))}
    return out


def _depth(rows: list[dict[str, Any]], model: tuple[str, int]) -> str:
    """Why a CNN can get there first: how few layers its field took (the dye bleeds one kernel per layer at stride
    1, but a strided CNN doubles its field each layer), where the record says."""
    layers = [row.get("layers") for row in rows if _model(row) == model]
    if not layers or not all(isinstance(n, int) for n in layers):
        return ""
    return f" — its {model[1]}-px field is only {max(layers)} layers deep"


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_numbers(rows: list[dict[str, Any]]) -> None:
    """A ``TypeError`` unless every row's field, final figure and curve points are numbers."""
    for row in rows:
        points = [(point.get("examples"), point.get(KEY)) for point in row["curve"]]
        if not (_number(row["receptive_field"]) and _number(row[KEY])
                and all(_number(n) and (score is None or _number(score)) for n, score in points)):
            raise TypeError(f"a row of {row.get('family', row.get('model'))!r} holds something other than numbers")


def read_curves(path: Path) -> tuple[dict[str, Any] | None, str]:
    """The record at ``path`` and ``""``, or ``None`` and why it cannot be used."""
    if not path.is_file():
        return None, "not recorded"
    try:
        record = jsonio.load(path)
        rows = record["rows"]
        if not rows or not all(isinstance(row.get("curve"), list) for row in rows):
            return None, "not recorded: it holds no learning curves"
        _check_numbers(rows)
        summarize(rows)  # every row readable
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:  # JSONTooDeep is a ValueError
        return None, f"unreadable ({type(err).__name__}: {err})"
    return record, ""


def _figure(record: dict[str, Any]) -> bytes:
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(6.4, 3.6))
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in record["rows"]:
        groups.setdefault(_model(row), []).append(row)
    for i, (model, runs) in enumerate(sorted(groups.items())):
        for k, run in enumerate(runs):
            ax.plot([point["examples"] for point in run["curve"]], [point[KEY] for point in run["curve"]],
                    color=f"C{i % 10}", lw=1.2, alpha=0.8, label=f"{model[0]} ({model[1]} px)" if k == 0 else None)
    ax.axhline(50, color="grey", ls=":", lw=1, label="chance")
    ax.axhline(GOAL, color="grey", ls="--", lw=0.8)
    ax.set_xlabel("training examples seen")
    ax.set_ylabel("corner pairs, exact match (%)")
    ax.legend(fontsize=6.5)
    return png(fig)


def _table(record: dict[str, Any]) -> list[list[str]]:
    rows = [["model", "field (px)", "seeds", "final % (median)",
             *(f"examples to {level:g} % (median, interval)" for level in LEVELS)]]
    for model, stats in sorted(summarize(record["rows"]).items()):
        rows.append([model[0], str(model[1]), str(len(stats["seeds"])), f"{stats['final']:.1f}",
                     *(f"{_fmt(stats[f'examples_to_{level:g}'])} ({_span(stats, level)})" for level in LEVELS)])
    return rows


def _span(stats: dict[str, Any], level: float) -> str:
    low, high = stats[f"examples_to_{level:g}_interval"]
    return f"{_fmt(low)} – {_fmt(high)}, {100 * stats['interval_coverage']:.0f} %"


@claim("receptive-field", "15")
def claim_corner_pairs(seed: int = 0, *, results_dir: Path | None = None) -> Result:
    """"is the top right bird the same species as the bottom left bird? So can a CNN do this? Well, sure, if it's
    deep enough, if the receptive fields are big enough, it can do it. But it might not be the best way ... this dye
    just bleeds out slowly in convolutional networks."

    Three predictions, one verdict each: (a) a field smaller than the corner distance stays at chance; (b) a field
    that covers both corners gets above chance but needs more examples than the transformer; (c) the transformer
    gets there first. Read from the learning curves the bench records (minutes of training).
    """
    results = results_dir if results_dir is not None else bench_results_dir()
    path = results / FILE if results is not None else None
    record, why = read_curves(path) if path is not None else (None, "not recorded")
    if record is None:
        return Result(f"{why}: run python bench/{SCRIPT}", "not measured here", None,
                      data={"file": f"bench/results/{FILE}"})
    found = verdicts(record)
    holds_all = [v["holds"] for v in found.values()]
    holds = False if False in holds_all else (None if None in holds_all else True)
    labels = {"a": "(a) small field at chance", "b": "(b) covering field above chance, later",
              "c": "(c) transformer first"}
    measured = "; ".join(f"{labels[k]}: {_verdict_word(v['holds'])} — {v['measured']}" for k, v in found.items())
    machine = record.get("machine", "unknown")
    machine = machine if isinstance(machine, str) else json.dumps(machine, sort_keys=True)
    commit = str(record.get("commit", "unknown"))
    return Result(f"corner pairs against training examples, per model and seed ({record.get('command', '?')})",
                  measured, holds, _figure(record),
                  {"file": f"bench/results/{FILE}", "verdicts": found, "commit": commit, "machine": machine},
                  f"from bench/results/{FILE}, measured at commit {commit[:12]}", table=_table(record))


def _verdict_word(holds: bool | None) -> str:
    return {True: "holds", False: "does not hold", None: "not decided"}[holds]
