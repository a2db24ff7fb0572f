"""The free token mixer (``TokenMixing(free=True)``): ``T_out = W T_in W_v W_o`` with W used as it is."""

import pytest
import torch

from tokennet.attention.masks import causal
from tokennet.layers.mixer import TokenMixing

pytestmark = pytest.mark.usefixtures("one_thread")


@torch.no_grad()
def test_free_w_is_used_as_it_is_not_softmaxed():
    torch.manual_seed(0)
    m = TokenMixing(4, 5, free=True)
    assert torch.allclose(m.W, torch.full((5, 5), 0.2))  # uniform rows at init, like the softmax of zeros
    m.W.copy_(torch.randn(5, 5))  # negative entries and rows that do not sum to 1: allowed
    x = torch.randn(2, 5, 4)
    y, w = m(x, return_weights=True)
    assert torch.allclose(w[0, 0], m.W)
    want = m.out_proj(m.W @ m.v_proj(x))
    assert torch.allclose(y, want, atol=1e-6)
    soft = TokenMixing(4, 5)
    soft.load_state_dict(m.state_dict())
    assert not torch.allclose(soft(x), y, atol=1e-3)  # the softmaxed mixer differs on the same weights


@torch.no_grad()
def test_free_w_masked_entries_contribute_nothing_and_short_inputs_use_the_top_left_block():
    torch.manual_seed(0)
    m = TokenMixing(3, 6, free=True)
    m.W.copy_(torch.randn(6, 6))
    x = torch.randn(1, 4, 3)
    _, w = m(x, is_causal=True, return_weights=True)
    assert torch.equal(w[0, 0], m.W[:4, :4] * causal(4).float())
    y = m(x, is_causal=True)
    x2 = x.clone()
    x2[:, 3] += 1.0  # the last token changes: earlier outputs do not
    assert torch.allclose(m(x2, is_causal=True)[:, :3], y[:, :3])
