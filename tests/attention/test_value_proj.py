"""``MultiHeadAttention(value_proj=False)``: W_v = I, the lecture's "one could simply take W_v to be the identity"."""

import pytest
import torch

from tokennet.attention.multihead import MultiHeadAttention
from tokennet.position.rope import RotaryEmbedding

pytestmark = pytest.mark.usefixtures("one_thread")


@torch.no_grad()
def test_values_are_the_tokens_themselves():
    torch.manual_seed(0)
    attn = MultiHeadAttention(8, 2, value_proj=False)
    attn.out_proj.weight.copy_(torch.eye(8))
    attn.out_proj.bias.zero_()
    x = torch.randn(3, 5, 8)
    y, a = attn(x, return_weights=True)  # a (B, H, N, N)
    heads = x.view(3, 5, 2, 4).transpose(1, 2)  # (B, H, N, E): head h's values are its slice of x
    want = (a @ heads).transpose(1, 2).reshape(3, 5, 8)
    assert torch.allclose(y, want, atol=1e-6)
    assert torch.allclose(attn(x), y, atol=1e-5)  # the fused backend agrees with the plain formula
    full = MultiHeadAttention(8, 2)
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert n(full) - n(attn) == 8 * 8 + 8  # W_v and its bias are gone


@torch.no_grad()
def test_rope_causal_and_cross_attention_paths_take_identity_values():
    torch.manual_seed(0)
    attn = MultiHeadAttention(8, 2, value_proj=False)
    x = torch.randn(2, 6, 8)
    cos, sin = RotaryEmbedding(4)(6)
    y = attn(x, is_causal=True, rope=(cos, sin))
    q, k, v = attn.project_qkv(x)
    assert v is x
    x2 = x.clone()
    x2[:, -1] += 1
    assert torch.allclose(attn(x2, is_causal=True, rope=(cos, sin))[:, :-1], y[:, :-1], atol=1e-6)
    cross = MultiHeadAttention(8, 2, context_dim=8, value_proj=False)
    c = torch.randn(2, 3, 8)
    assert cross.project_kv(c)[1] is c
    assert cross(x, c).shape == (2, 6, 8)


def test_identity_values_need_the_context_width():
    with pytest.raises(ValueError, match="value_proj=False"):
        MultiHeadAttention(8, 2, head_dim=3, value_proj=False)
    with pytest.raises(ValueError, match="value_proj=False"):
        MultiHeadAttention(8, 2, context_dim=6, value_proj=False)
