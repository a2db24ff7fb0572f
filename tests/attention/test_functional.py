"""``attention()`` and ``masked_softmax``: backend parity (outputs and gradients) for every mask kind,
empty rows give zeros without NaN, attention rows sum to 1, and bad input raises a clear ValueError."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support import make_mask, out_and_grads, qkv

from tokennet.attention import masks
from tokennet.attention.functional import BACKENDS, attention, masked_softmax

SETTINGS = settings(max_examples=40, deadline=None)
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float64: dict(atol=1e-10, rtol=1e-9)}
MASK_KINDS = ("none", "causal", "lengths", "lengths_per_query", "padding", "prefix", "adjacency")


try:  # the tiled backend is written separately; test it wherever it imports
    import tokennet.attention.flash  # noqa: F401

    HAS_FLASH = True
except ImportError:
    HAS_FLASH = False


def _backends() -> list:
    """math and sdpa always; 'flash' only when its module imports."""
    flash = pytest.param("flash", marks=pytest.mark.skipif(not HAS_FLASH, reason="tokennet.attention.flash absent"))
    return ["math", "sdpa", flash]


def _assert_backends_agree(q, k, v, mask, bias, *, is_causal, tol, backends=("sdpa",)):
    leaves = [t for t in (q, k, v, bias) if t is not None]
    ref, ref_grads = out_and_grads(
        lambda: attention(q, k, v, mask, bias=bias, is_causal=is_causal, backend="math"), leaves
    )
    assert not ref.isnan().any()
    for backend in backends:
        out, grads = out_and_grads(
            lambda b=backend: attention(q, k, v, mask, bias=bias, is_causal=is_causal, backend=b), leaves
        )
        torch.testing.assert_close(out, ref, **tol, msg=lambda m, b=backend: f"{b} output: {m}")
        for name, g, r in zip("qkvb", grads, ref_grads, strict=False):
            assert not g.isnan().any(), f"{backend}: NaN in grad of {name}"
            torch.testing.assert_close(g, r, **tol, msg=lambda m, b=backend, n=name: f"{b} grad {n}: {m}")


@st.composite
def problems(draw):
    kind = draw(st.sampled_from(MASK_KINDS))
    Hkv = draw(st.integers(1, 2))
    H = Hkv * draw(st.integers(1, 3))  # grouped-query: Hkv divides H
    B = draw(st.integers(1, 3))
    Nq = draw(st.integers(1, 5))
    if kind == "adjacency":
        Nk = Nq
    elif kind in ("causal", "prefix"):
        Nk = Nq + draw(st.integers(0, 3))
    else:
        Nk = draw(st.integers(1, 6))
    E = draw(st.integers(1, 6))
    Ev = draw(st.integers(1, 5))
    bias_shape = draw(st.sampled_from([None, (H, Nq, Nk), (B, H, Nq, Nk), (Nq, Nk), (B, 1, 1, Nk)]))
    is_causal = kind in ("none", "lengths", "padding") and Nk >= Nq and draw(st.booleans())
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    seed = draw(st.integers(0, 2**16))
    return dict(kind=kind, B=B, H=H, Hkv=Hkv, Nq=Nq, Nk=Nk, E=E, Ev=Ev, bias_shape=bias_shape,
                is_causal=is_causal, dtype=dtype, seed=seed)


@given(p=problems())
@SETTINGS
def test_math_and_sdpa_agree_on_outputs_and_gradients(p):
    q, k, v = qkv(p["B"], p["H"], p["Nq"], p["Nk"], p["E"], p["Ev"], Hkv=p["Hkv"], dtype=p["dtype"], seed=p["seed"])
    g = torch.Generator().manual_seed(p["seed"] + 1)
    mask = make_mask(p["kind"], p["B"], p["Nq"], p["Nk"], g)
    bias = None
    if p["bias_shape"] is not None:
        bias = torch.randn(p["bias_shape"], generator=g, dtype=p["dtype"]).requires_grad_()
    _assert_backends_agree(q, k, v, mask, bias, is_causal=p["is_causal"], tol=TOL[p["dtype"]])


@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("with_bias", [False, True])
def test_every_mask_kind_math_equals_sdpa_float32(kind, with_bias):
    B, H, Hkv, Nq, E, Ev = 2, 4, 2, 5, 8, 6
    Nk = Nq if kind == "adjacency" else 7
    q, k, v = qkv(B, H, Nq, Nk, E, Ev, Hkv=Hkv, dtype=torch.float32, seed=3)
    mask = make_mask(kind, B, Nq, Nk, torch.Generator().manual_seed(4))
    bias = torch.randn(H, Nq, Nk).requires_grad_() if with_bias else None
    _assert_backends_agree(q, k, v, mask, bias, is_causal=False, tol=TOL[torch.float32])


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("Nq, Nk, Hkv", [(5, 5, 4), (5, 5, 2), (3, 7, 1), (1, 6, 2), (4, 4, 1)])
def test_is_causal_equals_explicit_causal_mask(backend, Nq, Nk, Hkv):
    q, k, v = qkv(2, 4, Nq, Nk, 8, 8, Hkv=Hkv, dtype=torch.float64, seed=5)
    leaves = [q, k, v]
    ref, ref_grads = out_and_grads(
        lambda: attention(q, k, v, masks.causal(Nq, Nk), backend="math"), leaves
    )
    out, grads = out_and_grads(lambda: attention(q, k, v, is_causal=True, backend=backend), leaves)
    torch.testing.assert_close(out, ref, **TOL[torch.float64])
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, **TOL[torch.float64])


@pytest.mark.parametrize("backend", _backends())
def test_is_causal_combines_with_a_mask_and_a_bias(backend):
    Nq, Nk = 4, 6
    q, k, v = qkv(2, 2, Nq, Nk, 4, 4, dtype=torch.float64, seed=6)
    bias = torch.randn(2, Nq, Nk, dtype=torch.float64)
    pad = masks.valid_lengths(torch.tensor([6, 3]), Nk)
    ref = attention(q, k, v, pad & masks.causal(Nq, Nk), bias=bias, backend="math")
    out = attention(q, k, v, pad, bias=bias, is_causal=True, backend=backend)
    torch.testing.assert_close(out, ref, **TOL[torch.float64])


def test_is_causal_with_fewer_keys_than_queries_raises():
    q, k, v = qkv(1, 1, 4, 3, 2, 2, dtype=torch.float32, seed=0)
    with pytest.raises(ValueError, match="fewer keys"):
        attention(q, k, v, is_causal=True)


def test_auto_backend_equals_math():
    q, k, v = qkv(2, 2, 3, 5, 4, 4, Hkv=1, dtype=torch.float64, seed=7)
    m = masks.valid_lengths(torch.tensor([0, 2]), 5)
    torch.testing.assert_close(attention(q, k, v, m), attention(q, k, v, m, backend="math"))
    out, a = attention(q, k, v, m, return_weights=True)  # auto switches to math to form A
    torch.testing.assert_close(out, attention(q, k, v, m, backend="math"))
    assert a.shape == (2, 2, 3, 5) and torch.equal(a[0], torch.zeros_like(a[0]))  # length 0: empty rows


def test_math_backend_is_the_formula():
    q, k, v = qkv(2, 3, 4, 5, 6, 2, dtype=torch.float64, seed=8)
    ref = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(6), dim=-1) @ v
    torch.testing.assert_close(attention(q, k, v, backend="math"), ref)
    ref2 = torch.softmax(q @ k.transpose(-2, -1) * 0.3, dim=-1) @ v
    torch.testing.assert_close(attention(q, k, v, scale=0.3, backend="sdpa"), ref2)


# ---- fully masked rows -----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fully_masked_row_gives_zeros_and_no_nan(backend, dtype, with_bias):
    B, H, Nq, Nk, E = 2, 2, 4, 5, 4
    q, k, v = qkv(B, H, Nq, Nk, E, E, dtype=dtype, seed=9)
    lengths = torch.tensor([[0, 2, 0, 5], [3, 0, 1, 0]])  # some queries may attend to nothing
    mask = masks.valid_lengths(lengths, Nk)
    bias = torch.randn(B, H, Nq, Nk, dtype=dtype).requires_grad_() if with_bias else None
    leaves = [t for t in (q, k, v, bias) if t is not None]
    out, grads = out_and_grads(lambda: attention(q, k, v, mask, bias=bias, backend=backend), leaves)
    empty = (lengths == 0)[:, None, :, None].expand_as(out)  # (B, H, Nq, Ev)
    assert not out.isnan().any()
    assert bool((out[empty] == 0).all()), "an empty row must give exactly 0"
    assert bool((out[~empty] != 0).all())
    for t, g in zip(leaves, grads, strict=True):
        assert not g.isnan().any() and not g.isinf().any()
        assert g.shape == t.shape
    gq = grads[0]
    assert bool((gq[(lengths == 0)[:, None, :, None].expand_as(gq)] == 0).all()), "empty rows get no q grad"
    if with_bias:  # a bias entry that is masked (here: every entry of an empty row) has no influence
        gb = grads[3]
        assert bool((gb[~mask.expand_as(gb)] == 0).all())


@pytest.mark.parametrize("backend", _backends())
def test_everything_masked_gives_zeros(backend):
    q, k, v = qkv(1, 2, 3, 3, 4, 4, dtype=torch.float32, seed=10)
    mask = torch.zeros(3, 3, dtype=torch.bool)
    out, grads = out_and_grads(lambda: attention(q, k, v, mask, backend=backend), [q, k, v])
    assert torch.equal(out, torch.zeros_like(out))
    for g in grads:
        assert torch.equal(g, torch.zeros_like(g))


@pytest.mark.parametrize("backend", _backends())
def test_adjacency_with_isolated_node_matches_math(backend):
    adj = torch.tensor([[0, 1, 1, 0], [0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0]])  # node 1 isolated
    mask = masks.adjacency(adj, self_loops=False)
    q, k, v = qkv(2, 2, 4, 4, 3, 3, dtype=torch.float64, seed=11)
    ref, ref_grads = out_and_grads(lambda: attention(q, k, v, mask, backend="math"), [q, k, v])
    out, grads = out_and_grads(lambda: attention(q, k, v, mask, backend=backend), [q, k, v])
    assert torch.equal(out[:, :, 1], torch.zeros_like(out[:, :, 1]))
    torch.testing.assert_close(out, ref, **TOL[torch.float64])
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, **TOL[torch.float64])


# ---- masked_softmax --------------------------------------------------------------------------------


@given(
    shape=st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 5), st.integers(1, 6)),
    seed=st.integers(0, 2**16),
    p=st.floats(0.0, 1.0),
)
@SETTINGS
def test_masked_softmax_properties(shape, seed, p):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(shape, generator=g, dtype=torch.float64) * 5
    mask = torch.rand(shape, generator=g) < p
    a = masked_softmax(scores, mask)
    assert not a.isnan().any()
    has_any = mask.any(-1)
    torch.testing.assert_close(a.sum(-1)[has_any], torch.ones_like(a.sum(-1)[has_any]))
    assert bool((a[~mask] == 0).all()), "masked entries must be exactly 0"
    assert bool((a[~has_any] == 0).all()), "fully masked rows must be all zeros"
    assert bool((a >= 0).all())
    # On the valid entries it is the softmax restricted to them.
    ref = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    torch.testing.assert_close(a[has_any], ref[has_any])


def test_masked_softmax_without_mask_is_softmax():
    s = torch.randn(2, 3, 4, 5)
    torch.testing.assert_close(masked_softmax(s), torch.softmax(s, dim=-1))
    torch.testing.assert_close(masked_softmax(s, dim=1), torch.softmax(s, dim=1))
    all_true = torch.ones(5, dtype=torch.bool)
    torch.testing.assert_close(masked_softmax(s, all_true), torch.softmax(s, dim=-1))


def test_masked_softmax_gradients_are_finite_for_empty_rows():
    s = torch.randn(3, 4, requires_grad=True)
    mask = torch.tensor([[True, False, True, False], [False] * 4, [True] * 4])
    a = masked_softmax(s, mask)
    a.pow(2).sum().backward()
    assert not s.grad.isnan().any()
    assert torch.equal(s.grad[1], torch.zeros(4)) and bool((s.grad[0, [1, 3]] == 0).all())


def test_masked_softmax_rejects_non_bool_mask():
    with pytest.raises(ValueError, match="boolean"):
        masked_softmax(torch.randn(2, 3), torch.ones(2, 3))


# ---- return_weights --------------------------------------------------------------------------------


def test_return_weights_rows_sum_to_one_and_masked_entries_are_zero():
    B, H, N, E = 2, 3, 5, 4
    q, k, v = qkv(B, H, N, N, E, E, dtype=torch.float64, seed=12)
    mask = masks.causal(N) & masks.valid_lengths(torch.tensor([5, 3]), N)
    out, a = attention(q, k, v, mask, return_weights=True, backend="math")
    assert a.shape == (B, H, N, N)
    torch.testing.assert_close(a.sum(-1), torch.ones(B, H, N, dtype=torch.float64))
    full = mask.expand(B, H, N, N)
    assert bool((a[~full] == 0).all())
    torch.testing.assert_close(out, a @ v)


def test_attention_is_not_symmetric():
    """Separate q and k: A ≠ Aᵀ and the scores q_aᵀ k_b ≠ q_bᵀ k_a in general."""
    N, E = 6, 4
    q, k, v = qkv(1, 1, N, N, E, E, dtype=torch.float64, seed=13)
    _, a = attention(q, k, v, return_weights=True)
    assert not torch.allclose(a, a.transpose(-2, -1))
    s = q @ k.transpose(-2, -1)
    assert not torch.allclose(s, s.transpose(-2, -1))
    assert not torch.isclose(q[0, 0, 0] @ k[0, 0, 1], q[0, 0, 1] @ k[0, 0, 0])


def test_return_weights_with_gqa_repeats_kv_heads():
    q, k, v = qkv(1, 4, 3, 3, 2, 2, Hkv=2, dtype=torch.float64, seed=14)
    _, a = attention(q, k, v, return_weights=True)
    kr = k.repeat_interleave(2, dim=1)
    ref = torch.softmax(q @ kr.transpose(-2, -1) / math.sqrt(2), dim=-1)
    torch.testing.assert_close(a, ref)


# ---- errors ----------------------------------------------------------------------------------------


def _ok():
    return (torch.randn(2, 4, 3, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 6))


@pytest.mark.parametrize(
    "change, kwargs, match",
    [
        (lambda q, k, v: (q[0], k, v), {}, r"q must have shape \(B, H, N, E\), got \(4, 3, 8\)"),
        (lambda q, k, v: (q, k[0], v), {}, r"k must have shape"),
        (lambda q, k, v: (q.double(), k, v), {}, r"share a dtype.*float64.*float32"),
        (lambda q, k, v: (q.long(), k.long(), v.long()), {}, r"floating point"),
        (lambda q, k, v: (q, k[..., :4], v), {}, r"same head width E, got q 8 and k 4"),
        (lambda q, k, v: (q, k, v[:, :, :4]), {}, r"same \(B, H, Nk\)"),
        (lambda q, k, v: (q, k[:1], v[:1]), {}, r"batch sizes differ"),
        (lambda q, k, v: (q[:, :3], k, v), {}, r"query heads \(3\) must be a multiple of key/value heads \(2\)"),
        (lambda q, k, v: (q, k, v), dict(mask=torch.ones(3, 4, dtype=torch.bool)), r"does not broadcast"),
        (lambda q, k, v: (q, k, v), dict(mask=torch.ones(3, 5)), r"boolean.*float32"),
        (lambda q, k, v: (q, k, v), dict(bias=torch.ones(3, 4)), r"bias of shape \(3, 4\) does not broadcast"),
        (lambda q, k, v: (q, k, v), dict(bias=torch.ones(3, 5, dtype=torch.long)), r"float tensor"),
        (lambda q, k, v: (q, k, v), dict(backend="fast"), r"unknown attention backend 'fast'.*math"),
        (
            lambda q, k, v: (q, k, v),
            dict(backend="sdpa", return_weights=True),
            r"return_weights=True needs backend 'math' or 'auto', got 'sdpa'",
        ),
    ],
    ids=[
        "3d-q", "3d-k", "dtype", "int-dtype", "head-width", "kv-mismatch", "batch", "gqa-heads",
        "mask-shape", "mask-dtype", "bias-shape", "bias-dtype", "backend", "weights-sdpa",
    ],
)
def test_bad_input_raises_value_error(change, kwargs, match):
    q, k, v = change(*_ok())
    mask = kwargs.pop("mask", None)
    with pytest.raises(ValueError, match=match):
        attention(q, k, v, mask, **kwargs)


def test_backends_are_listed():
    assert set(BACKENDS) == {"auto", "math", "sdpa", "flash"}
