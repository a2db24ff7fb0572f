"""The tiled 'flash' backend equals the plain-math backend: outputs and gradients, for every mask kind."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support import make_mask, out_and_grads, qkv

from tokennet.attention import masks
from tokennet.attention.flash import _live_tiles, flash_attention
from tokennet.attention.functional import attention

DT = torch.float64  # tight tolerances: any difference is a bug, not rounding
TOL = dict(atol=1e-10, rtol=1e-9)


def _assert_flash_equals_math(q, k, v, mask=None, bias=None, *, is_causal=False, block_q=3, block_k=4):
    leaves = [t for t in (q, k, v, bias) if t is not None and t.requires_grad]
    ref, ref_grads = out_and_grads(
        lambda: attention(q, k, v, mask, bias=bias, is_causal=is_causal, backend="math"), leaves
    )
    # Through the public entry point (default blocks) ...
    out, grads = out_and_grads(
        lambda: attention(q, k, v, mask, bias=bias, is_causal=is_causal, backend="flash"), leaves
    )
    torch.testing.assert_close(out, ref, **TOL)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, **TOL)
    # ... and directly, with small blocks (many tiles, ragged last tiles) and is_causal passed through.
    if q.shape[1] == k.shape[1]:
        out, grads = out_and_grads(
            lambda: flash_attention(q, k, v, mask, bias=bias, is_causal=is_causal, block_q=block_q, block_k=block_k),
            leaves,
        )
        torch.testing.assert_close(out, ref, **TOL)
        for g, r in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(g, r, **TOL)
    assert torch.isfinite(out).all()


KINDS = [
    "none",
    "causal",
    "lengths",
    "lengths_per_query",
    "padding",
    "prefix",
    "adjacency",
    "causal_and_padding",
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("with_bias", [False, True])
def test_every_mask_kind_matches_math(kind, with_bias):
    B, H, Nq, E, Ev = 2, 3, 10, 4, 5
    Nk = Nq if kind == "adjacency" else 13  # n_k > n_q: queries are the last n_q positions
    g = torch.Generator().manual_seed(7)
    q, k, v = qkv(B, H, Nq, Nk, E, Ev)
    bias = torch.randn(1, H, Nq, Nk, generator=g, dtype=DT).requires_grad_() if with_bias else None
    _assert_flash_equals_math(q, k, v, make_mask(kind, B, Nq, Nk, g), bias, block_q=3, block_k=4)


@pytest.mark.parametrize("Nq,Nk", [(1, 1), (6, 6), (5, 11), (1, 9), (9, 9)])
@pytest.mark.parametrize("blocks", [(2, 3), (4, 4), (128, 128)])
def test_is_causal_matches_math(Nq, Nk, blocks):
    q, k, v = qkv(2, 2, Nq, Nk, 4, 3, seed=Nq * 100 + Nk)
    _assert_flash_equals_math(q, k, v, is_causal=True, block_q=blocks[0], block_k=blocks[1])


@pytest.mark.parametrize("bias_shape", [(1, 1, 1, 1), (3, 1, 1), (2, 1, 7, 1), (7, 9), (2, 3, 7, 9)])
def test_broadcast_bias_gradient(bias_shape):
    q, k, v = qkv(2, 3, 7, 9, 4, 4)
    bias = torch.randn(bias_shape, dtype=DT).requires_grad_()
    mask = masks.valid_lengths(torch.tensor([0, 5]), 9)
    _assert_flash_equals_math(q, k, v, mask, bias, block_q=3, block_k=2)


def test_grouped_query_heads_through_functional():
    q, k, v = qkv(2, 4, 6, 8, 4, 4, Hkv=2)
    _assert_flash_equals_math(q, k, v, masks.causal(6, 8))


def test_empty_rows_give_zeros_and_zero_gradients():
    q, k, v = qkv(2, 2, 5, 7, 4, 4)
    mask = masks.valid_lengths(torch.tensor([[0, 3, 0, 7, 1], [0, 0, 0, 0, 0]]), 7)
    out = flash_attention(q, k, v, mask, block_q=2, block_k=3)
    assert torch.isfinite(out).all()
    assert (out[0, :, [0, 2]] == 0).all() and (out[1] == 0).all()
    dq, dk, dv = torch.autograd.grad(out.sum(), (q, k, v))
    assert all(torch.isfinite(t).all() for t in (dq, dk, dv))
    assert (dq[0, :, [0, 2]] == 0).all() and (dq[1] == 0).all() and (dk[1] == 0).all()


def test_gradcheck_recomputation_backward():
    g = torch.Generator().manual_seed(3)
    q, k, v = qkv(1, 2, 4, 6, 3, 2, seed=3)
    bias = torch.randn(2, 4, 1, generator=g, dtype=DT).requires_grad_()
    mask = masks.valid_lengths(torch.tensor([[0, 6, 2, 4]]), 6) & masks.prefix(1, 4, 6)

    def fn(q, k, v, bias):
        return flash_attention(q, k, v, mask, bias=bias, is_causal=True, block_q=3, block_k=2)

    assert torch.autograd.gradcheck(fn, (q, k, v, bias))


def test_masked_key_tiles_are_skipped():
    # Keys 4..7 are padding for every sequence: with block_k=4 their tile is never read, so even NaN
    # values there cannot leak in. (Any backend that multiplies 0 · NaN would return NaN.)
    q, k, v = qkv(2, 2, 5, 8, 4, 4)
    is_pad = torch.arange(8) >= 4
    k, v = k.detach().clone(), v.detach().clone()
    k[:, :, 4:] = float("nan")
    v[:, :, 4:] = float("nan")
    out = flash_attention(q, k, v, masks.padding(is_pad.expand(2, 8)), block_q=2, block_k=4)
    assert torch.isfinite(out).all()


def test_causal_tiles_above_the_diagonal_are_skipped():
    blocks = [(0, 4), (4, 8), (8, 10)]
    live = _live_tiles(None, blocks, blocks, is_causal=True, offset=0)
    assert live == [["partial", "skip", "skip"], ["full", "partial", "skip"], ["full", "full", "partial"]]


def test_float32_close_to_math():
    q, k, v = qkv(1, 2, 130, 130, 16, 16, dtype=torch.float32)
    ref = attention(q, k, v, is_causal=True, backend="math")
    out = flash_attention(q, k, v, is_causal=True, block_q=64, block_k=48)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)


def test_errors():
    q, k, v = qkv(1, 2, 4, 4, 3, 3)
    with pytest.raises(ValueError, match="dropout"):
        flash_attention(q, k, v, dropout=0.1)
    with pytest.raises(ValueError, match="dropout"):
        attention(q, k, v, dropout=0.1, backend="flash")
    with pytest.raises(ValueError, match="block_q"):
        flash_attention(q, k, v, block_q=0)
    with pytest.raises(ValueError, match="boolean"):
        flash_attention(q, k, v, torch.ones(4, 4))
    with pytest.raises(ValueError, match="expand"):
        flash_attention(q, k[:, :1], v[:, :1])
    with pytest.raises(ValueError, match="is_causal"):
        flash_attention(q, k[:, :, :2], v[:, :, :2], is_causal=True)


@settings(max_examples=40, deadline=None)
@given(
    B=st.integers(1, 2),
    H=st.integers(1, 2),
    Nq=st.integers(1, 9),
    extra_k=st.integers(0, 6),
    E=st.integers(1, 5),
    Ev=st.integers(1, 5),
    block_q=st.integers(1, 6),
    block_k=st.integers(1, 6),
    kind=st.sampled_from(KINDS),
    with_bias=st.booleans(),
    is_causal=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_random_shapes_match_math(
    B, H, Nq, extra_k, E, Ev, block_q, block_k, kind, with_bias, is_causal, seed
):
    Nk = Nq if kind == "adjacency" else Nq + extra_k
    g = torch.Generator().manual_seed(seed)
    q, k, v = qkv(B, H, Nq, Nk, E, Ev, seed=seed)
    bias = torch.randn(B, 1, Nq, Nk, generator=g, dtype=DT).requires_grad_() if with_bias else None
    mask = make_mask(kind, B, Nq, Nk, g)
    _assert_flash_equals_math(q, k, v, mask, bias, is_causal=is_causal, block_q=block_q, block_k=block_k)
