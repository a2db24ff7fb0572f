"""The trainer's ``compile`` and ``checkpointing`` settings: the same losses as without them, LoRA or not, and
checkpointing lowers the memory a step holds (torch's CPU allocations, :func:`tokennet.train.memory.peak_allocated`).
"""

import functools
import json

import pytest
import torch

from tokennet.errors import ConfigError
from tokennet.layers.lora import LoRAConfig, apply_lora, lora_layers
from tokennet.layers.stack import set_checkpointing
from tokennet.models import create_model
from tokennet.train import TrainConfig, Trainer
from tokennet.train.memory import peak_allocated

pytestmark = pytest.mark.usefixtures("one_thread")
V = 24


class Walk:
    """Sequences ``x_{t+1} = x_t + 2 (mod V)`` from random starts: batch ``i`` is a pure function of ``i``."""

    def batch(self, i):
        g = torch.Generator().manual_seed(i)
        seq = (torch.randint(V, (8, 1), generator=g) + 2 * torch.arange(17)) % V  # (8, 17)
        return seq[:, :-1], seq[:, 1:]


def _model(lora: bool, dropout: float = 0.0):
    torch.manual_seed(0)
    m = create_model("gpt-micro", vocab_size=V, block_size=16, num_kv_heads=2, gated_mlp=True, activation="silu",
                     dropout=dropout)
    if lora:
        apply_lora(m, LoRAConfig(rank=4, alpha=8.0))
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():  # B ≠ 0: the adapters act from the first step
            for layer in lora_layers(m).values():
                layer.lora_B.copy_(torch.randn(layer.lora_B.shape, generator=g) * 0.1)
    return m


def _losses(tmp_path, name, model, **settings):
    cfg = TrainConfig(max_iters=6, warmup_iters=0, eval_interval=3, log_interval=1, progress=False, lr=3e-3,
                      report=False, **settings)
    evaluate = lambda m: {"val_loss": m(*Walk().batch(-1)).loss}  # noqa: E731
    Trainer(model, cfg, Walk(), out_dir=tmp_path / name, evaluate=evaluate).fit()
    return [r.get("loss", r.get("val_loss")) for r in map(json.loads, open(tmp_path / name / "log.jsonl"))]


@pytest.mark.parametrize("lora,dropout", [(True, 0.0), (False, 0.1)])
def test_checkpointing_trains_the_same_losses(tmp_path, lora, dropout):
    """Recomputed blocks give the losses of kept ones; with dropout too (the random state is replayed)."""
    want = _losses(tmp_path, "plain", _model(lora, dropout))
    got = _losses(tmp_path, "ckpt", _model(lora, dropout), checkpointing=True)
    assert len(got) == len(want) == 8  # 6 steps and 2 evaluations
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=0, atol=1e-6)


def test_checkpointing_lowers_the_memory_of_a_step():
    torch.manual_seed(0)
    m = apply_lora(create_model("gpt-micro", vocab_size=64, block_size=128, num_layers=6), LoRAConfig(rank=4))
    x, y = torch.randint(64, (8, 128)), torch.randint(64, (8, 128))

    def step():
        loss = m(x, y).loss
        loss.backward()
        return loss.item()

    step()  # the fused LoRA buffers are built on the first call
    m.zero_grad(set_to_none=True)
    peaks, losses = {}, {}
    for on in (False, True):
        assert set_checkpointing(m, on) == 1
        losses[on], peaks[on] = peak_allocated(step)
        m.zero_grad(set_to_none=True)
    assert losses[True] == pytest.approx(losses[False], abs=1e-6)
    # Six blocks' activations against one block's (plus the input of each): measured 26.8 vs 7.7 MiB.
    assert peaks[True] < 0.4 * peaks[False], peaks


def test_checkpointing_a_model_without_blocks_is_refused(tmp_path):
    class Plain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x, y):
            return self.fc(x)

    with pytest.raises(ConfigError, match="checkpointing=true needs a model of transformer blocks"):
        Trainer(Plain(), TrainConfig(checkpointing=True), Walk(), out_dir=tmp_path / "r")


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_compiled_lora_step_traces_as_one_graph_with_the_eager_losses(tmp_path, monkeypatch, checkpointing):
    """The trainer's torch.compile, traced as one graph (``fullgraph``) and run by AOTAutograd without Inductor's
    code generation (``aot_eager``: seconds instead of a minute; the Inductor run is the slow test below)."""
    want = _losses(tmp_path, "eager", _model(True))
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager", fullgraph=True))
    torch._dynamo.reset()
    got = _losses(tmp_path, "compiled", _model(True), compile=True, checkpointing=checkpointing)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=0, atol=1e-5)


@pytest.mark.slow
def test_an_inductor_compiled_lora_step_trains_the_eager_losses(tmp_path):
    want = _losses(tmp_path, "eager", _model(True))
    torch._dynamo.reset()
    got = _losses(tmp_path, "compiled", _model(True), compile=True)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=0, atol=1e-5)
