"""``train --overwrite`` validates, then swaps: every failure before the new run's ``run.json`` exists leaves the old
run exactly as it was (it loads, evaluates and generates the same text); only a directory that reads as a run is
replaced; the run lock survives the swap (one writer, and a lock on a replaced file is never trusted)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

import tokennet
from tokennet.cli import main
from tokennet.errors import RunError
from tokennet.recipes import get_recipe, train
from tokennet.run import LOCK_FILE, RunLock

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["dim=32", "num_layers=2", "num_heads=2", "block_size=16", "batch_size=4", "eval_interval=0", "eval_iters=1",
        "sample_tokens=0", "progress=false", "report=false"]
TINY_SETS = {"dim": 32, "num_layers": 2, "num_heads": 2, "block_size": 16, "batch_size": 4, "max_iters": 2,
             "eval_interval": 0, "eval_iters": 1, "sample_tokens": 0, "progress": False, "report": False}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus):
    out, _ = train("gpt-char", data=str(corpus), out=tmp_path_factory.mktemp("runs") / "base", sets=TINY_SETS)
    return out


@pytest.fixture
def run_dir(trained, tmp_path):
    """A private copy of the trained run (tests that overwrite it successfully change it)."""
    d = tmp_path / "runs" / "a"
    shutil.copytree(trained, d)
    return d


def _digest(d: Path) -> dict[str, str]:
    """Every file under ``d`` (hidden ones too), by relative path → SHA-256 of its bytes."""
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


def _behaviour(d: Path) -> tuple[dict, str]:
    """What the run does: its held-out metrics as `tokennet eval` computes them, and a greedy continuation."""
    run = tokennet.load(d)
    metrics = get_recipe("gpt-char").evaluate_run(run, None)
    return metrics, run.generate("line 1", max_new_tokens=12, temperature=0)


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("tokennet: error:"), err
    return err


FAILING = {
    "a --data path that does not exist": (["--data", "typo.txt"], "does not exist"),
    "a --set value out of range": (["--set", "dim=-3"], "dim"),
    "a --set value that cannot be finite": (["--set", "lr=inf"], "lr"),
    "an --init source that does not exist": (["--init", "no-such-checkpoint"], "no-such-checkpoint"),
    "a model that fails to build": (["--set", "num_heads=3"], "num_heads"),
}


@pytest.mark.parametrize("name", list(FAILING))
def test_a_failing_overwrite_leaves_the_old_run_as_it_was(name, run_dir, corpus, capsys):
    extra, words = FAILING[name]
    before, behaviour = _digest(run_dir), _behaviour(run_dir)
    sets = TINY if "--init" not in extra else ["progress=false", "report=false"]  # --init: the shape is the source's
    data = [] if "--data" in extra else ["--data", str(corpus)]
    argv = ["-q", "train", "gpt-char", "--out", str(run_dir), "--overwrite", "--max-iters", "1", *data, "--set", *sets,
            *extra]  # extra last: its --set wins
    assert main(argv) == 2
    assert words in _one_line_error(capsys)
    assert _digest(run_dir) == before
    assert _behaviour(run_dir) == behaviour
    assert sorted(p.name for p in run_dir.parent.iterdir()) == ["a"]  # no half-written sibling left behind


def test_a_failure_writing_the_new_run_leaves_the_old_one_and_no_sibling(run_dir, corpus, monkeypatch):
    import tokennet.lifecycle.runner as runner

    before = _digest(run_dir)

    def fail(where, **kw):
        (Path(where) / "run.json").write_text("half")
        raise OSError(28, "No space left on device", str(where))

    monkeypatch.setattr(runner, "write_run_info", fail)
    with pytest.raises(OSError, match="No space"):
        train("gpt-char", data=str(corpus), out=run_dir, sets=TINY_SETS, overwrite=True)
    assert _digest(run_dir) == before
    assert sorted(p.name for p in run_dir.parent.iterdir()) == ["a"]


def test_a_crash_during_the_swap_leaves_the_old_run(run_dir, corpus, monkeypatch):
    import tokennet.run as run_mod

    before = _digest(run_dir)

    def crash(new, dest):
        raise KeyboardInterrupt  # killed just before the directories trade names

    monkeypatch.setattr(run_mod, "swap_into_place", crash)
    with pytest.raises(KeyboardInterrupt):
        train("gpt-char", data=str(corpus), out=run_dir, sets=TINY_SETS, overwrite=True)
    assert _digest(run_dir) == before
    assert sorted(p.name for p in run_dir.parent.iterdir()) == ["a"]


def test_a_run_interrupted_after_the_swap_is_the_new_one_and_resumes(run_dir, corpus, monkeypatch):
    from tokennet.train.trainer import Trainer

    real_fit = Trainer.fit

    def interrupted(self):
        assert (self.out_dir / "run.json").is_file()  # training starts only once the new run.json is in place
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "fit", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train("gpt-char", data=str(corpus), out=run_dir, sets={**TINY_SETS, "seed": 7}, overwrite=True)
    assert tokennet.run.read_run_info(run_dir)["settings"]["seed"] == 7  # the new run, not the old
    assert not (run_dir / "model.safetensors").exists()
    assert sorted(p.name for p in run_dir.parent.iterdir()) == ["a"]
    monkeypatch.setattr(Trainer, "fit", real_fit)
    _, metrics = train("gpt-char", data=str(corpus), out=run_dir, sets={"progress": False}, resume=True)
    assert metrics["step"] == 2 and tokennet.load(run_dir).settings["seed"] == 7


def test_a_successful_overwrite_replaces_the_run(run_dir, corpus, capsys):
    before = _digest(run_dir)
    argv = ["-q", "train", "gpt-char", "--data", str(corpus), "--out", str(run_dir), "--overwrite", "--max-iters", "3",
            "--set", *TINY, "seed=5"]
    assert main(argv) == 0
    capsys.readouterr()
    run = tokennet.load(run_dir)
    assert run.metrics["step"] == 3 and run.settings["seed"] == 5
    assert _digest(run_dir) != before
    assert not (run_dir / "checkpoints" / "step-000002").exists()  # nothing of the old run is mixed in
    assert sorted(p.name for p in run_dir.parent.iterdir()) == ["a"]  # the old run deleted, no sibling left


@pytest.mark.parametrize("content", ["notes", "damaged run.json", "run.json without settings"])
def test_overwrite_refuses_a_directory_that_is_not_a_run(content, tmp_path, corpus, capsys):
    d = tmp_path / "mine"
    d.mkdir()
    if content == "notes":
        (d / "notes.txt").write_text("my notes")
    elif content == "damaged run.json":
        (d / "run.json").write_text('{"recipe": "gpt-char", "sett')
    else:
        (d / "run.json").write_text('{"recipe": "gpt-char"}')
        (d / "notes.txt").write_text("my notes")
    before = _digest(d)
    argv = ["-q", "train", "gpt-char", "--data", str(corpus), "--out", str(d), "--overwrite", "--max-iters", "1",
            "--set", *TINY]
    assert main(argv) == 2
    assert "refusing to overwrite" in _one_line_error(capsys)
    assert _digest(d) == before and LOCK_FILE not in os.listdir(d)


def test_overwrite_uses_an_empty_directory(tmp_path, corpus, capsys):
    d = tmp_path / "empty"
    d.mkdir()
    argv = ["-q", "train", "gpt-char", "--data", str(corpus), "--out", str(d), "--overwrite", "--max-iters", "1",
            "--set", *TINY]
    assert main(argv) == 0
    capsys.readouterr()
    assert tokennet.load(d).metrics["step"] == 1


# -- the lock across a swap -----------------------------------------------------------------------------------
def test_a_writer_whose_lock_file_was_swapped_away_is_refused(tmp_path, monkeypatch):
    """B opens the lock file, A swaps a new run in and releases the old file, then B flocks the old file: B must
    see it is no longer the one on disk, open the name again, and find A's lock."""
    d = tmp_path / "r"
    a = RunLock(d).acquire()
    new = tmp_path / ".r.new"
    new.mkdir()
    (new / "run.json").write_text("{}")
    real_open, swapped = os.open, []

    def open_then_swap(path, *args, **kw):
        fd = real_open(path, *args, **kw)
        if not swapped and Path(path) == d / LOCK_FILE:
            swapped.append(True)
            a.swap_in(new)  # between B's open and B's flock
        return fd

    monkeypatch.setattr(os, "open", open_then_swap)
    with pytest.raises(RunError, match=rf"PID {os.getpid()}"):
        RunLock(d).acquire()
    assert swapped and (d / "run.json").is_file() and not new.exists()
    a.release()
    monkeypatch.setattr(os, "open", real_open)
    RunLock(d).acquire().release()


