"""Progress of a phase that may take more than a few seconds: a bar on a terminal, a plain line in a log.

Training shows its own steps (:mod:`tokennet.train.trainer`); everything else that can make a user wait —
synthesizing clips, training a tokenizer, the final evaluation, ``tokennet eval`` — runs inside :func:`phase`, so
nothing is silent for long: on a terminal (stderr is a TTY) a tqdm bar whose elapsed time moves every second, in a
log file one line every :data:`LINE_SECONDS` (``preparing the data · 12 s``; ``· 340/3,360 clips`` where the phase
counts). Code deep inside a phase advances it without holding it: :func:`advance` moves the innermost open phase
(nothing happens where none is open), so a dataset module needs no argument threaded down to it.

    with phase("synthesizing clips", total=len(jobs), unit="clips"):
        for job in jobs:
            ...
            advance()
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["phase", "advance", "Phase", "LINE_SECONDS"]

log = logging.getLogger("tokennet.progress")

LINE_SECONDS = 5.0  # without a terminal, one line at most this often
QUIET_SECONDS = 3.0  # a phase shorter than this shows nothing

_open: list[Phase] = []  # the phases open now, innermost last
_lock = threading.Lock()


class Phase:
    """One phase being shown: its name, its count (``total`` when known) and the clock it started on."""

    def __init__(self, what: str, total: int | None, unit: str, bar: bool | None):
        self.what, self.total, self.unit = what, total, unit
        self.done = 0
        self.started = time.perf_counter()
        self._bar_wanted = sys.stderr.isatty() if bar is None else bar
        self._bar = None
        self._lines = 0  # plain lines written
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name=f"tokennet-progress-{what}", daemon=True)

    # -- what the phase's code calls -----------------------------------------------------------------------
    def advance(self, n: int = 1, total: int | None = None) -> None:
        """Count ``n`` more items done (and set the total, when it is known only now)."""
        with _lock:
            if total is not None:
                self.total = total
                if self._bar is not None:
                    self._bar.total = total
            self.done += n
            if self._bar is not None:
                self._bar.update(n)

    def seconds(self) -> float:
        return time.perf_counter() - self.started

    def line(self) -> str:
        """``preparing the data · 12 s · 340/3,360 clips``: what a log file shows."""
        count = ""
        if self.total:
            count = f" · {self.done:,}/{self.total:,} {self.unit}"
        elif self.done:
            count = f" · {self.done:,} {self.unit}"
        return f"{self.what} · {self.seconds():.0f} s{count}"

    # -- showing it --------------------------------------------------------------------------------------
    def _tick(self) -> None:
        """Every second: after :data:`QUIET_SECONDS`, open the bar (a terminal) and refresh it, or write a line
        every :data:`LINE_SECONDS`."""
        next_line = QUIET_SECONDS
        while not self._stop.wait(1.0):
            elapsed = self.seconds()
            if elapsed < QUIET_SECONDS:
                continue
            with _lock:
                if self._bar_wanted:
                    if self._bar is None:
                        from tqdm.auto import tqdm

                        self._bar = tqdm(total=self.total, initial=self.done, desc=self.what, unit=f" {self.unit}",
                                         leave=False, dynamic_ncols=True)
                    self._bar.refresh()
                elif elapsed >= next_line:
                    log.info("%s", self.line())
                    self._lines += 1
                    next_line = elapsed + LINE_SECONDS

    def _start(self) -> None:
        self._ticker.start()

    def _end(self, failed: bool) -> None:
        self._stop.set()
        self._ticker.join()
        with _lock:
            if self._bar is not None:
                self._bar.close()
            shown = self._bar is not None or self._lines > 0
        if shown and not failed:  # the phase was shown while it ran: say how long it took, once
            log.info("%s: done in %.0f s", self.what, self.seconds())


@contextmanager
def phase(what: str, total: int | None = None, unit: str = "items", *, bar: bool | None = None) -> Iterator[Phase]:
    """Show ``what`` while the ``with`` block runs, once it has taken :data:`QUIET_SECONDS`: a tqdm bar on a
    terminal, a log line every :data:`LINE_SECONDS` otherwise, and ``what: done in N s`` at the end of a phase that
    was shown. ``total`` and ``unit``: what :func:`advance` counts (the bar shows a count, the lines ``done/total``).

    Args:
        bar: a bar (True) or lines (False); None: a bar when stderr is a terminal.
    """
    shown = Phase(what, total, unit, bar)
    with _lock:
        _open.append(shown)
    shown._start()
    failed = True
    try:
        yield shown
        failed = False
    finally:
        with _lock:
            _open.remove(shown)
        shown._end(failed)


def advance(n: int = 1, total: int | None = None) -> None:
    """Advance the innermost open phase by ``n`` (its ``total`` set where given); nothing where no phase is open."""
    with _lock:
        current = _open[-1] if _open else None
    if current is not None:
        current.advance(n, total)
