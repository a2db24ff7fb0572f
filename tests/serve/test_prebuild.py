"""Building a run's compiled steps in a process of its own (tokennet.serve.prebuild): one builder at a time, at the
lowest priority; ``generate`` starts one only where it decoded eagerly and nothing is kept; the server decodes eagerly
until the builder is done, then loads the steps; a builder that fails leaves the server eager, never compiling in its
own process."""

from __future__ import annotations

import logging
import os
import types
from pathlib import Path

import pytest
import torch

from tokennet import sampling
from tokennet.cli import main
from tokennet.serve import prebuild

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, corpus):
    out = tmp_path_factory.mktemp("prebuild") / "run"
    assert main(["-q", "train", "gpt-char", "--data", str(corpus), "--out", str(out), "--max-iters", "2", "--set",
                 "dim=32", "num_layers=1", "num_heads=2", "block_size=16", "batch_size=2", "eval_interval=0",
                 "sample_tokens=0"]) == 0
    return out


def _artifact(tmp_path):
    return types.SimpleNamespace(path=tmp_path / "steps" / "CompiledStep-B1-x.step")


def test_one_builder_at_a_time_and_a_dead_one_is_taken_over(tmp_path):
    lock = tmp_path / "steps" / "x.building"
    assert prebuild._take_lock(lock) and lock.read_text() == f"{os.getpid()}\n"
    assert not prebuild._take_lock(lock)  # a live builder (here: its starter)
    lock.write_text("")
    assert not prebuild._take_lock(lock)  # an empty lock, just made: its builder is being started
    os.utime(lock, (0, 0))
    assert prebuild._take_lock(lock)  # an empty lock from long ago: taken over
    lock.write_text("999999999\n")
    lock.write_text("999999999\n")  # no such process: its builder is gone
    assert prebuild._take_lock(lock)


def test_spawn_starts_the_builder_at_the_lowest_priority_with_this_process_threads(tmp_path, monkeypatch):
    started = []

    class Child:
        pid = os.getpid()  # alive: a second spawn finds the lock held

        def __init__(self, argv, **kw):
            started.append((argv, kw))

    monkeypatch.setattr(prebuild.subprocess, "Popen", Child)
    artifact = _artifact(tmp_path)
    assert isinstance(prebuild.spawn(tmp_path / "run", "one", "int4", artifact), Child)
    assert prebuild.spawn(tmp_path / "run", "one", "int4", artifact) is None and len(started) == 1
    argv, kw = started[0]
    assert argv[1:4] == ["-m", "tokennet.serve.prebuild", str((tmp_path / "run").resolve())]
    assert argv[argv.index("--threads") + 1] == str(torch.get_num_threads())
    assert argv[argv.index("--quantize") + 1] == "int4" and argv[argv.index("--kind") + 1] == "one"
    assert kw["start_new_session"] and kw["env"]["TORCHINDUCTOR_COMPILE_THREADS"] == "1"
    assert "--nice" not in argv  # the builder's own default: 19


def test_lowering_the_priority_reaches_the_session_group(monkeypatch):
    niced, written = [], {}
    monkeypatch.setattr(prebuild.os, "nice", niced.append)

    class Autogroup:
        def __init__(self, path, mode):
            written["path"] = path

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def write(self, text):
            written["text"] = text

    monkeypatch.setattr("builtins.open", Autogroup)
    prebuild._lower_priority(19)
    assert niced == [19] and written == {"path": "/proc/self/autogroup", "text": "19"}


def test_the_builder_lowers_its_own_priority_first(tmp_path, monkeypatch):
    niced = []
    monkeypatch.setattr(prebuild, "_lower_priority", niced.append)
    lock = tmp_path / "x.building"
    lock.write_text("1\n")
    with pytest.raises(Exception, match="does not exist|no such|not a run"):
        prebuild.main([str(tmp_path / "missing"), "--kind", "one", "--threads", "1", "--lock", str(lock)])
    assert niced == [19] and not lock.exists()  # its lock goes, whatever happened


def test_generate_starts_a_builder_only_where_it_decoded_eagerly_and_nothing_is_kept(run_dir, tmp_path,
                                                                                      monkeypatch):
    from tokennet import load

    monkeypatch.setenv("TOKENNET_CACHE", str(tmp_path))
    spawned = []
    monkeypatch.setattr(prebuild, "spawn", lambda *a: spawned.append(a) or object())
    run = load(run_dir)
    monkeypatch.setenv("TOKENNET_COMPILE", "0")  # --no-compile: nothing to build
    run.generate("ab", 3, temperature=0, prebuild=True)
    assert not spawned
    monkeypatch.delenv("TOKENNET_COMPILE")  # auto: three tokens never repay a compilation
    monkeypatch.setenv("TOKENNET_PREBUILD", "0")
    run.generate("ab", 3, temperature=0, prebuild=True)
    assert not spawned
    monkeypatch.delenv("TOKENNET_PREBUILD")
    run.generate("ab", 3, temperature=0)  # the API (a report's sample, a notebook) starts none unless asked
    assert not spawned
    assert main(["-q", "generate", str(run_dir), "--prompt", "ab", "--max-new-tokens", "3", "--temperature", "0"]) == 0
    assert len(spawned) == 1 and spawned[0][1:3] == ("one", "auto") and Path(spawned[0][0]) == Path(run_dir)


def test_a_server_whose_builder_fails_stays_eager_and_never_compiles_itself(run_dir, tmp_path, monkeypatch, caplog):
    from tokennet import load
    from tokennet.serve.app import engine_for_run

    monkeypatch.setenv("TOKENNET_CACHE", str(tmp_path))
    engine = engine_for_run(load(run_dir), max_batch=2, compile=True, prefix_cache_mb=0)
    monkeypatch.setattr(sampling.CompiledStep, "_build", lambda *a: pytest.fail("compiled in the server's process"))
    with caplog.at_level(logging.INFO, logger="tokennet"):
        assert engine.warm_up_in_background(lambda artifact: types.SimpleNamespace(wait=lambda: 1))
        engine._warming.join(30)
    assert engine.step_ready and engine.step.compiled is False
    assert any("could not be built" in r.getMessage() for r in caplog.records)


@pytest.mark.slow  # two compilations (~30 s on a shared machine); the tests above cover the choices without one
def test_the_builder_makes_the_steps_that_a_server_then_loads(run_dir, tmp_path, monkeypatch):
    from tokennet import load
    from tokennet.serve.app import engine_for_run

    monkeypatch.setenv("TOKENNET_CACHE", str(tmp_path))

    def build_here(artifact):  # the builder's own code, in this process (no nice), as the server starts it
        assert prebuild.main([str(run_dir), "--kind", "rows", "--quantize", engine.quantize, "--threads", "1",
                              "--nice", "0"]) == 0
        return types.SimpleNamespace(wait=lambda: 0)

    engine = engine_for_run(load(run_dir), max_batch=2, compile=True, prefix_cache_mb=0)
    assert engine.warm_up_in_background(build_here)
    engine._warming.join(600)
    assert engine.step_ready and engine.step.compiled is True and set(engine.step._fns) == {"B1", "Bn"}
