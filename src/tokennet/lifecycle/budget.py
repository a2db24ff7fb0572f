"""How the lifecycle fits a run into its time budget: what preparing it and finishing it cost on this machine.

``--time-budget`` counts the whole process (:class:`~tokennet.train.budget.RunClock`). Before anything is built,
a recipe that can measure what its data still needs (:attr:`~tokennet.lifecycle.recipe.Recipe.preparation`: clips
to synthesize, timed on a few) says so, and a budget that cannot hold it is refused in one line. Before training,
the seconds that follow it — the final evaluation, the saved run's evaluation, a sample, the report — are
reserved: as they were measured at the end of the last runs of the same recipe, data and settings on this machine
(the median of three, ``$TOKENNET_CACHE/timings.json``), or, the first time, from one evaluation measured now.
A job whose ``finish`` repeats the run's steps (:attr:`~tokennet.lifecycle.recipe.Job.finish_step_seconds`: the
``vqa`` recipe's CNN baselines) has its seconds per step kept apart (``finish_per_step``), so that every step
trained moves the end of training earlier by what it will cost after it, whatever number of steps a run takes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import jsonio
from ..errors import RecipeError
from ..fileio import atomic_write_text

__all__ = ["Preparation", "timings_key", "recorded", "record", "first_reserve", "check_preparation",
           "TIMINGS_FILE", "FINAL_EVALS", "FINAL_FIXED_SECONDS", "KEPT", "KEYS_KEPT"]

log = logging.getLogger(__name__)

TIMINGS_FILE = "timings.json"
# Settings that change how long a run trains, not what its preparation and final evaluation cost.
_NOT_IN_KEY = {"time_budget", "max_iters", "seed", "progress", "eval_interval", "checkpoint_interval", "log_interval",
               "keep_checkpoints", "target_val_loss", "warmup_iters", "tensorboard"}
# The first run of a recipe here reserves FINAL_EVALS evaluations (the trainer's last, the saved run's, the report's
# panel) and FINAL_FIXED_SECONDS (saving, a sample, drawing the report) for what follows training.
FINAL_EVALS = 3
FINAL_FIXED_SECONDS = 10.0
KEPT = 3  # the runs of one key whose median is the estimate
KEYS_KEPT = 200  # the most recent keys kept (a test session makes many)


@dataclass(frozen=True)
class Preparation:
    """What a run must still compute before its first step, and a measured estimate of how long it takes here.

    Args:
        what: a few words, e.g. ``synthesizing 13,920 clips with espeak-ng``.
        seconds: the estimate.
        measured: how it was measured, e.g. ``4 clips timed: 35 ms each, 2 workers``.
    """

    what: str
    seconds: float
    measured: str


def _cache_dir() -> Path:
    return Path(os.environ.get("TOKENNET_CACHE") or Path.home() / ".cache" / "tokennet")


def timings_key(recipe: str, data: str | None, settings: dict[str, Any]) -> str:
    """Which runs share timings: the recipe, the data and the settings that decide the data, the model and the
    evaluation (not the budget, the steps or the seed)."""
    kept = {k: v for k, v in sorted(settings.items()) if k not in _NOT_IN_KEY}
    blob = json.dumps({"recipe": recipe, "data": data, "settings": kept}, sort_keys=True, default=str)
    return f"{recipe}:{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def _read() -> dict[str, Any]:
    path = _cache_dir() / TIMINGS_FILE
    try:
        table = jsonio.loads(path.read_text(), what=str(path))
    except (OSError, ValueError):  # none yet, or unreadable: measured again
        return {}
    return table if isinstance(table, dict) else {}


def recorded(key: str) -> dict[str, float]:
    """What the runs with this key measured on this machine, as the next run's estimate: for each kind of seconds
    (``final``: what follows training; ``finish_per_step``: a finish's seconds per step trained) the median of the
    last :data:`KEPT` runs, so one run slowed by a busy machine does not decide the next one's budget alone; empty
    when none."""
    entry = _read().get(key)
    if not isinstance(entry, dict):
        return {}
    out = {}
    for kind, values in entry.items():
        values = values if isinstance(values, list) else [values]
        numbers = sorted(float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)
                         and 0 <= v < math.inf)
        if numbers and kind != "when":
            out[kind] = numbers[len(numbers) // 2]
    return out


def record(key: str, **seconds: float) -> None:
    """Add this run's measured seconds to those of the last runs with this key (the last :data:`KEPT` of each kind;
    the :data:`KEYS_KEPT` most recent keys); a cache that cannot be written is only a warning (the next run measures
    again)."""
    table = _read()
    entry = table.get(key) if isinstance(table.get(key), dict) else {}
    for kind, value in seconds.items():
        before = entry.get(kind) if isinstance(entry.get(kind), list) else []
        # four significant digits: to the hundredth of a second, a step's 45 ms was kept as 0.04 (11 % short)
        entry[kind] = [*before, float(f"{value:.4g}")][-KEPT:]
    entry["when"] = round(time.time())
    table[key] = entry
    recent = sorted(table, key=lambda k: table[k].get("when", 0) if isinstance(table[k], dict) else 0)[-KEYS_KEPT:]
    try:
        _cache_dir().mkdir(parents=True, exist_ok=True)
        atomic_write_text(_cache_dir() / TIMINGS_FILE, json.dumps({k: table[k] for k in recent}, indent=1,
                                                                  sort_keys=True))
    except OSError as err:
        log.warning("could not record the run's timings in %s: %s", _cache_dir() / TIMINGS_FILE, err)


def first_reserve(eval_seconds: float) -> float:
    """The seconds reserved after training by a run with no timings recorded here: from one measured evaluation."""
    return FINAL_EVALS * eval_seconds + FINAL_FIXED_SECONDS


def check_preparation(prep: Preparation | None, budget: float | None, final: float | None, flag: str) -> None:
    """Refuse, before anything is built, a budget that cannot hold the data's preparation (and the final
    evaluation, where a run here measured it): one line with the measured estimate."""
    if prep is None or budget is None:
        return
    need = prep.seconds + (final or 0.0)
    if need < budget:
        return
    then = f" and ~{final:.0f} s of final evaluation (the last run's here)" if final else ""
    raise RecipeError(f"{flag} {budget:g} s cannot hold this run's data preparation: {prep.what} takes "
                      f"~{prep.seconds:.0f} s here ({prep.measured}){then}; give a budget above ~{need + 30:.0f} s "
                      "once (the data is then cached), or no budget")
