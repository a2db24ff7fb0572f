"""tokennet.dropout against the formula: units kept with probability 1 - p (p kept to a multiple of 1/65536),
scaled by one over that, the same mask and scale in the gradient, the identity in eval mode, masks that repeat with
the seed; and a transformer block that drops each branch once."""

import math

import pytest
import torch

from tokennet.dropout import LEVELS, Dropout, _keep_mask, dropout, kept_probability
from tokennet.layers import Block


def test_units_are_kept_at_the_rate_and_scale_that_keep_the_expectation():
    torch.manual_seed(0)
    x = torch.rand(1000, 1000) + 0.5  # no zeros: a zero in the output is a dropped unit
    for p in (0.1, 0.5, 0.9):
        out = dropout(x, p)
        kept = out != 0
        q = kept_probability(p)
        assert q == 1 - round(p * LEVELS) / LEVELS and abs(q - (1 - p)) <= 0.5 / LEVELS
        # a binomial proportion of 10⁶ draws: within 5 standard deviations of q
        assert float(kept.float().mean()) == pytest.approx(q, abs=5 * math.sqrt(q * (1 - q) / x.numel()))
        torch.testing.assert_close(out[kept], x[kept] / q)  # the kept units, scaled by 1/q (float32's rounding)


def test_the_gradient_is_the_same_mask_and_scale():
    torch.manual_seed(1)
    x = (torch.rand(64, 33, dtype=torch.float64) + 0.5).requires_grad_()
    w = torch.randn(64, 33, dtype=torch.float64)
    out = dropout(x, 0.3)
    (out * w).sum().backward()
    q = kept_probability(0.3)
    torch.testing.assert_close(x.grad, torch.where(out != 0, w / q, 0.0))  # float64: rounding only


def test_eval_mode_and_zero_are_the_identity_and_the_seed_repeats_the_mask():
    x = torch.randn(8, 16)
    layer = Dropout(0.2)
    layer.eval()
    assert layer(x) is x and dropout(x, 0.0) is x and dropout(x, 0.5, training=False) is x
    layer.train()
    # The mask is the contract that compares exactly: integers from torch's CPU generator (int64 words, read as
    # 16-bit draws in the machine's byte order, little-endian on x86) compared with an integer threshold, so a
    # seed gives the same booleans on any x86 CPU. The layer's output is that mask times a float scale: a tolerance.
    torch.manual_seed(3)
    first = _keep_mask(x.shape, 0.2)
    torch.manual_seed(3)
    same_seed, next_draw = _keep_mask(x.shape, 0.2), _keep_mask(x.shape, 0.2)
    assert first.dtype == torch.bool and torch.equal(first, same_seed)
    assert not torch.equal(first, next_draw)  # 128 units at p = 0.2: alike by chance with probability 0.68^128 ≈ 4e-22
    torch.manual_seed(3)
    torch.testing.assert_close(layer(x), torch.where(first, x / kept_probability(0.2), 0.0))  # the layer uses it
    assert layer(x).dtype == x.dtype and layer(x.bfloat16()).dtype == torch.bfloat16
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="dropout probability must be in"):
            Dropout(bad)
    assert "p=0.2" in repr(layer)


def test_a_block_drops_each_branch_once():
    """The sublayers drop their own outputs (attention, MLP) and the MLP's hidden units; the block adds none, so a
    branch is dropped once, not twice (which would be dropout 1 - (1 - p)² on it)."""
    block = Block(16, 2, dropout=0.1).train()
    calls = []
    for name, module in block.named_modules():
        if isinstance(module, Dropout):
            module.register_forward_hook(lambda m, i, o, name=name: calls.append(name))
    block(torch.randn(2, 5, 16))
    assert sorted(calls) == ["attn.out_drop", "mlp.drop", "mlp.drop"]  # the MLP's hidden units, then its output
    assert isinstance(block.drop, torch.nn.Identity)  # where stochastic depth goes (ViT's drop_path)


def test_a_compiled_graph_draws_its_mask_with_torchs_dropout(monkeypatch):
    """Under torch.compile the layer is torch's dropout, which the compiler fuses (the "eager" backend traces the
    graph as Inductor would, without compiling it)."""
    import tokennet.dropout as module

    def refused(*args):
        raise AssertionError("the packed CPU mask was drawn inside a compiled graph")

    monkeypatch.setattr(module, "_keep_mask", refused)
    torch.manual_seed(4)
    x = torch.rand(256, 256) + 0.5
    compiled = torch.compile(Dropout(0.25), backend="eager", fullgraph=True)
    out = compiled(x)
    kept = out != 0
    assert float(kept.float().mean()) == pytest.approx(0.75, abs=5 * math.sqrt(0.75 * 0.25 / x.numel()))
    assert torch.allclose(out[kept], x[kept] / 0.75)  # torch's scale, 1 / (1 - p)
