"""Small file helpers shared by every writer: nothing is ever left half-written, and nothing is left behind.

Every temporary name a writer uses beside its destination ``NAME`` is ``.NAME.TAG-PID-XXXXXX``
(:func:`temp_name_beside`): hidden, tagged with what it is (``tmp`` a file being written, ``new`` a directory
being built, ``old`` a replaced one on its way out) and with the writing process's id. A writer killed before it
could clean up leaves such a sibling; the next writer of the same destination removes every one whose process is
gone (:func:`sweep_stale_temps`), so a crash leaves nothing behind for longer than until the next write.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

__all__ = ["atomic_write_text", "atomic_directory", "sha256_file", "safetensors_write", "exchange_paths",
           "swap_into_place", "remove_aside", "fsync_path", "temp_dir_beside", "temp_name_beside", "sweep_stale_temps"]

_TEMP_TAGS = ("tmp", "new", "old", "import")  # what a temporary sibling is: see the module docstring


def temp_name_beside(dest: str | Path, tag: str = "tmp") -> Path:
    """A fresh hidden name ``.NAME.TAG-PID-XXXXXX`` beside ``dest`` (same directory, so it can be renamed into
    place), after sweeping away what dead writers of ``dest`` left (:func:`sweep_stale_temps`)."""
    if tag not in _TEMP_TAGS:
        raise ValueError(f"temporary tag must be one of {_TEMP_TAGS}, got {tag!r}")
    dest = Path(dest)
    sweep_stale_temps(dest)
    return dest.with_name(f".{dest.name}.{tag}-{os.getpid()}-{os.urandom(3).hex()}")


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # another user's process: alive, not ours to judge
    return True


def sweep_stale_temps(dest: str | Path) -> list[Path]:
    """Remove the temporary siblings of ``dest`` (``.NAME.TAG-PID…``, :func:`temp_name_beside`'s names and the
    older ``.NAME.tmp-PID``) whose writing process no longer runs; return what was removed. A live writer's
    siblings — this process's included — are left alone, whatever their age."""
    import shutil

    dest = Path(dest)
    pattern = re.compile(rf"^\.{re.escape(dest.name)}\.(?:{'|'.join(_TEMP_TAGS)})-(\d+)(?:-[0-9a-z_]+)?$")
    removed = []
    try:
        siblings = list(dest.parent.iterdir())
    except OSError:
        return removed
    for sibling in siblings:
        match = pattern.match(sibling.name)
        if match is None or _process_alive(int(match.group(1))):
            continue
        with contextlib.suppress(OSError):
            if sibling.is_dir() and not sibling.is_symlink():
                shutil.rmtree(sibling)
            else:
                sibling.unlink()
            removed.append(sibling)
    return removed


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "wb", **options) -> Iterator[IO]:
    """Open a temporary sibling of ``path`` for writing (:func:`temp_name_beside`); when the block ends cleanly the
    file is flushed, fsynced and renamed onto ``path`` (atomic on POSIX), and on an error it is removed: a reader
    of ``path`` sees the old file or the new one whole, never half of one."""
    path = Path(path)
    tmp = temp_name_beside(path, "tmp")
    try:
        with open(tmp, mode, **options) as stream:
            yield stream
            stream.flush()
            os.fsync(stream.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)


def atomic_write_text(path: str | Path, text: str | Iterable[str]) -> Path:
    """Write ``text`` (a string, or its pieces in order: a large JSON file written as it is encoded, never whole
    in memory) to ``path`` through a temporary file, fsync and rename (atomic on POSIX)."""
    with atomic_open(path, "w", encoding="utf-8") as stream:
        if isinstance(text, str):
            stream.write(text)
        else:
            stream.writelines(text)
    return Path(path)


_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def exchange_paths(a: str | Path, b: str | Path) -> bool:
    """Swap two existing paths in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``): at no moment is either
    name missing. False, with nothing changed, where the OS or the filesystem cannot (the caller then falls back
    on two renames); any other failure raises ``OSError``."""
    import ctypes
    import errno

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)):
        return False
    raise OSError(err, os.strerror(err), str(b))


