"""The block-by-block cross-entropy against ``F.cross_entropy``: value, gradient, ignored rows, dtypes."""

import math

import pytest
import torch
import torch.nn.functional as F

import tokennet.layers.cross_entropy as ce
from tokennet.layers.cross_entropy import cross_entropy


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(ce, "_BLOCK_BYTES", 4 * 37 * 3)  # 3 rows a block at V = 37: blocks and a ragged last one


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_equals_torch_cross_entropy_in_value_and_gradient(dtype, small_blocks):
    torch.manual_seed(0)
    z = (torch.randn(20, 37) * 4).to(dtype).requires_grad_()
    y = torch.randint(0, 37, (20,))
    y[[1, 7, 8]] = -100  # ignored rows: no loss, zero gradient
    got = cross_entropy(z, y)
    (got * 1.7).backward()  # an upstream gradient other than 1
    g_got, z.grad = z.grad, None
    want = F.cross_entropy(z.float(), y, ignore_index=-100)  # what bf16 autocast computes: the loss in float32
    (want * 1.7).backward()
    assert got.dtype == torch.float32 and g_got.dtype == dtype
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(g_got, z.grad, rtol=1e-5 if dtype == torch.float32 else 1e-2, atol=1e-7)
    assert g_got[[1, 7, 8]].abs().max() == 0


def test_every_row_ignored_gives_nan_as_torch_does_and_other_ignore_index():
    z = torch.randn(4, 5, requires_grad=True)
    assert math.isnan(cross_entropy(z, torch.full((4,), -100)).item())
    assert math.isnan(F.cross_entropy(z, torch.full((4,), -100)).item())
    y = torch.tensor([0, 3, 3, 1])
    torch.testing.assert_close(cross_entropy(z, y, ignore_index=3), F.cross_entropy(z, y, ignore_index=3))


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="logits"):
        cross_entropy(torch.randn(2, 3, 4), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="targets"):
        cross_entropy(torch.randn(6, 4), torch.zeros(5, dtype=torch.long))


def test_a_gpt_loss_is_the_mean_token_cross_entropy_of_its_logits():
    from tokennet.models import create_model

    torch.manual_seed(0)
    m = create_model("gpt-micro", vocab_size=50, block_size=16)
    x, y = torch.randint(0, 50, (2, 16)), torch.randint(0, 50, (2, 16))
    y[0, :3] = -100
    out = m(x, y)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits.reshape(-1, 50), y.reshape(-1)))
