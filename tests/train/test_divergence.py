"""A run that diverges stops with one line naming the step, keeps its last good checkpoint and resumes; settings
that cannot train to finite weights are refused before training."""

from __future__ import annotations

import math

import pytest
import torch

import tokennet
from tokennet.cli import main
from tokennet.data.text import LMBatches
from tokennet.errors import ConfigError
from tokennet.models import create_model
from tokennet.train import TrainConfig, Trainer, TrainingStopped, latest_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["dim=32", "num_layers=2", "num_heads=2", "block_size=16", "batch_size=4", "eval_interval=0", "eval_iters=1",
        "sample_tokens=0", "progress=false", "report=false"]


@pytest.mark.parametrize("setting", ["weight_decay=inf", "lr=inf", "lr=nan", "beta1=nan", "grad_clip=inf",
                                     "min_lr=inf", "muon_lr=inf", "lr=0.5 weight_decay=4"])
def test_settings_that_cannot_be_finite_are_refused_before_training(setting, tmp_path, corpus, capsys):
    out = tmp_path / "r"
    argv = ["-q", "train", "gpt-char", "--data", str(corpus), "--out", str(out), "--max-iters", "1", "--set", *TINY,
            *setting.split()]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and setting.split()[-1].split("=")[0] in err, err
    assert not out.exists()


def test_trainconfig_refuses_non_finite_floats():
    for k in ("lr", "weight_decay", "beta2", "decay_fraction", "muon_weight_decay", "target_val_loss", "time_budget"):
        with pytest.raises(ConfigError, match=k):
            TrainConfig(**{k: math.nan})
    TrainConfig(lr=1e-3, weight_decay=0.1, target_val_loss=1.5)  # ordinary values pass


def _setup(tmp_path, **cfg):
    torch.manual_seed(0)
    model = create_model("gpt-micro", vocab_size=17, block_size=8)
    src = LMBatches(torch.randint(17, (500,), generator=torch.Generator().manual_seed(0)), 8, 4, seed=0)
    config = TrainConfig(**{"max_iters": 10, "warmup_iters": 2, "eval_interval": 0, "checkpoint_interval": 2,
                            "progress": False, **cfg})
    return Trainer(model, config, src, out_dir=tmp_path / "r")


def test_infinite_gradients_under_a_finite_loss_stop_the_run_before_the_weights_turn_nan(tmp_path):
    t = _setup(tmp_path)
    real = t.source

    class InfGrad:  # from micro-batch 5 on, the loss stays finite but its gradient is infinite
        def batch(self, i):
            if i == 5:
                t.module.tok_emb.weight.register_hook(lambda g: g * math.inf)
            return real.batch(i)

    t.source = InfGrad()
    with pytest.raises(TrainingStopped, match=r"at step 6: the gradient norm became (inf|nan).*step-000004"):
        t.fit()
    assert all(torch.isfinite(p).all() for p in t.module.parameters())
    assert latest_checkpoint(tmp_path / "r" / "checkpoints").name == "step-000004"


def test_a_divergence_before_any_checkpoint_says_so(tmp_path):
    t = _setup(tmp_path)
    real = t.source

    class NaNLoss:
        def batch(self, i):
            x, y = real.batch(i)
            with torch.no_grad():
                t.module.tok_emb.weight.fill_(math.nan)
            return x, y

    t.source = NaNLoss()
    with pytest.raises(TrainingStopped, match="at step 1: loss became nan; no checkpoint was written yet"):
        t.fit()


def test_a_diverged_cli_run_is_one_line_naming_the_step_and_resumes(tmp_path, corpus, capsys, monkeypatch):
    out = tmp_path / "r"
    real, calls = torch.nn.utils.clip_grad_norm_, []

    def diverging(params, max_norm, *a, **kw):
        calls.append(1)
        norm = real(params, max_norm, *a, **kw)
        return torch.tensor(math.nan) if len(calls) == 3 else norm

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", diverging)
    argv = ["-q", "train", "gpt-char", "--data", str(corpus), "--out", str(out), "--max-iters", "4", "--set", *TINY,
            "checkpoint_interval=2"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "at step 3" in err and "step-000002" in err and "--resume" in err, err
    assert latest_checkpoint(out / "checkpoints").name == "step-000002"
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", real)
    assert main(["-q", "train", "gpt-char", "--out", str(out), "--resume", "--set", "lr=5e-4"]) == 0
    capsys.readouterr()
    run = tokennet.load(out)
    assert run.metrics["step"] == 4 and run.settings["lr"] == 5e-4
