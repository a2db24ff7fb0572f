"""MultiHeadAttention against torch.nn.MultiheadAttention, grouped-query heads, the KV cache, no stale weights."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from tokennet.attention import masks
from tokennet.attention.multihead import KVCache, MultiHeadAttention
from tokennet.position import RotaryEmbedding, alibi_bias

TOL = dict(atol=1e-5, rtol=1e-5)
D, H = 16, 4


def _pair(dim=D, heads=H, *, seed=0, bias=True):
    """Our MHA and torch's, with the same weights."""
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(dim, heads, batch_first=True, bias=bias).eval()
    with torch.no_grad():  # torch initializes its in-projection bias to 0: make it count
        if bias:
            ref.in_proj_bias.normal_()
            ref.out_proj.bias.normal_()
    ours = MultiHeadAttention(dim, heads, bias=bias).eval()
    with torch.no_grad():  # torch's in_proj is [W_q; W_k; W_v], the layout of our qkv_proj
        ours.qkv_proj.weight.copy_(ref.in_proj_weight)
        if bias:
            ours.qkv_proj.bias.copy_(ref.in_proj_bias)
        ours.out_proj.weight.copy_(ref.out_proj.weight)
        if bias:
            ours.out_proj.bias.copy_(ref.out_proj.bias)
    return ours, ref


