"""How the lifecycle fits a run into its time budget: what preparing it and finishing it cost on this machine.

``--time-budget`` counts the whole process (:class:`~tokennet.train.budget.RunClock`). Before anything is built,
a recipe that can measure what its data still needs (:attr:`~tokennet.lifecycle.recipe.Recipe.preparation`: clips
to synthesize, timed on a few) says so, and a budget that cannot hold it is refused in one line. Before training,
the seconds that follow it — the final evaluation, the saved run's evaluation, a sample, the report — are
reserved: as they were measured at the end of the last runs of the same recipe, data and settings on this machine
(the median of three, ``$TOKENNET_CACHE/timings.json``), or, the first time, from one evaluation measured now.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import jsonio
from ..errors import RecipeError
from ..fileio import atomic_write_text

__all__ = ["Preparation", "timings_key", "recorded", "record", "first_reserve", "check_preparation",
           "TIMINGS_FILE", "FINAL_EVALS", "FINAL_FIXED_SECONDS"]

log = logging.getLogger(__name__)

TIMINGS_FILE = "timings.json"
# Settings that change how long a run trains, not what its preparation and final evaluation cost.
_NOT_IN_KEY = {"time_budget", "max_iters", "seed", "progress", "eval_interval", "checkpoint_interval", "log_interval",
               "keep_checkpoints", "target_val_loss", "warmup_iters", "tensorboard"}
# The first run of a recipe here reserves FINAL_EVALS evaluations (the trainer's last, the saved run's, the report's
# panel) and FINAL_FIXED_SECONDS (saving, a sample, drawing the report) for what follows training.
FINAL_EVALS = 3
FINAL_FIXED_SECONDS = 10.0


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
    """The seconds measured at the last run with this key on this machine (``final``: what follows training,
    ``prepare``: from the command's start to the first step); empty when none."""
    entry = _read().get(key)
    if not isinstance(entry, dict):
        return {}
    return {k: float(v) for k, v in entry.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
            and v >= 0}


def record(key: str, **seconds: float) -> None:
    """Remember this run's measured seconds for the next run with this key; a cache that cannot be written is
    only a warning (the next run measures again)."""
    table = _read()
    table[key] = {**(table.get(key) if isinstance(table.get(key), dict) else {}),
                  **{k: round(v, 2) for k, v in seconds.items()}, "when": round(time.time())}
    try:
        _cache_dir().mkdir(parents=True, exist_ok=True)
        atomic_write_text(_cache_dir() / TIMINGS_FILE, json.dumps(table, indent=1, sort_keys=True))
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