def swap_into_place(new: str | Path, dest: str | Path) -> Path | None:
    """Put ``new`` (a file or directory, on ``dest``'s filesystem) at ``dest``; return where the old ``dest`` now is
    (a hidden sibling ``.NAME.old-PID-XXXXXX`` for the caller to delete), or None when there was none.

    Crash story: the old ``dest`` and ``new`` trade names in one atomic step (:func:`exchange_paths`), so a
    crash leaves ``dest`` either the old one or the new one, whole, and at most a hidden sibling behind. Where
    the filesystem cannot exchange, the old ``dest`` is renamed to the trash name first and ``new`` renamed
    after it: a crash between the two leaves no ``dest`` and the old one, whole, at ``.NAME.old-PID-XXXXXX``.
    """
    new, dest = Path(new), Path(dest)
    if not dest.exists() and not dest.is_symlink():
        new.rename(dest)
        return None
    trash = temp_name_beside(dest, "old")
    if exchange_paths(new, dest):
        try:
            new.rename(trash)  # the old one, now at the new one's temporary name
        except OSError:
            return new  # the swap is done; the old one stays at the temporary name
    else:
        dest.rename(trash)
        try:
            new.rename(dest)
        except BaseException:
            with contextlib.suppress(OSError):
                trash.rename(dest)  # put the old one back where it was
            raise
    return trash


def temp_dir_beside(dest: str | Path, tag: str = "new") -> Path:
    """A new, empty directory ``.NAME.TAG-PID-XXXXXX`` beside ``dest`` (same filesystem: it can be renamed into
    place), with the permissions of an ordinary directory (``mkdtemp`` makes it private)."""
    import tempfile

    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_temps(dest)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.{tag}-{os.getpid()}-", dir=dest.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)
    return tmp


def fsync_path(path: str | Path) -> None:
    """Flush a file, or a directory (so that a rename in it survives a power cut), to the disk; a filesystem that
    cannot fsync a directory is left as it is (the rename is atomic all the same)."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def remove_aside(path: str | Path, trash: str | Path | None = None) -> bool:
    """Delete a directory (or a file) without ever leaving half of it under its own name; False when ``path``
    could not be moved (it is gone already).

    ``rmtree`` unlinks file by file, so a kill in the middle would leave ``path`` without some of its files;
    renaming it out of the way first (atomic) — to ``trash``, by default a hidden sibling ``.NAME.old-PID-XXXXXX``
    (:func:`temp_name_beside`) — means ``path`` is either whole or gone, and a kill after the rename leaves only
    the hidden sibling.
    """
    import shutil

    path = Path(path)
    trash = temp_name_beside(path, "old") if trash is None else Path(trash)
    try:
        path.rename(trash)
    except OSError:
        return False
    if trash.is_dir() and not trash.is_symlink():
        shutil.rmtree(trash, ignore_errors=True)
    else:
        trash.unlink(missing_ok=True)
    return True


@contextlib.contextmanager
def atomic_directory(dest: str | Path) -> Iterator[Path]:
    """A new directory beside ``dest`` (:func:`temp_dir_beside`) for the block to write; when the block ends, every
    file in it and the directory itself are fsynced and it takes ``dest``'s place (:func:`swap_into_place`, the old
    ``dest`` deleted). A block that raises (a full disk, a kill signal) leaves ``dest`` as it was and nothing beside
    it: a crash at any moment leaves the old ``dest`` or the new one, whole, never half of one."""
    import shutil

    dest = Path(dest)
    tmp = temp_dir_beside(dest, "new")
    try:
        yield tmp
        for entry in tmp.iterdir():
            fsync_path(entry)
        fsync_path(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        trash = swap_into_place(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_path(dest.parent)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file, read in chunks (detects tampered or truncated weights)."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while block := stream.read(chunk):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def safetensors_write(path: str | Path) -> Iterator[None]:
    """Turn a safetensors write that fails in the OS (full disk, file-size limit) into the ``OSError`` it is.

    safetensors reports those as ``SafetensorError("... I/O error: ... (os error N)")``, which is not an
    ``OSError``; callers and the CLI treat disk trouble as an ``OSError`` (the user's to fix, not a bug).
    """
    from safetensors import SafetensorError

    try:
        yield
    except SafetensorError as error:
        match = re.search(r"\(os error (\d+)\)", str(error))
        if match is None:
            raise
        code = int(match.group(1))
        raise OSError(code, os.strerror(code), str(path)) from None
