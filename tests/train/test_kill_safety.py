"""Training survives SIGKILL at random moments (even mid-checkpoint) and Ctrl-C, and resumes exactly."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from tokennet.train import latest_checkpoint, read_checkpoint

SETS = {"dim": 32, "num_layers": 1, "num_heads": 2, "block_size": 16, "batch_size": 4, "eval_iters": 2,
        "sample_tokens": 0, "warmup_iters": 5, "eval_interval": 0, "dropout": 0.1, "checkpoint_interval": 1,
        "keep_checkpoints": 3, "max_iters": 100}


def _cmd(corpus, out, resume):
    cmd = [sys.executable, "-m", "tokennet", "-q", "train", "gpt-char", "--data", str(corpus), "--out", str(out),
           "--set", *[f"{k}={v}" for k, v in SETS.items()], "progress=false"]
    return cmd + (["--resume"] if resume else [])


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def _check_all_checkpoints_load(out):
    ck = out / "checkpoints"
    if not ck.exists():
        return 0
    steps = sorted(p for p in ck.glob("step-*"))
    for p in steps:
        read_checkpoint(p)  # raises if any surviving checkpoint is damaged
    if (ck / "latest").exists():
        latest_checkpoint(ck)
    return len(steps)


def _checkpoints(out) -> set[str]:
    ck = out / "checkpoints"
    return {p.name for p in ck.glob("step-*")} if ck.exists() else set()


def _wait_for_a_new_checkpoint(p, out, before: set[str], timeout: float = 120.0) -> None:
    """Until the process ``p`` has written a checkpoint that was not there before it started, or has ended."""
    deadline = time.time() + timeout
    while p.poll() is None and not (_checkpoints(out) - before):
        assert time.time() < deadline, "training did not start"
        time.sleep(0.02)


def test_sigkill_at_random_moments_then_resume_equals_uninterrupted(tmp_path, corpus):
    ref_out = tmp_path / "ref"  # a subprocess too: same thread count, same float reductions
    r = subprocess.run(_cmd(corpus, ref_out, False), capture_output=True, text=True, env=_env())
    assert r.returncode == 0, r.stderr[-2000:]
    out = tmp_path / "killed"
    rng = random.Random(0)
    kills = 0
    for attempt in range(5):  # four random kills, then a last run left to finish
        resume = (out / "run.json").exists()
        before = _checkpoints(out)
        p = subprocess.Popen(_cmd(corpus, out, resume), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             env=_env())
        if attempt < 4:
            # A random moment once this process trains: a checkpoint is written every step, so the kill often
            # lands mid-write. (A delay from the start would land in the seconds of importing torch on a slow
            # machine, and test nothing.)
            _wait_for_a_new_checkpoint(p, out, before)
            time.sleep(rng.uniform(0.0, 0.6))
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
                kills += 1
                _check_all_checkpoints_load(out)
                continue
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err.decode()[-2000:]
        break
    assert kills >= 1, "no kill landed during training; slow the run down"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["step"] == SETS["max_iters"]
    a, b = load_file(str(ref_out / "model.safetensors")), load_file(str(out / "model.safetensors"))
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_ctrl_c_writes_a_checkpoint_and_exits_cleanly(tmp_path, corpus):
    out = tmp_path / "run"
    p = subprocess.Popen(_cmd(corpus, out, False), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(),
                         text=True)
    deadline = time.time() + 60
    while not (out / "checkpoints" / "latest").exists():
        assert time.time() < deadline and p.poll() is None, "training did not start"
        time.sleep(0.1)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130
    assert "--resume" in err and "Traceback" not in err
    step = read_checkpoint(latest_checkpoint(out / "checkpoints")).step
    assert 0 < step < SETS["max_iters"]
    r = subprocess.run(_cmd(corpus, out, True), capture_output=True, text=True, env=_env())
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((out / "metrics.json").read_text())["step"] == SETS["max_iters"]


def test_a_death_while_pruning_never_leaves_half_a_checkpoint(tmp_path, monkeypatch):
    """Pruning deletes file by file; dying in the middle must not leave a ``step-N`` missing files.

    The fake ``rmtree`` removes one file of the directory it is given and then "dies" (raises), at
    the worst moment; the surviving ``step-*`` directories must all read back, and the next save
    cleans up what the death left behind.
    """
    from tokennet.train import checkpoint as ck

    real_rmtree = ck.shutil.rmtree

    model = {"w": torch.arange(6.0)}
    optim = {"state": {}, "param_groups": [{"lr": 0.1, "params": ["w"]}]}
    rng = [ck.capture_rng()]
    for step in (1, 2):
        ck.save_checkpoint(tmp_path, step, model, optim, {"elapsed": 0.0}, rng, keep=2)

    class Died(Exception):
        pass

    def dying_rmtree(path, ignore_errors=False):
        files = sorted(p.path for p in os.scandir(path) if p.is_file())
        if files:
            os.unlink(files[0])
        raise Died(path)

    monkeypatch.setattr(ck.shutil, "rmtree", dying_rmtree)
    with pytest.raises(Died):
        ck.save_checkpoint(tmp_path, 3, model, optim, {"elapsed": 0.0}, rng, keep=2)  # prunes step 1
    monkeypatch.setattr(ck.shutil, "rmtree", real_rmtree)
    survivors = sorted(tmp_path.glob("step-*"))
    assert [p.name for p in survivors] == ["step-000002", "step-000003"]
    for p in survivors:
        read_checkpoint(p)
    assert latest_checkpoint(tmp_path).name == "step-000003"
    assert list(tmp_path.glob(".del-step-*"))  # the half-deleted one, out of the way
    ck.save_checkpoint(tmp_path, 4, model, optim, {"elapsed": 0.0}, rng, keep=2)
    assert not list(tmp_path.glob(".del-step-*")) and not list(tmp_path.glob(".tmp-step-*"))
    assert [p.name for p in sorted(tmp_path.glob("step-*"))] == ["step-000003", "step-000004"]
