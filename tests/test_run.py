"""A run is an object: tokennet.load returns a Run with the task's verbs; one writer per run directory;
the public names resolve."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import tokennet
from tokennet.cli import main
from tokennet.errors import RunError, TokennetError
from tokennet.recipes import train
from tokennet.run import LOCK_FILE, Run, RunLock, load

pytestmark = pytest.mark.usefixtures("one_thread")

TINY_LM = {"dim": 32, "num_layers": 2, "num_heads": 2, "block_size": 16, "batch_size": 4, "max_iters": 3,
           "eval_interval": 0, "eval_iters": 1, "sample_tokens": 0, "progress": False}


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory, corpus):
    out, _ = train("gpt-char", data=str(corpus), out=tmp_path_factory.mktemp("runs") / "lm", sets=TINY_LM)
    return out


def test_public_names_resolve_in_a_fresh_interpreter_twice_to_the_same_object():
    code = textwrap.dedent("""
        import importlib, tokennet
        for name in tokennet.__all__:
            first = getattr(tokennet, name)
            importlib.import_module("tokennet.run"); importlib.import_module("tokennet.sampling")
            importlib.import_module("tokennet.attention.multihead")
            assert getattr(tokennet, name) is first, name
        assert callable(tokennet.generate) and tokennet.generate.__module__ == "tokennet.sampling"
        assert tokennet.attention.attention is not None
        assert tokennet.MultiHeadAttention.__name__ == "MultiHeadAttention"
        print("ok", len(tokennet.__all__))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok")
    with pytest.raises(AttributeError):
        tokennet.no_such_name  # noqa: B018


def test_load_returns_a_run_with_the_task_verbs(lm_run):
    run = tokennet.load(lm_run)
    assert isinstance(run, Run) and run.task.name == "language model" and run.recipe == "gpt-char"
    assert run.tokenizer.kind == "char" and run.settings["dim"] == 32 and "val_loss" in run.metrics
    assert not run.model.training
    text = run.generate("line", 12, temperature=0)
    assert isinstance(text, str) and len(text) > 0
    assert text == run.generate("line", 12, temperature=0, use_cache=False)  # the KV cache changes nothing
    others = (("translate", ("x",)), ("caption", (torch.zeros(1, 3, 8, 8),)), ("classify", (torch.zeros(1),)))
    for verb, args in others:
        with pytest.raises(RunError, match=r"language model run: it cannot .* \(it supports: evaluate_text, "
                                           r"generate\)"):
            getattr(run, verb)(*args)
    maps = run.attention_maps(torch.tensor([[1, 2, 3, 4]]))["self"]
    assert len(maps) == 2 and maps[0].shape == (1, 2, 4, 4)
    assert torch.equal(maps[0][0, 0].triu(1), torch.zeros(4, 4))  # causal: no weight on later tokens


def test_load_of_what_is_not_a_run_is_one_clear_error(tmp_path):
    with pytest.raises(RunError, match="not a run directory"):
        load(tmp_path / "missing")
    with pytest.raises(RunError, match="not a run directory"):
        load(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps({"recipe": "gpt", "settings": {}}))
    with pytest.raises(RunError, match="training has not finished"):
        load(tmp_path)
    assert issubclass(RunError, TokennetError)


def test_viz_draws_token_attention_for_a_language_model(lm_run, tmp_path, capsys):
    assert main(["viz", str(lm_run), "--out", str(tmp_path), "--text", "the quick fox", "--layer", "1"]) == 0
    png = tmp_path / "token_attention-the-quick-fox.png"  # --text's own picture: the default one is not overwritten
    assert capsys.readouterr().out.strip() == str(png)
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert main(["viz", str(lm_run), "--out", str(tmp_path), "--layer", "1"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "token_attention.png") and png.is_file()


# -- one writer ----------------------------------------------------------------------------------------
def test_a_second_writer_is_refused_and_named(tmp_path):
    d = tmp_path / "r"
    with RunLock(d):
        with pytest.raises(RunError, match=rf"PID {os.getpid()}"):
            RunLock(d).acquire()
    RunLock(d).acquire().release()  # free again once released


def _hold_lock_in_subprocess(d):
    code = (f"from tokennet.run import RunLock; import time; RunLock({str(d)!r}).acquire(); "
            "print('held', flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_train_on_a_run_being_written_exits_2_naming_the_pid(lm_run, tmp_path, capsys, corpus):
    p = _hold_lock_in_subprocess(lm_run)
    try:
        before = sorted(f.name for f in lm_run.iterdir())
        for flag in ("--overwrite", "--resume"):
            argv = ["-q", "train", "gpt-char", "--data", str(corpus), "--out", str(lm_run), flag, "--max-iters", "1"]
            assert main(argv) == 2
            err = capsys.readouterr().err
            assert f"PID {p.pid}" in err and len(err.strip().splitlines()) == 1
        assert sorted(f.name for f in lm_run.iterdir()) == before  # nothing replaced under the writer
    finally:
        p.kill()
        p.wait()
    # A killed holder never blocks: the OS released its lock.
    t0 = time.time()
    RunLock(lm_run).acquire().release()
    assert time.time() - t0 < 5


def test_no_lock_file_is_left_where_nothing_was_trained(tmp_path, capsys):
    d = tmp_path / "not-a-run"
    d.mkdir()
    (d / "notes.txt").write_text("mine")
    assert main(["-q", "train", "gpt-char", "--out", str(d), "--overwrite", "--max-iters", "1"]) == 2
    assert "not a tokennet run directory" in capsys.readouterr().err
    assert sorted(f.name for f in d.iterdir()) == ["notes.txt"]
    assert not (tmp_path / "fresh").exists()
    assert main(["-q", "train", "gpt-char", "--out", str(tmp_path / "fresh"), "--set", "dim=-3"]) == 2
    assert not (tmp_path / "fresh").exists() and LOCK_FILE == ".lock"
