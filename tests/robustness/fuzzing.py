"""Mutations of valid seed files and the one check every reader must pass (used by the tests in this directory).

A mutation takes a valid file's bytes and damages them the ways a disk, a download or a hand edit does:
cut at a random offset, random bits flipped, garbage appended, a run of bytes overwritten, or a little-endian
length field inflated (a 4- or 8-byte integer set to something huge — the classic "declared count" attack on a
binary header). ``hot`` bounds where offsets fall most of the time: the header, where a flip changes the
structure rather than one weight.

:func:`check_reader` runs a reader on a damaged file and holds it to the contract: it returns, or raises a
:class:`~tokennet.errors.TokennetError` whose message is one non-empty line; anything else is a bug. It also
holds the file unchanged (its SHA-256 before and after) and bounds the time (``signal.alarm``: a reader that
loops on a declared count fails the test instead of hanging it).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import signal
import struct
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tokennet.errors import TokennetError

# Reproducible and fast: the same examples on every run (derandomize), no per-example deadline (the first call of a
# reader imports its libraries), no example database written into the tree. TOKENNET_FUZZ_EXAMPLES=1000 searches
# harder (and, with TOKENNET_FUZZ_RANDOM=1, differently on each run) when a reader changes.
FUZZ = settings(max_examples=int(os.environ.get("TOKENNET_FUZZ_EXAMPLES", "30")),
                derandomize=not os.environ.get("TOKENNET_FUZZ_RANDOM"), deadline=None, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])

HUGE = (2**31 - 1, 2**32 - 1, 2**40, 2**62, 2**64 - 1)


class Damaged:
    """A damaged file's bytes and how they were damaged; its repr is short (a falsifying example prints it)."""

    def __init__(self, kind: str, data: bytes):
        self.kind, self.data = kind, data

    def __repr__(self) -> str:
        return f"Damaged({self.kind!r}, {len(self.data)} bytes, sha256 {hashlib.sha256(self.data).hexdigest()[:16]}, " \
               f"starts {self.data[:48]!r})"


def _offset(draw, n: int, hot: int | None) -> int:
    if n <= 1:
        return 0
    if hot and draw(st.integers(0, 3)):  # three times in four: inside the header
        return draw(st.integers(0, min(hot, n) - 1))
    return draw(st.integers(0, n - 1))


@st.composite
def mutated(draw, seed: bytes, hot: int | None = None) -> Damaged:
    """``seed`` truncated, bit-flipped, extended, overwritten or with a length field inflated."""
    n = len(seed)
    kind = draw(st.sampled_from(["truncate", "flip", "append", "overwrite", "inflate", "flip+truncate"]))
    data = bytearray(seed)
    if kind in ("flip", "flip+truncate"):
        for _ in range(draw(st.integers(1, 8))):
            i = _offset(draw, n, hot)
            data[i] ^= 1 << draw(st.integers(0, 7))
    if kind in ("truncate", "flip+truncate"):
        cut = _offset(draw, n, hot)
        data = data[:cut]
    elif kind == "append":
        data += draw(st.binary(min_size=1, max_size=64))
    elif kind == "overwrite":
        i = _offset(draw, n, hot)
        data[i:i + 8] = draw(st.sampled_from([b"\x00" * 8, b"\xff" * 8, b"\x7f" * 8])) + draw(st.binary(max_size=4))
    elif kind == "inflate":
        width, fmt = draw(st.sampled_from([(4, "<I"), (8, "<Q")]))
        i = min(_offset(draw, n, hot), max(n - width, 0))
        value = draw(st.sampled_from(HUGE)) & ((1 << (8 * width)) - 1)
        data[i:i + width] = struct.pack(fmt, value)
    return Damaged(kind, bytes(data))


def _json_values(leaf_text: bool = True):
    leaves = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=8)
    return st.recursive(leaves, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
                        max_leaves=12)


@st.composite
def mutated_json(draw, seed: object) -> Damaged:
    """A JSON document with one value replaced (anywhere in the tree) by a random JSON value, a key dropped, or a
    deeply nested list (its text's bytes)."""
    doc = json.loads(json.dumps(seed))
    kind = draw(st.sampled_from(["replace", "drop", "nest"]))
    if kind == "nest":
        depth = draw(st.sampled_from([1000, 100_000]))
        return Damaged(kind, ("[" * depth + "]" * depth).encode())
    # collect the paths into the tree, then pick one
    paths: list[tuple] = []

    def walk(x, path):
        paths.append(path)
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, (*path, k))
        elif isinstance(x, list):
            for i, v in enumerate(x[:20]):  # long lists (a vocabulary): the first entries stand for the rest
                walk(v, (*path, i))

    walk(doc, ())
    path = draw(st.sampled_from(paths))
    if not path:
        return Damaged(kind, json.dumps(draw(_json_values())).encode())
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    if kind == "drop" and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw(_json_values())
    return Damaged(kind, json.dumps(doc, allow_nan=True).encode())


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Hang(Exception):
    """A reader ran past the time :func:`check_reader` allows it."""


@contextlib.contextmanager
def time_limit(seconds: int):
    def fire(signum, frame):
        raise Hang(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def check_reader(read, *files: Path, seconds: int = 20):
    """Run ``read()``; it returns, or raises a TokennetError of one line. The ``files`` stay byte for byte the same.

    Returns what ``read`` returned, or the TokennetError it raised.
    """
    before = {f: sha256(f) for f in files}
    try:
        with time_limit(seconds):
            out = read()
    except TokennetError as e:
        msg = str(e).strip()
        assert msg and "\n" not in msg, f"a TokennetError of more than one line: {msg!r}"
        out = e
    for f, h in before.items():
        assert sha256(f) == h, f"{f} was changed by reading it"
    return out


def check_cli(argv: list[str], *files: Path, seconds: int = 60) -> tuple[int, str]:
    """``tokennet ARGV`` in this process: exit 0, or exit 2 with one line on stderr (``tokennet: error: …``); an
    exception out of ``main`` (what prints a traceback) fails. The ``files`` stay the same. Returns (code, stderr)."""
    from tokennet.cli import main

    before = {f: sha256(f) for f in files}
    err, out = io.StringIO(), io.StringIO()
    with time_limit(seconds), contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(argv)
    text = err.getvalue().strip()
    assert code in (0, 2), (code, text)
    if code == 2:
        assert text.startswith("tokennet: error: ") and "\n" not in text and "Traceback" not in text, text
    for f, h in before.items():
        assert sha256(f) == h, f"{f} was changed by reading it"
    return code, text
