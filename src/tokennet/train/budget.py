"""A run's clock and its time budget: the seconds a user waits, not only the seconds of training steps.

``--time-budget`` is the whole process's budget: from the command's start (imports, data preparation — clips
synthesized, a tokenizer trained, data cached —, building the model) through training to the final evaluation and
the report. :class:`RunClock` counts those seconds, a resumed run's earlier sessions included (its checkpoint
records them), and says when training must stop so that what follows it still fits: the budget minus the
``reserve`` kept for the final evaluation, and minus ``reserve_per_step`` for each step trained where what follows
training grows with the steps (``tokennet train vqa``'s CNN baselines train the transformer's steps after it).
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
        reserve_per_step: seconds more kept for each step trained, where what follows training repeats the run's
            steps (baselines trained on the same batches): a run of ``n`` steps stops training at
            ``budget - reserve - reserve_per_step * n``.
    """

    budget: float | None = None
    started: float = field(default_factory=time.perf_counter)
    earlier: float = 0.0
    reserve: float = 0.0
    reserve_per_step: float = 0.0

    def spent(self) -> float:
        """Seconds the run has spent so far: earlier sessions', and this process's since its command started."""
        return self.earlier + time.perf_counter() - self.started

    def this_process(self) -> float:
        """Seconds since this process's command started."""
        return time.perf_counter() - self.started

    def train_until(self, steps: int = 0) -> float | None:
        """The clock reading at which training stops once ``steps`` steps are trained (None: no budget): the
        budget minus the reserve and ``steps`` times the reserve per step."""
        return None if self.budget is None else self.budget - self.reserve - self.reserve_per_step * steps

    def left_for_training(self, steps: int = 0) -> float | None:
        """Seconds training may still take after ``steps`` steps (None: no budget; negative: none left)."""
        until = self.train_until(steps)
        return None if until is None else until - self.spent()

    def projected_stop(self, now: float, begun: float, steps: int, steps_begun: int = 0) -> float | None:
        """The clock reading at which training will stop, seen at ``now`` after ``steps`` steps (None: no budget).

        Without a reserve per step it is :meth:`train_until`. With one, each step trained moves the stop earlier,
        so the stop is where ``t + reserve_per_step · steps(t)`` meets ``budget - reserve``, ``steps(t)`` growing at
        the pace since training ``begun`` (``steps_begun`` steps then): ``now + (until(steps) - now) / (1 + p·r)``
        for ``p`` the reserve per step and ``r`` steps a second. The learning-rate schedule reads its progress from
        it, so a schedule that follows the clock still ends when training does."""
        until = self.train_until(steps)
        if until is None or self.reserve_per_step <= 0 or steps <= steps_begun or now <= begun:
            return until
        pace = (steps - steps_begun) / (now - begun)
        return now + (until - now) / (1.0 + self.reserve_per_step * pace)
