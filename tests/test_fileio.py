"""tokennet.fileio: one temporary-name scheme beside a destination, and what a dead writer left swept away."""

import os
import subprocess
import sys

import pytest

from tokennet import fileio


def _dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout)


def test_temporary_names_are_hidden_tagged_and_fresh(tmp_path):
    a, b = fileio.temp_name_beside(tmp_path / "m.json"), fileio.temp_name_beside(tmp_path / "m.json", "new")
    assert a.parent == tmp_path and a.name.startswith(f".m.json.tmp-{os.getpid()}-")
    assert b.name.startswith(f".m.json.new-{os.getpid()}-") and a != fileio.temp_name_beside(tmp_path / "m.json")
    with pytest.raises(ValueError, match="tag"):
        fileio.temp_name_beside(tmp_path / "m.json", "mine")


def test_a_dead_writers_leftovers_are_swept_and_nothing_else(tmp_path):
    dead = _dead_pid()
    left = [tmp_path / f".run.new-{dead}-abc123", tmp_path / f".run.old-{dead}-a1b2c3", tmp_path / f".run.tmp-{dead}"]
    left[0].mkdir()
    (left[0] / "model.safetensors").write_bytes(b"half")
    for p in left[1:]:
        p.write_text("x")
    kept = [tmp_path / ".run.new-1-abc123",  # pid 1 runs: a live writer's
            tmp_path / f".run.new-{os.getpid()}-abc123",  # this process's own
            tmp_path / f".other.new-{dead}-abc123",  # another destination's
            tmp_path / f".run.notes-{dead}",  # not a temporary tag
            tmp_path / "run"]
    for p in kept:
        p.mkdir()
    assert sorted(fileio.sweep_stale_temps(tmp_path / "run")) == sorted(left)
    assert all(p.exists() for p in kept) and not any(p.exists() for p in left)


def test_an_atomic_write_sweeps_what_a_killed_write_of_the_same_file_left(tmp_path):
    stale = tmp_path / f".metrics.json.tmp-{_dead_pid()}"
    stale.write_text('{"half": ')
    fileio.atomic_write_text(tmp_path / "metrics.json", "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]


def test_a_new_run_directory_sweeps_a_dead_builders_directory(tmp_path):
    stale = tmp_path / f".run.new-{_dead_pid()}-zz9_ab"
    stale.mkdir()
    new = fileio.temp_dir_beside(tmp_path / "run")
    assert not stale.exists() and new.is_dir() and new.name.startswith(f".run.new-{os.getpid()}-")
