"""A run's clock and its time budget: the seconds a user waits, not only the seconds of training steps.

``--time-budget`` is the whole process's budget: from the command's start (imports, data preparation — clips
synthesized, a tokenizer trained, data cached —, building the model) through training to the final evaluation and
the report. :class:`RunClock` counts those seconds, a resumed run's earlier sessions included (its checkpoint
records them), and says when training must stop so that what follows it still fits: the budget minus the
``reserve`` kept for the final evaluation.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

__all__ = ["RunClock", "process_started"]

_IMPORTED = time.perf_counter()  # where the process's own start cannot be read: when this module was first imported


def process_started() -> float:
    """This process's start as a ``time.perf_counter()`` reading: what a command's clock starts from (the
    interpreter's start and the imports included). Read from ``/proc`` on Linux; elsewhere, when this module was
    first imported."""
    try:
        with open("/proc/self/stat") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22: start time, clock ticks after boot
        with open("/proc/uptime") as uptime:
            since_boot = float(uptime.read().split()[0])
        age = since_boot - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return _IMPORTED
    now = time.perf_counter()
    return now - age if 0 <= age < 86400 * 365 else _IMPORTED


@dataclass
class RunClock:
    """The seconds a run has spent, and when its training must stop.

    Args:
        budget: the run's time budget in seconds, whole processes (None: no limit).
        started: ``time.perf_counter()`` when this process's command started.
        earlier: seconds earlier sessions of the run spent (a resumed run: what its checkpoint recorded).
        reserve: seconds kept for what follows training (the final evaluation, the report).
    """

    budget: float | None = None
    started: float = field(default_factory=time.perf_counter)
    earlier: float = 0.0
    reserve: float = 0.0

    def spent(self) -> float:
        """Seconds the run has spent so far: earlier sessions', and this process's since its command started."""
        return self.earlier + time.perf_counter() - self.started

    def this_process(self) -> float:
        """Seconds since this process's command started."""
        return time.perf_counter() - self.started

    @property
    def train_until(self) -> float | None:
        """The clock reading at which training stops (None: no budget): the budget minus the reserve."""
        return None if self.budget is None else self.budget - self.reserve

    def left_for_training(self) -> float | None:
        """Seconds training may still take (None: no budget; negative: none left)."""
        until = self.train_until
        return None if until is None else until - self.spent()
