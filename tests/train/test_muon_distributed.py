"""Muon under torchrun: 2 CPU ranks (DDP and FSDP) match one process with the same global batch."""

import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tokennet.recipes import train

TINY = {"dim": 32, "num_layers": 2, "num_heads": 2, "block_size": 16, "batch_size": 4, "eval_iters": 2,
        "sample_tokens": 0, "warmup_iters": 1, "eval_interval": 0, "progress": False, "dropout": 0.0,
        "checkpoint_interval": 2}
MUON = {**TINY, "optimizer": "muon", "schedule": "wsd", "muon_lr": 0.05}


def _torchrun(out, corpus, sets):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "tokennet", "-q", "train", "gpt-char", "--data", str(corpus), "--out", str(out),
           "--set", *[f"{k}={v}" for k, v in sets.items()]]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]


def _weights(run):
    return load_file(str(run / "model.safetensors"))


# Muon has code of its own only for FSDP's sharded parameters (optim.py gathers each DTensor's rows); under DDP
# its parameters are plain tensors whose gradients DDP averages before any step, which test_distributed's DDP test
# holds to one process. So the DDP case, half a minute of torchrun start-up, runs with the slow tests.
@pytest.mark.parametrize("strategy", [pytest.param("ddp", marks=pytest.mark.slow), "fsdp"])
def test_muon_two_ranks_match_one_process(tmp_path, corpus, strategy):
    _torchrun(tmp_path / "dist", corpus, {**MUON, "max_iters": 4, "strategy": strategy})
    train("gpt-char", data=str(corpus), out=tmp_path / "single", sets={**MUON, "max_iters": 4, "grad_accum": 2})
    a, b = _weights(tmp_path / "dist"), _weights(tmp_path / "single")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=5e-5, rtol=1e-4, msg=k)
