"""A long phase is never silent: in a log, a line every few seconds (with its count where it counts) and how long
it took; a short one shows nothing; code deep inside advances the innermost phase without holding it."""

import logging
import time

import pytest

from tokennet import progress


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(progress, "QUIET_SECONDS", 0.0)
    monkeypatch.setattr(progress, "LINE_SECONDS", 0.5)


def test_a_long_phase_writes_lines_with_its_count(fast, caplog):
    with caplog.at_level(logging.INFO, logger="tokennet.progress"):
        with progress.phase("synthesizing 4 clips", total=4, unit="clips", bar=False):
            for _ in range(4):
                progress.advance()
            time.sleep(1.3)  # the ticker wakes every second
    assert any(m.startswith("synthesizing 4 clips · ") and m.endswith(" · 4/4 clips") for m in caplog.messages)
    assert caplog.messages[-1].startswith("synthesizing 4 clips: done in ")


def test_a_short_phase_shows_nothing_and_advance_outside_a_phase_is_harmless(caplog):
    progress.advance()  # no phase open: nothing to count
    with caplog.at_level(logging.INFO, logger="tokennet.progress"):
        with progress.phase("quick", bar=False) as shown:
            progress.advance(3)
    assert shown.done == 3 and caplog.messages == []


def test_advance_reaches_the_innermost_phase(fast):
    with progress.phase("outer", bar=False) as outer:
        with progress.phase("inner", total=2, bar=False) as inner:
            progress.advance(2)
        progress.advance()
    assert (inner.done, outer.done) == (2, 1)