def _x(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ---- torch.nn.MultiheadAttention as the reference -------------------------------------------------


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("bias", [True, False])
def test_self_attention_equals_torch(backend, bias):
    ours, ref = _pair(bias=bias)
    ours.backend = backend
    x = _x(2, 5, D)
    expected, w_ref = ref(x, x, x, need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(ours(x), expected, **TOL)
    out, w = ours(x, return_weights=True)
    torch.testing.assert_close(out, expected, **TOL)
    assert w.shape == (2, H, 5, 5)
    torch.testing.assert_close(w, w_ref, **TOL)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_cross_attention_equals_torch(backend):
    ours, ref = _pair(seed=2)
    ours.backend = backend
    x, ctx = _x(2, 3, D, seed=3), _x(2, 7, D, seed=4)
    expected, w_ref = ref(x, ctx, ctx, need_weights=True, average_attn_weights=False)
    out, w = ours(x, ctx, return_weights=True)
    torch.testing.assert_close(out, expected, **TOL)
    torch.testing.assert_close(w, w_ref, **TOL)
    assert w.shape == (2, H, 3, 7)
    torch.testing.assert_close(ours(x, ctx), expected, **TOL)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("cross", [False, True])
def test_key_padding_mask_equals_torch(backend, cross):
    ours, ref = _pair(seed=5)
    ours.backend = backend
    x = _x(3, 4, D, seed=6)
    ctx = _x(3, 6, D, seed=7) if cross else x
    M = ctx.shape[1]
    lengths = torch.tensor([M, 2, 1])
    is_pad = torch.arange(M)[None, :] >= lengths[:, None]  # (B, M), True at padding
    # torch: True = NOT allowed; ours: True = may attend.
    expected, w_ref = ref(x, ctx, ctx, key_padding_mask=is_pad, need_weights=True, average_attn_weights=False)
    mask = masks.padding(is_pad)
    out, w = ours(x, ctx if cross else None, mask=mask, return_weights=True)
    torch.testing.assert_close(out, expected, **TOL)
    torch.testing.assert_close(w, w_ref, **TOL)
    torch.testing.assert_close(ours(x, ctx if cross else None, mask=masks.valid_lengths(lengths, M)), expected, **TOL)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_causal_mask_equals_torch(backend):
    ours, ref = _pair(seed=8)
    ours.backend = backend
    N = 6
    x = _x(2, N, D, seed=9)
    attn_mask = ~masks.causal(N)  # torch: True = not allowed
    expected, w_ref = ref(x, x, x, attn_mask=attn_mask, need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(ours(x, mask=masks.causal(N)), expected, **TOL)
    torch.testing.assert_close(ours(x, is_causal=True), expected, **TOL)
    _, w = ours(x, is_causal=True, return_weights=True)
    torch.testing.assert_close(w, w_ref, **TOL)
    # Causal and padding together.
    is_pad = torch.tensor([[False] * N, [False] * 4 + [True] * 2])
    expected = ref(x, x, x, attn_mask=attn_mask, key_padding_mask=is_pad, need_weights=False)[0]
    torch.testing.assert_close(ours(x, mask=masks.padding(is_pad), is_causal=True), expected, **TOL)


# ---- construction errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(dim=10, num_heads=3), r"num_heads=3 must divide dim=10"),
        (dict(dim=16, num_heads=4, num_kv_heads=3), r"num_kv_heads=3 must divide num_heads=4"),
        (dict(dim=16, num_heads=4, backend="cuda"), r"unknown attention backend 'cuda'"),
        (dict(dim=16, num_heads=0), r"positive"),
        (dict(dim=16, num_heads=4, dropout=1.0), r"dropout"),
    ],
    ids=["heads", "kv-heads", "backend", "zero-heads", "dropout"],
)
def test_bad_construction_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MultiHeadAttention(**kwargs)


def test_explicit_head_dim_need_not_divide_dim():
    mha = MultiHeadAttention(10, 3, head_dim=4)
    assert mha(torch.randn(2, 5, 10)).shape == (2, 5, 10)


def test_bad_input_raises():
    mha = MultiHeadAttention(D, H)
    with pytest.raises(ValueError, match=r"x must have shape \(B, N, 16\)"):
        mha(torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match="context must have shape"):
        mha(torch.randn(2, 5, D), torch.randn(3, 4, D))
    with pytest.raises(ValueError, match="rope"):
        cos, sin = RotaryEmbedding(D // H)(5)
        mha(torch.randn(2, 5, D), torch.randn(2, 4, D), rope=(cos, sin))


# ---- grouped-query attention -----------------------------------------------------------------------


def _gqa_reference(mha: MultiHeadAttention, x, ctx=None, mask=None):
    """The formula with each key/value head repeated for its group of query heads."""
    ctx = x if ctx is None else ctx
    B, N, _ = x.shape
    M = ctx.shape[1]
    E, Hq, Hkv = mha.head_dim, mha.num_heads, mha.num_kv_heads
    k, v = mha.project_kv(ctx)
    q = mha.project_q(x).view(B, N, Hq, E).transpose(1, 2)
    k = k.reshape(B, M, Hkv, E).transpose(1, 2).repeat_interleave(Hq // Hkv, dim=1)
    v = v.reshape(B, M, Hkv, E).transpose(1, 2).repeat_interleave(Hq // Hkv, dim=1)
    s = q @ k.transpose(-2, -1) / math.sqrt(E)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    out = torch.softmax(s, dim=-1) @ v  # (B, H, N, E)
    return mha.out_proj(out.transpose(1, 2).reshape(B, N, Hq * E))


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("num_kv_heads", [1, 2])
def test_grouped_query_attention_equals_repeated_kv_heads(backend, num_kv_heads):
    torch.manual_seed(10)
    mha = MultiHeadAttention(D, H, num_kv_heads=num_kv_heads, backend=backend).eval()
    assert mha.qkv_proj.out_features == D + 2 * num_kv_heads * (D // H)
    x = _x(2, 5, D, seed=11)
    torch.testing.assert_close(mha(x), _gqa_reference(mha, x), **TOL)
    torch.testing.assert_close(mha(x, is_causal=True), _gqa_reference(mha, x, mask=masks.causal(5)), **TOL)
    ctx = _x(2, 3, D, seed=12)
    torch.testing.assert_close(mha(x, ctx), _gqa_reference(mha, x, ctx), **TOL)


# ---- KV cache --------------------------------------------------------------------------------------


def _decode(mha, x, chunks, **per_step):
    """Feed ``x`` through ``mha`` in chunks of the given sizes with a KV cache; concatenate the outputs."""
    cache = KVCache(max_len=x.shape[1])
    outs, t = [], 0
    for n in chunks:
        kw = {name: f(n, t) for name, f in per_step.items()}
        outs.append(mha(x[:, t : t + n], is_causal=True, cache=cache, **kw))
        t += n
    assert t == x.shape[1] and cache.length == t
    return torch.cat(outs, dim=1)


CHUNKS = [[1] * 7, [3, 1, 2, 1], [7]]


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("num_kv_heads", [H, 2])
@pytest.mark.parametrize("chunks", CHUNKS, ids=["tokens", "mixed", "one"])
def test_kv_cache_equals_full_causal_pass(backend, num_kv_heads, chunks):
    torch.manual_seed(13)
    mha = MultiHeadAttention(D, H, num_kv_heads=num_kv_heads, backend=backend).eval()
    x = _x(2, 7, D, seed=14)
    full = mha(x, is_causal=True)
    torch.testing.assert_close(_decode(mha, x, chunks), full, **TOL)


@pytest.mark.parametrize("chunks", CHUNKS, ids=["tokens", "mixed", "one"])
def test_kv_cache_with_rope_equals_full_pass(chunks):
    torch.manual_seed(15)
    mha = MultiHeadAttention(D, H).eval()
    rot = RotaryEmbedding(D // H)
    x = _x(2, 7, D, seed=16)
    full = mha(x, is_causal=True, rope=rot(7))
    # Without rope the result differs: the test is not vacuous.
    assert not torch.allclose(full, mha(x, is_causal=True), atol=1e-4)
    stepped = _decode(mha, x, chunks, rope=lambda n, t: rot(n, t))
    torch.testing.assert_close(stepped, full, **TOL)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("chunks", CHUNKS, ids=["tokens", "mixed", "one"])
def test_kv_cache_with_alibi_equals_full_pass(backend, chunks):
    torch.manual_seed(17)
    mha = MultiHeadAttention(D, H, backend=backend).eval()
    x = _x(2, 7, D, seed=18)
    full = mha(x, is_causal=True, bias=alibi_bias(H, 7, 7))
    assert not torch.allclose(full, mha(x, is_causal=True), atol=1e-4)
    stepped = _decode(mha, x, chunks, bias=lambda n, t: alibi_bias(H, n, t + n))
    torch.testing.assert_close(stepped, full, **TOL)


def test_static_cross_cache_equals_recomputing_context():
    torch.manual_seed(19)
    mha = MultiHeadAttention(D, H, context_dim=12).eval()
    ctx = _x(2, 5, 12, seed=20)
    x = _x(2, 4, D, seed=21)
    ctx_mask = masks.valid_lengths(torch.tensor([5, 3]), 5)
    cache = KVCache(static=True)
    outs = [mha(x[:, t : t + 1], ctx, mask=ctx_mask, cache=cache) for t in range(4)]
    k_first = cache.k
    assert cache.length == 5 and k_first is not None
    torch.testing.assert_close(torch.cat(outs, 1), mha(x, ctx, mask=ctx_mask), **TOL)
    # Later steps read the cache: the keys are the ones computed at the first step.
    mha(x[:, :1], ctx, cache=cache)
    assert cache.k is k_first


def test_kv_cache_overflow_and_reset():
    mha = MultiHeadAttention(D, H).eval()
    cache = KVCache(max_len=3)
    x = _x(1, 4, D)
    mha(x[:, :3], is_causal=True, cache=cache)
    with pytest.raises(ValueError, match="KV cache full"):
        mha(x[:, 3:], is_causal=True, cache=cache)
    cache.reset()
    assert cache.length == 0
    torch.testing.assert_close(mha(x[:, :2], is_causal=True, cache=cache), mha(x[:, :2], is_causal=True), **TOL)


def test_kv_cache_reorder_selects_batch_rows():
    torch.manual_seed(22)
    mha = MultiHeadAttention(D, H).eval()
    x = _x(3, 4, D, seed=23)
    cache = KVCache(max_len=4)
    mha(x[:, :3], is_causal=True, cache=cache)
    index = torch.tensor([2, 0])
    cache.reorder(index)
    out = mha(x[index, 3:], is_causal=True, cache=cache)
    torch.testing.assert_close(out, mha(x[index], is_causal=True)[:, 3:], **TOL)


# ---- weights are parameters, never a stale copy (issue: fused AdamW does not bump _version) ------------


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("context_dim", [None, 12])
def test_no_grad_forward_sees_every_optimizer_update(fused, context_dim):
    """After no-grad calls, an optimizer step and another no-grad call, the layer equals a fresh copy."""
    torch.manual_seed(0)
    m = MultiHeadAttention(32, 4, context_dim=context_dim)
    x = torch.randn(2, 5, 32)
    ctx = None if context_dim is None else torch.randn(2, 3, context_dim)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, fused=fused, foreach=None if fused else True)
    for _ in range(3):
        with torch.no_grad():
            m(x, ctx)  # an evaluation between steps
        m(x, ctx).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        twin = MultiHeadAttention(32, 4, context_dim=context_dim)
        twin.load_state_dict(m.state_dict())
        with torch.no_grad():
            torch.testing.assert_close(m(x, ctx), twin(x, ctx), rtol=0, atol=0)


def test_in_place_parameter_changes_show_without_autograd():
    m = MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        before = m(x)
        m.qkv_proj.weight[16:32].add_(1.0)  # W_k changed in place, as p.copy_/optimizers do
        after = m(x)
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, m(x))  # grad mode: the same parameters


def test_self_and_cross_layers_hold_their_projections_as_parameters():
    self_attn = MultiHeadAttention(16, 4, num_kv_heads=2)
    assert sorted(n for n, _ in self_attn.named_parameters()) == [
        "out_proj.bias", "out_proj.weight", "qkv_proj.bias", "qkv_proj.weight"]
    cross = MultiHeadAttention(16, 4, num_kv_heads=2, context_dim=12)
    assert sorted(n for n, _ in cross.named_parameters()) == [
        "kv_proj.bias", "kv_proj.weight", "out_proj.bias", "out_proj.weight", "q_proj.bias", "q_proj.weight"]
    assert cross.kv_proj.weight.shape == (2 * 2 * 4, 12)
    with pytest.raises(ValueError, match="cross-attention layer"):
        cross(torch.randn(1, 3, 16))
    with pytest.raises(ValueError, match="context must have shape"):
        cross(torch.randn(1, 3, 16), torch.randn(1, 2, 16))


def _legacy_state(m: MultiHeadAttention) -> dict:
    """The state dict the layer had before Q/K/V were fused: separate q_proj, k_proj, v_proj."""
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    out = {k: v for k, v in sd.items() if k.startswith("out_proj")}
    for part in ("weight", "bias"):
        if m.is_cross:
            q, kv = sd[f"q_proj.{part}"], sd[f"kv_proj.{part}"]
        else:
            q, kv = sd[f"qkv_proj.{part}"].split([m.q_dim, 2 * m.kv_dim])
        k, v = kv.split(m.kv_dim)
        out.update({f"q_proj.{part}": q, f"k_proj.{part}": k, f"v_proj.{part}": v})
    return out


@pytest.mark.parametrize("context_dim", [None, 12])
def test_checkpoints_with_separate_qkv_projections_still_load(context_dim):
    torch.manual_seed(3)
    m = MultiHeadAttention(16, 4, num_kv_heads=2, context_dim=context_dim).eval()
    legacy = _legacy_state(m)
    assert "k_proj.weight" in legacy and not any(k.startswith(("qkv_proj", "kv_proj")) for k in legacy)
    fresh = MultiHeadAttention(16, 4, num_kv_heads=2, context_dim=context_dim).eval()
    result = fresh.load_state_dict(legacy)  # strict: nothing missing, nothing unexpected
    assert not result.missing_keys and not result.unexpected_keys
    x = torch.randn(2, 5, 16)
    ctx = None if context_dim is None else torch.randn(2, 3, context_dim)
    torch.testing.assert_close(fresh(x, ctx), m(x, ctx))


@pytest.mark.parametrize("num_kv_heads", [1, 2, 6])
def test_one_query_attention_equals_sdpa(num_kv_heads):
    """The elementwise form a compiled decoding step uses: one query per head against a cache, GQA included."""
    import torch.nn.functional as F

    from tokennet.attention.multihead import one_query_attention

    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 6, 1, 8, generator=g)
    k, v = (torch.randn(2, num_kv_heads, 13, 8, generator=g) for _ in range(2))
    want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(one_query_attention(q, k, v), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("num_kv_heads", [1, 3])
def test_one_query_attention_with_a_per_key_mask_equals_sdpa(num_kv_heads):
    """The serving engine's rows at their own lengths: a (B, 1, 1, L) key mask, as SDPA applies it."""
    import torch.nn.functional as F

    from tokennet.attention.multihead import one_query_attention

    g = torch.Generator().manual_seed(1)
    q = torch.randn(3, 6, 1, 8, generator=g)
    k, v = (torch.randn(3, num_kv_heads, 11, 8, generator=g) for _ in range(2))
    lengths = torch.tensor([10, 0, 4])  # row b attends to keys 0..lengths[b]
    mask = (torch.arange(11)[None, :] <= lengths[:, None])[:, None, None, :]  # (3, 1, 1, 11)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    got = one_query_attention(q, k, v, mask)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # the masked keys are not read: changing them changes nothing
    k2, v2 = k.clone(), v.clone()
    k2[1, :, 1:], v2[1, :, 1:] = 1e3, -1e3
    torch.testing.assert_close(one_query_attention(q, k2, v2, mask), got)
    # a row with no key left is 0, as attention() gives it (SDPA alone would give NaN)
    from tokennet.attention.functional import attention

    mask[2] = False
    torch.testing.assert_close(one_query_attention(q, k, v, mask), attention(q, k, v, mask), rtol=1e-5, atol=1e-6)
    assert one_query_attention(q, k, v, mask)[2].abs().max() == 0


def test_a_kernel_installed_from_outside_takes_the_calls_it_answers_and_leaves_the_rest():
    """``use_kernel``: a decoding engine chooses a kernel for some calls without a branch of its own inside the
    lecture's attention; a kernel answering None leaves the call to the layer's backend (compared with a float
    tolerance: the same kernels on the same input, but nothing here pins them)."""
    from tokennet.attention.multihead import use_kernel

    torch.manual_seed(0)
    net = nn.Sequential(MultiHeadAttention(16, 4), MultiHeadAttention(16, 4)).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        plain = net[1](net[0](x))
        seen = []
        use_kernel(net, lambda q, k, v, mask, **kw: seen.append(q.shape) or None)  # takes nothing
        torch.testing.assert_close(net[1](net[0](x)), plain)  # the backend's own computation again
        assert seen == [(2, 4, 5, 4)] * 2
        use_kernel(net, lambda q, k, v, mask, **kw: torch.zeros_like(q))  # takes every call: A V = 0
        torch.testing.assert_close(net[0](x), net[0].out_proj(torch.zeros(2, 5, 16)))
        use_kernel(net, None)
        torch.testing.assert_close(net[1](net[0](x)), plain)
