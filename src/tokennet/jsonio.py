"""JSON read with one bound on nesting, for every file and request body tokennet reads.

Python's ``json`` decoder recurses once per ``[`` or ``{``: a body nested some thousands of levels deep
(a few kilobytes) ends in ``RecursionError`` inside the parser, or later in whatever walks the result (a
JSON schema compiler, a tool-call validator). Nothing tokennet reads — a run's files, a graph, a chat, an
OpenAI request — needs more than a few levels, so every reader goes through :func:`loads` (or
:func:`load`), which counts the depth first, in one linear pass that does not recurse, and refuses a
document deeper than :data:`MAX_JSON_DEPTH` with one :class:`JSONTooDeep` line.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from .errors import DataError

__all__ = ["MAX_JSON_DEPTH", "JSONTooDeep", "json_depth", "loads", "load"]

MAX_JSON_DEPTH = 128
"""The deepest nesting of arrays and objects any JSON document tokennet reads may have (a JSON schema for
structured output uses a dozen levels; a run's files three or four)."""

# A JSON string: everything between two unescaped quotes (its brackets are not structure).
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)  # unrolled: linear, no backtracking
_OPEN = np.zeros(256, dtype=np.int8)
_OPEN[[ord("["), ord("{")]] = 1
_OPEN[[ord("]"), ord("}")]] = -1


class JSONTooDeep(DataError):
    """A JSON document nested deeper than :data:`MAX_JSON_DEPTH` (a ``ValueError``, like a parse error)."""


def json_depth(text: str | bytes) -> int:
    """The deepest nesting of ``[`` and ``{`` in ``text``, brackets inside strings not counted: one pass of a
    regular expression and a cumulative sum, no recursion, so any input of any depth is measured."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", errors="replace")
    skeleton = _STRING.sub("", text).encode("utf-8", errors="replace")
    if not skeleton:
        return 0
    steps = _OPEN[np.frombuffer(skeleton, dtype=np.uint8)]
    return int(np.cumsum(steps, dtype=np.int64).max(initial=0))


def loads(text: str | bytes, *, what: str = "JSON", max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads(text)``, refused first with :class:`JSONTooDeep` (naming ``what``) where the document is
    nested deeper than ``max_depth``. Parse errors stay ``json.JSONDecodeError`` (a ``ValueError``)."""
    depth = json_depth(text)
    if depth > max_depth:
        raise JSONTooDeep(f"{what}: JSON nested {depth} levels deep; at most {max_depth} are accepted")
    return json.loads(text)


def load(path: str | Path, *, what: str | None = None, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Read and parse the JSON file at ``path`` through :func:`loads` (``what`` defaults to the path)."""
    path = Path(path)
    return loads(path.read_text(encoding="utf-8"), what=what or str(path), max_depth=max_depth)
