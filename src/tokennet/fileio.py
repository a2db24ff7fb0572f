"""Small file helpers shared by every writer: nothing is ever left half-written."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_write_text", "sha256_file", "safetensors_write"]


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file, fsync and rename (atomic on POSIX)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)
    return path


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file, read in chunks (detects tampered or truncated weights)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def safetensors_write(path: str | Path) -> Iterator[None]:
    """Turn a safetensors write that fails in the OS (full disk, file-size limit) into the ``OSError`` it is.

    safetensors reports those as ``SafetensorError("... I/O error: ... (os error N)")``, which is not an
    ``OSError``; callers and the CLI treat disk trouble as an ``OSError`` (the user's to fix, not a bug).
    """
    from safetensors import SafetensorError

    try:
        yield
    except SafetensorError as e:
        m = re.search(r"\(os error (\d+)\)", str(e))
        if m is None:
            raise
        code = int(m.group(1))
        raise OSError(code, os.strerror(code), str(path)) from None
