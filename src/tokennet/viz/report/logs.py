"""Read ``log.jsonl`` for the report: training records, evaluation records, and the lines that did not parse.

The trainer appends two kinds of record (see :mod:`tokennet.train.trainer`):

- a *training* record every ``log_interval`` steps: ``step, loss, lr, elapsed, items_per_s, grad_norm``;
- an *evaluation* record every ``eval_interval`` steps and at the end: ``step, elapsed, wall,
  train_loss`` and the recipe's metrics (``val_loss``, ``test_accuracy``, ...).

A resumed run appends again from its checkpoint's step, so records past that step that the
interrupted process had written are replaced by the new ones (the curve shows the run that counts).
A line that is not a JSON object with an integer ``step`` is skipped and counted, never fatal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ... import jsonio

__all__ = ["LogData", "read_log"]


@dataclass
class LogData:
    """What ``log.jsonl`` holds. ``exists`` is False while training has not logged anything."""

    exists: bool = False
    train: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)  # 1-based numbers of the lines that did not parse

    @property
    def empty(self) -> bool:
        return not (self.train or self.evals)

    def series(self, kind: str, key: str, x: str = "step") -> tuple[list[float], list[float]]:
        """``(xs, ys)`` of a numeric field over the training (``kind="train"``) or evaluation records."""
        recs = self.train if kind == "train" else self.evals
        pts = [(rec[x], rec[key]) for rec in recs if _number(rec.get(x)) and _number(rec.get(key))]
        return [float(x_value) for x_value, _ in pts], [float(y_value) for _, y_value in pts]

    def eval_keys(self) -> list[str]:
        """The numeric metrics the evaluation records carry (besides step and timing)."""
        keys: dict[str, None] = {}
        for rec in self.evals:
            for key, value in rec.items():
                if key not in ("step", "elapsed", "wall") and _number(value):
                    keys[key] = None
        return list(keys)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _append(records: list[dict[str, Any]], rec: dict[str, Any]) -> None:
    # A resumed run restarts at its checkpoint: drop what the interrupted process logged past that step.
    while records and records[-1]["step"] >= rec["step"]:
        records.pop()
    records.append(rec)


def read_log(path: str | Path) -> LogData:
    """Parse ``log.jsonl`` (a missing file gives ``LogData(exists=False)``)."""
    path = Path(path)
    data = LogData()
    if not path.is_file():
        return data
    data.exists = True
    with open(path, "rb") as lines:
        for n, raw in enumerate(lines, 1):
            if not raw.strip():
                continue
            try:
                rec = jsonio.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError, jsonio.JSONTooDeep):
                data.skipped.append(n)
                continue
            if not isinstance(rec, dict) or not isinstance(rec.get("step"), int) or isinstance(rec["step"], bool):
                data.skipped.append(n)
                continue
            _append(data.train if "loss" in rec else data.evals, rec)
    return data
