"""A run is an object: this module owns the run directory, its files and their names.

A run directory, as ``tokennet train`` writes it::

    run.json            recipe, model preset, data, data spec, settings  (RUN_FILE)
    config.json         the model's config + weights checksum           (models.registry)
    model.safetensors   the final weights                               (models.registry)
    tokenizer.json      text models only                                (TOKENIZER_FILE)
    metrics.json        the final metrics                               (METRICS_FILE)
    log.jsonl           one JSON record per log/eval step               (LOG_FILE)
    checkpoints/        crash-safe checkpoints for --resume             (CHECKPOINT_DIR)
    adapter.safetensors a LoRA run's adapters alone, on request         (ADAPTER_FILE)
    .lock               held (flock) by the one process writing the run (LOCK_FILE)

:func:`load` returns a :class:`Run` — the model, its tokenizer, settings, metrics, data spec and *task* —
and the task's verbs (``run.generate``, ``run.translate``, ``run.caption``, ``run.classify``, and whatever
verbs a task declares), like litgpt's ``LLM.load`` or Hugging Face's ``from_pretrained``. Nothing else in
tokennet opens ``run.json``, ``config.json`` or ``tokenizer.json`` by hand: recipes, the CLI and ``viz``
go through here.

The task of a run is the one registered for its model family (:mod:`tokennet.plugins` holds that
registry at the bottom of the import layers, and imports the built-in and installed tasks on first use).

Files are written atomically (a temporary name, then a rename), so a reader never sees half a file and
needs no lock; a writer holds :class:`RunLock` for as long as it writes.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from . import jsonio
from .data.spec import DataSpec, legacy_spec, spec_from_dict
from .errors import RunError
from .fileio import atomic_write_text, swap_into_place
from .models.registry import CONFIG_FILE, WEIGHTS_FILE, load_pretrained
from .plugins import all_verbs, task_for
from .run_files import (
    ADAPTER_FILE,
    CHECKPOINT_DIR,
    LOCK_FILE,
    LOG_FILE,
    METRICS_FILE,
    REPORT_FILE,
    RUN_FILE,
    TOKENIZER_FILE,
)

if TYPE_CHECKING:
    from .tasks import Task

__all__ = ["Run", "load", "RunLock", "is_run_dir", "read_run_info", "write_run_info", "read_metrics",
           "write_metrics", "read_tokenizer", "save_tokenizer", "clear_run_dir", "read_data_spec", "RUN_FILE",
           "METRICS_FILE", "TOKENIZER_FILE", "LOG_FILE", "CHECKPOINT_DIR", "LOCK_FILE", "REPORT_FILE", "ADAPTER_FILE"]


# -- files --------------------------------------------------------------------------------------------
def _read_json(path: Path) -> Any:
    try:
        return jsonio.load(path)
    except jsonio.JSONTooDeep as error:  # its message names the file
        raise RunError(f"{error}; the run directory is damaged") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise RunError(f"{path} is not valid JSON ({error}); the run directory is damaged") from None


def is_run_dir(path: str | Path) -> bool:
    """True when ``path`` is a directory that ``tokennet train`` wrote (it has ``run.json``)."""
    return (Path(path) / RUN_FILE).is_file()


def read_run_info(path: str | Path) -> dict[str, Any]:
    """``run.json``: ``{"recipe", "model", "data", "settings"}``; a clear error when it is not a run."""
    path = Path(path)
    if not path.is_dir():
        raise RunError(f"{path} is not a run directory (it does not exist or is not a directory)")
    run_file = path / RUN_FILE
    if not run_file.is_file():
        raise RunError(f"{path} is not a tokennet run directory (no {RUN_FILE})")
    info = _read_json(run_file)
    if not isinstance(info, dict) or not isinstance(info.get("settings"), dict):
        raise RunError(f"{run_file} is not a tokennet run file (no 'settings')")
    return info


def write_run_info(path: str | Path, *, recipe: str, model: str, data: str | None, settings: dict[str, Any],
                   data_spec: DataSpec | None = None, init: str | None = None) -> None:
    """Write ``run.json`` atomically: ``data`` is what ``--data`` said, ``data_spec`` what the data is, ``init``
    where the starting weights came from (a fine-tuned run)."""
    info = {"recipe": recipe, "model": model, "data": data, "settings": settings}
    if data_spec is not None:
        info["data_spec"] = data_spec.to_dict()
    if init is not None:
        info["init"] = init
    atomic_write_text(Path(path) / RUN_FILE, json.dumps(info, indent=2) + "\n")


def read_data_spec(info: dict[str, Any]) -> DataSpec | None:
    """The data spec of a ``run.json`` (rebuilt from the recipe's old settings for a run saved before specs;
    None for a run with no data of its own, e.g. an imported checkpoint)."""
    if "data_spec" in info:
        try:
            return spec_from_dict(info["data_spec"])
        except (ValueError, TypeError) as error:
            raise RunError(f"the data spec in {RUN_FILE} cannot be read: {error}") from None
    if not info.get("recipe"):
        return None
    return legacy_spec(info["recipe"], info.get("data"), info.get("settings", {}))


def read_metrics(path: str | Path) -> dict[str, Any]:
    """``metrics.json``, or ``{}`` while a run has not finished."""
    metrics_file = Path(path) / METRICS_FILE
    return _read_json(metrics_file) if metrics_file.is_file() else {}


def write_metrics(path: str | Path, metrics: dict[str, Any]) -> None:
    """Write ``metrics.json`` atomically."""
    atomic_write_text(Path(path) / METRICS_FILE, json.dumps(metrics, indent=2) + "\n")


def read_tokenizer(path: str | Path):
    """The run's tokenizer (``tokenizer.json``), or None for a model without text."""
    from .tokens.text import load_tokenizer

    tokenizer_file = Path(path) / TOKENIZER_FILE
    return load_tokenizer(tokenizer_file) if tokenizer_file.is_file() else None