def test_a_lock_file_unlinked_before_the_flock_is_opened_again(tmp_path, monkeypatch):
    d = tmp_path / "r"
    d.mkdir()
    real_open, calls = os.open, []

    def open_then_unlink(path, *args, **kw):
        fd = real_open(path, *args, **kw)
        calls.append(path)
        if len(calls) == 1:
            os.unlink(path)  # another writer removed its lock file on the way out
        return fd

    monkeypatch.setattr(os, "open", open_then_unlink)
    lock = RunLock(d).acquire()
    try:
        assert len(calls) == 2  # the first descriptor locked a file that was gone: opened again
        st, cur = os.fstat(lock._fd), os.stat(d / LOCK_FILE)
        assert (st.st_dev, st.st_ino) == (cur.st_dev, cur.st_ino)
    finally:
        lock.release()


# -- the swap itself ------------------------------------------------------------------------------------------
def _tree(d: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in d.iterdir()}


def _two_dirs(tmp_path: Path) -> tuple[Path, Path]:
    old, new = tmp_path / "a", tmp_path / ".a.new"
    old.mkdir()
    new.mkdir()
    (old / "run.json").write_text("old")
    (new / "run.json").write_text("new")
    return old, new


@pytest.mark.parametrize("exchange", [True, False])
def test_swap_into_place_puts_the_new_one_at_the_name_and_the_old_one_aside(exchange, tmp_path, monkeypatch):
    import tokennet.fileio as fileio

    if not exchange:  # a filesystem without renameat2(RENAME_EXCHANGE): two renames
        monkeypatch.setattr(fileio, "exchange_paths", lambda a, b: False)
    old, new = _two_dirs(tmp_path)
    trash = fileio.swap_into_place(new, old)
    assert _tree(old) == {"run.json": "new"} and _tree(trash) == {"run.json": "old"}
    assert trash.parent == tmp_path and trash.name.startswith(".a.old-") and not new.exists()


def test_swap_into_place_puts_the_old_one_back_when_the_second_rename_fails(tmp_path, monkeypatch):
    import tokennet.fileio as fileio

    monkeypatch.setattr(fileio, "exchange_paths", lambda a, b: False)
    old, new = _two_dirs(tmp_path)
    real = Path.rename

    def failing(self, target):
        if self == new:
            raise OSError(5, "Input/output error")
        return real(self, target)

    monkeypatch.setattr(Path, "rename", failing)
    with pytest.raises(OSError):
        fileio.swap_into_place(new, old)
    assert _tree(old) == {"run.json": "old"} and _tree(new) == {"run.json": "new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [".a.new", "a"]


def test_overwrite_without_an_atomic_exchange_still_replaces_the_run(run_dir, corpus, monkeypatch):
    import tokennet.fileio as fileio

    monkeypatch.setattr(fileio, "exchange_paths", lambda a, b: False)
    _, metrics = train("gpt-char", data=str(corpus), out=run_dir, sets={**TINY_SETS, "max_iters": 1}, overwrite=True)
    assert metrics["step"] == 1 and tokennet.load(run_dir).metrics["step"] == 1
    assert sorted(p.name for p in run_dir.parent.iterdir()) == ["a"]
