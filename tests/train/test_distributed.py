"""torchrun with 2 CPU processes (gloo) matches one process with the same global batch, for DDP and FSDP."""

import os
import subprocess
import sys

import torch
from safetensors.torch import load_file

from tokennet.recipes import train

TINY = {"dim": 32, "num_layers": 2, "num_heads": 2, "block_size": 16, "batch_size": 4, "eval_iters": 2,
        "sample_tokens": 0, "warmup_iters": 1, "eval_interval": 0, "progress": False, "dropout": 0.0,
        "checkpoint_interval": 2}


def _torchrun(out, corpus, sets, *extra):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "tokennet", "-q", "train", "gpt-char", "--data", str(corpus), "--out", str(out),
           "--set", *[f"{k}={v}" for k, v in sets.items()], *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def _weights(run):
    return load_file(str(run / "model.safetensors"))


def _assert_same_weights(dist, single):
    a, b = _weights(dist), _weights(single)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=2e-5, rtol=1e-4, msg=k)


def test_fsdp_two_ranks_match_one_process_with_the_same_global_batch(tmp_path, corpus):
    _torchrun(tmp_path / "dist", corpus, {**TINY, "max_iters": 4, "strategy": "fsdp"})
    train("gpt-char", data=str(corpus), out=tmp_path / "single", sets={**TINY, "max_iters": 4, "grad_accum": 2})
    _assert_same_weights(tmp_path / "dist", tmp_path / "single")
    assert (tmp_path / "dist" / "metrics.json").is_file()


def test_ddp_two_ranks_match_one_process_and_resume_as_it_does(tmp_path, corpus):
    """A DDP run of 4 steps equals a single process with the same global batch (2 ranks of 4 sequences against
    2 accumulated micro-batches of 4); stopped there and resumed to 6, it still equals the single process doing the
    same. (One torchrun serves both checks: each costs half a minute of process start-up on 2 cores.)"""
    _torchrun(tmp_path / "dist", corpus, {**TINY, "max_iters": 4})
    train("gpt-char", data=str(corpus), out=tmp_path / "single", sets={**TINY, "max_iters": 4, "grad_accum": 2})
    _assert_same_weights(tmp_path / "dist", tmp_path / "single")
    assert (tmp_path / "dist" / "metrics.json").is_file()
    _torchrun(tmp_path / "dist", corpus, {"max_iters": 6}, "--resume")
    train("gpt-char", out=tmp_path / "single", sets={"max_iters": 6}, resume=True)
    _assert_same_weights(tmp_path / "dist", tmp_path / "single")