def save_tokenizer(path: str | Path, tokenizer) -> None:
    """Write the tokenizer as ``tokenizer.json`` (unless the run already has one: resuming keeps its vocabulary)."""
    tokenizer_file = Path(path) / TOKENIZER_FILE
    if not tokenizer_file.is_file():
        tokenizer.save(tokenizer_file)


def clear_run_dir(path: str | Path) -> None:
    """Remove everything in a run directory except its lock file (a new lock file would let a second writer in).
    ``train --overwrite`` no longer uses it: it replaces a run whole (:meth:`RunLock.swap_in`)."""
    import shutil

    for entry in Path(path).iterdir():
        if entry.name == LOCK_FILE:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


# -- the one writer ---------------------------------------------------------------------------------
class RunLock:
    """An exclusive lock on a run directory for the whole time a process writes it.

    ``fcntl.flock`` on ``RUN_DIR/.lock``: a second writer (another ``train``, ``--resume`` or
    ``--overwrite`` of the same directory) gets a :class:`RunError` naming the holder's PID. The OS
    releases the lock when the holder exits, however it exits, so a killed run never blocks the next one.
    A lock is taken only on the file that is at ``RUN_DIR/.lock`` once flocked (same inode): one unlinked or
    replaced meanwhile is opened again, so two writers never hold locks on two different files. ``--overwrite``
    keeps the lock across the replacement of the whole directory (:meth:`swap_in`). Readers need no lock:
    every file is replaced atomically.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fd: int | None = None
        self.created = False  # this lock created the lock file

    def acquire(self) -> RunLock:
        if self.path.exists() and not self.path.is_dir():
            raise RunError(f"{self.path} exists and is not a directory")
        self.path.mkdir(parents=True, exist_ok=True)
        self._fd, self.created = self._lock(self.path)
        return self

    def _lock(self, directory: Path) -> tuple[int, bool]:
        """Open and flock ``directory/.lock``: ``(descriptor, whether the file was created)``, once the locked file
        is the one on disk."""
        import fcntl

        lock = directory / LOCK_FILE
        for _ in range(LOCK_TRIES):
            created = not lock.exists()
            # The file's contents are never written: a refused writer leaves the run exactly as it was.
            descriptor = os.open(lock, os.O_RDONLY | os.O_CREAT, 0o644)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _flock_holder(descriptor)
                os.close(descriptor)
                raise RunError(f"{self.path} is being written by another process (PID {holder}); wait for it to "
                               "finish or write to another directory") from None
            # The lock is on a file, not a name: if the file was unlinked or replaced between our open and our
            # flock (a writer that swapped a new run in, or one that removed its lock file on the way out), this
            # lock guards a file no other writer will open — two writers. Open the name again.
            if _same_file(descriptor, lock):
                return descriptor, created
            os.close(descriptor)
        raise RunError(f"{lock} keeps being replaced while it is being locked; is another process writing "
                       f"{self.path}?")

    def swap_in(self, new: str | Path) -> None:
        """Replace the locked run directory by ``new`` — a directory beside it (:func:`~tokennet.fileio.
        temp_dir_beside`) whose ``run.json`` is written — keeping one writer throughout; the old run is deleted.

        ``new/.lock`` is locked first, while no other process knows ``new``; then the two directories trade
        names atomically (:func:`~tokennet.fileio.swap_into_place`), so a writer that comes after finds the new
        lock file, held; then the old lock is released and the old run removed. A writer that opened the old
        lock file before the swap and flocks it after finds it is no longer the one on disk and opens the name
        again (:meth:`acquire`). Crash story: before the exchange, the old run is whole under its name (and the
        unfinished new one is a hidden sibling that can be deleted); after it, the name is the new run, which
        has its ``run.json`` (``--resume`` continues it), and the old one is a hidden sibling being deleted.
        """
        new = Path(new)
        descriptor, _ = self._lock(new)
        try:
            trash = swap_into_place(new, self.path)
        except BaseException:
            os.close(descriptor)
            raise
        old, self._fd = self._fd, descriptor
        self.created = True  # the lock file under the name is this writer's
        if old is not None:
            os.close(old)
        if trash is not None:
            import shutil

            shutil.rmtree(trash, ignore_errors=True)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


LOCK_TRIES = 5  # reopen the lock file at most this often when it is replaced between open and flock


def _same_file(fd: int, path: Path) -> bool:
    """True when the open file ``fd`` is the file at ``path`` now (same device and inode)."""
    opened = os.fstat(fd)
    try:
        cur = os.stat(path)
    except FileNotFoundError:
        return False
    return (opened.st_dev, opened.st_ino) == (cur.st_dev, cur.st_ino)


def _flock_holder(fd: int) -> str:
    """The PID holding a flock on ``fd``'s file, from ``/proc/locks`` (Linux); ``"?"`` where it is not known."""
    opened = os.fstat(fd)
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return "?"
    for line in lines:
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 4321 00:2e:1234 0 EOF" (a waiting lock has "->" after the number)
        if "->" in fields:
            continue
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5].rsplit(":", 1)[-1] == str(opened.st_ino):
            return fields[4]
    return "?"


