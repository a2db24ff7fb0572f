"""`tokennet generate` writes its notes (stderr) between lines of its text (stdout), never inside one: a note logged
while a line is unfinished waits for the line's end, even when both streams go to one terminal."""

from __future__ import annotations

import io
import logging
import sys

from tokennet import cli


def test_a_note_logged_mid_line_waits_for_the_line_to_end(monkeypatch):
    terminal = io.StringIO()  # stdout and stderr on one terminal
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr(sys, "stderr", terminal)
    root = logging.getLogger()
    handler = cli._StderrHandler()
    monkeypatch.setattr(root, "handlers", [handler])
    log = logging.getLogger("tokennet.test_cli_notes")
    log.setLevel(logging.INFO)
    with cli._notes_between_lines() as wrote:
        log.info("before the first token")
        for piece in ["ROMEO:", "e mh", "not\n", "second"]:
            terminal.write(piece)
            wrote(piece)
            log.info("note after %r", piece)
        terminal.write("\n")
        wrote("\n")
    assert terminal.getvalue().splitlines() == [
        "before the first token", "ROMEO:e mhnot", "note after 'ROMEO:'", "note after 'e mh'", "note after 'not\\n'",
        "second", "note after 'second'"]
    assert handler.filters == []


def test_notes_held_at_an_error_mid_line_come_out_on_a_line_of_their_own(monkeypatch):
    terminal = io.StringIO()
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(logging.getLogger(), "handlers", [cli._StderrHandler()])
    log = logging.getLogger("tokennet.test_cli_notes")
    log.setLevel(logging.INFO)
    try:
        with cli._notes_between_lines() as wrote:
            terminal.write("half a line")
            wrote("half a line")
            log.info("held")
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert terminal.getvalue() == "half a line\nheld\n"