# -- the run object -------------------------------------------------------------------------------
class Run:
    """A trained (or imported) run: ``model``, ``tokenizer``, ``settings``, ``metrics``, ``task`` and its verbs.

    Build it with :func:`load`. The verbs belong to the task (see :mod:`tokennet.tasks`): a language
    model generates, a translation model translates, a captioner captions, a classifier classifies — each
    verb a task declares is ``run.<verb>(...)``; a verb the task lacks raises
    :class:`~tokennet.errors.RunError` naming the ones it has.
    """

    def __init__(self, path: Path, model: nn.Module, tokenizer, info: dict[str, Any], metrics: dict[str, Any],
                 task: Task):
        self.path, self.model, self.tokenizer, self.task = path, model, tokenizer, task
        self.info, self.metrics = info, metrics
        self._data = read_data_spec(info)

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, task={self.task.name!r}, family={self.family!r})"

    def __getattr__(self, name: str):
        # Only reached for names that are not attributes: the task's verbs, then a clear refusal.
        if name.startswith("_") or "task" not in self.__dict__:
            raise AttributeError(name)
        verbs = type(self.task).verb_methods()
        if name in verbs:
            return functools.partial(verbs[name], self.task, self)
        if name in all_verbs():
            have = ", ".join(sorted(verbs)) or "none"
            raise RunError(f"{self.path} is {self.task.a_name} run: it cannot {name} (it supports: {have})")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self.task.verbs))

    @property
    def verbs(self) -> list[str]:
        """The verbs this run's task offers (``run.<verb>(...)``)."""
        return sorted(self.task.verbs)

    @property
    def settings(self) -> dict[str, Any]:
        """The settings the run was trained with (``run.json``; empty for a bare saved model)."""
        return self.info.get("settings", {})

    @property
    def recipe(self) -> str | None:
        return self.info.get("recipe")

    @property
    def data(self) -> DataSpec | None:
        """What the run's data is: its data spec (:mod:`tokennet.data.spec`), or None for a run with no data of
        its own (an imported checkpoint). **Changed**: it used to be the ``--data`` string, which is
        ``run.info["data"]`` (and, for most data, ``run.data.source``)."""
        return self._data

    @property
    def family(self) -> str:
        return self.model.config.family

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def to(self, device) -> Run:
        self.model.to(device)
        return self

    def attention_maps(self, inputs) -> dict[str, list[torch.Tensor]]:
        """Every layer's attention for ``inputs`` as returned data (see each model's ``attention_maps``)."""
        with torch.no_grad():
            return self.model.attention_maps(inputs)

    def write_examples(self, out_dir: str | Path, count: int | None = None) -> list:
        """Write ``count`` held-out inputs of this run's data (None: up to 3) into ``out_dir`` (``tokennet
        examples``): files its task takes (PNG, WAV, graph JSON, text) and the index ``examples.json``; returns
        them as :class:`~tokennet.tasks.example_files.Example` (``values`` for ``generate``, ``label``, ``files``)."""
        return self.task.write_examples(self, out_dir, count)


def load(path: str | Path, *, device: str | torch.device = "cpu", allow_pickle: bool = False) -> Run:
    """Load a run directory (or a bare saved model: ``config.json`` + ``model.safetensors``) as a :class:`Run`.

    The model is in eval mode on ``device``. Weights come from ``model.safetensors`` only, unless
    ``allow_pickle=True`` (see :func:`tokennet.models.load_pretrained`).
    """
    path = Path(path)
    if not path.is_dir():
        raise RunError(f"{path} is not a run directory (it does not exist or is not a directory)")
    if not (path / CONFIG_FILE).is_file():
        what = "training has not finished (no model yet)" if is_run_dir(path) else "not a run directory"
        raise RunError(f"{path}: {what}: expected {CONFIG_FILE} and {WEIGHTS_FILE} in it")
    info = read_run_info(path) if is_run_dir(path) else {}
    model = load_pretrained(path, allow_pickle=allow_pickle).to(device).eval()
    return Run(path, model, read_tokenizer(path), info, read_metrics(path), task_for(model.config.family))
