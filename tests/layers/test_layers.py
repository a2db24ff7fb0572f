"""MLP, Block (pre/post-norm, cross-attention, token mixer), Encoder and Decoder: references and the
lecture's properties (permutation equivariance, causality, weight sharing, cached decoding)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tokennet.attention import masks
from tokennet.layers import MLP, Block, Decoder, Encoder, TokenMixing
from tokennet.position import RotaryEmbedding, SinusoidalPosition, alibi_bias

D, H = 16, 4
TOL = dict(atol=1e-5, rtol=1e-5)


def _x(*shape, seed=0, requires_grad=False):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    return x.requires_grad_() if requires_grad else x


def _randomize(module: nn.Module, seed: int = 0) -> nn.Module:
    """Random weights everywhere (LayerNorm affine and token-mixing W included), so nothing is trivial."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5 + (1.0 if p.dim() == 1 and p.shape[0] == D else 0.0))
    return module.eval()


# ---- MLP -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, hidden", [(dict(), 4 * D), (dict(mlp_ratio=2.0), 2 * D), (dict(hidden_dim=5), 5)]
)
def test_mlp_shapes(kwargs, hidden):
    mlp = MLP(D, **kwargs)
    assert mlp.fc1.weight.shape == (hidden, D) and mlp.fc2.weight.shape == (D, hidden)
    assert mlp(_x(2, 3, D)).shape == (2, 3, D)
    assert mlp(_x(7, D)).shape == (7, D)


def test_mlp_is_per_token_formula():
    torch.manual_seed(0)
    x = _x(2, 3, D)
    relu, gelu = MLP(D, activation="relu"), MLP(D, activation="gelu")
    gelu.load_state_dict(relu.state_dict())
    torch.testing.assert_close(relu(x), relu.fc2(torch.relu(relu.fc1(x))))
    torch.testing.assert_close(gelu(x), gelu.fc2(nn.functional.gelu(gelu.fc1(x))))
    assert not torch.allclose(relu(x), gelu(x))
    # Per token: the output of token 0 does not depend on the other tokens.
    torch.testing.assert_close(relu(x)[:, :1], relu(x[:, :1]))


def test_mlp_unknown_activation():
    with pytest.raises(ValueError, match=r"unknown activation 'swish'.*gelu"):
        MLP(D, activation="swish")


# ---- Block -----------------------------------------------------------------------------------------


def test_pre_and_post_norm_share_parameter_names_but_differ():
    torch.manual_seed(1)
    pre = _randomize(Block(D, H, norm="pre"))
    post = Block(D, H, norm="post").eval()
    assert [n for n, _ in pre.named_parameters()] == [n for n, _ in post.named_parameters()]
    post.load_state_dict(pre.state_dict())  # names and shapes match exactly
    x = _x(2, 5, D)
    assert not torch.allclose(pre(x), post(x), atol=1e-3)


def test_pre_and_post_norm_cross_blocks_share_parameter_names():
    pre, post = Block(D, H, norm="pre", cross_attention=True), Block(D, H, norm="post", cross_attention=True)
    names = [n for n, _ in pre.named_parameters()]
    assert names == [n for n, _ in post.named_parameters()]
    assert any(n.startswith("cross_attn.") for n in names) and any(n.startswith("norm_cross.") for n in names)


@pytest.mark.parametrize("with_mask", [False, True])
def test_post_norm_block_equals_formula(with_mask):
    blk = _randomize(Block(D, H, norm="post"), seed=2)
    x = _x(2, 5, D, seed=3)
    mask = masks.valid_lengths(torch.tensor([5, 3]), 5) if with_mask else None
    h = blk.norm1(x + blk.attn(x, mask=mask))
    expected = blk.norm2(h + blk.mlp(h))
    torch.testing.assert_close(blk(x, mask=mask), expected, **TOL)


def test_pre_norm_block_equals_formula():
    blk = _randomize(Block(D, H, norm="pre"), seed=4)
    x = _x(2, 5, D, seed=5)
    h = x + blk.attn(blk.norm1(x), is_causal=True)
    expected = h + blk.mlp(blk.norm2(h))
    torch.testing.assert_close(blk(x, is_causal=True), expected, **TOL)


def test_a_norm_free_block_is_x_plus_f_x_with_no_norm_parameters():
    blk = _randomize(Block(D, H, norm="none", cross_attention=True), seed=6)
    assert not any("norm" in n for n, _ in blk.named_parameters())
    assert not any(isinstance(m, (nn.LayerNorm, nn.RMSNorm)) for m in blk.modules())
    x, ctx = _x(2, 5, D, seed=7), _x(2, 3, D, seed=8)
    h = x + blk.attn(x, is_causal=True)
    h = h + blk.cross_attn(h, ctx)
    expected = h + blk.mlp(h)
    torch.testing.assert_close(blk(x, ctx, is_causal=True), expected, **TOL)
    enc = Encoder(D, 2, H, norm="none").eval()  # no final norm either: the stack is its blocks
    expected = enc.blocks[1](enc.blocks[0](x))
    torch.testing.assert_close(enc(x), expected, **TOL)
    with pytest.raises(ValueError, match="norm must be one of"):
        Block(D, H, norm="nope")


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_cross_attention_block_equals_formula(norm):
    blk = _randomize(Block(D, H, norm=norm, cross_attention=True, context_dim=12), seed=6)
    x, ctx = _x(2, 4, D, seed=7), _x(2, 6, 12, seed=8)
    cm = masks.valid_lengths(torch.tensor([6, 2]), 6)
    if norm == "pre":
        h = x + blk.attn(blk.norm1(x), is_causal=True)
        h = h + blk.cross_attn(blk.norm_cross(h), ctx, mask=cm)
        expected = h + blk.mlp(blk.norm2(h))
    else:
        h = blk.norm1(x + blk.attn(x, is_causal=True))
        h = blk.norm_cross(h + blk.cross_attn(h, ctx, mask=cm))
        expected = blk.norm2(h + blk.mlp(h))
    torch.testing.assert_close(blk(x, ctx, is_causal=True, context_mask=cm), expected, **TOL)


def test_cross_attention_block_requires_context():
    blk = Block(D, H, cross_attention=True)
    with pytest.raises(ValueError, match="context"):
        blk(_x(1, 3, D))


def test_context_to_block_without_cross_attention_raises():
    blk = Block(D, H)
    with pytest.raises(ValueError, match="cross_attention=True"):
        blk(_x(1, 3, D), _x(1, 4, D))


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(norm="mid"), "norm"), (dict(mixer="conv"), "mixer"), (dict(mixer="token"), "num_tokens")],
)
def test_block_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Block(D, H, **kwargs)


# ---- Encoder: permutation equivariance -------------------------------------------------------------


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_encoder_without_positions_is_permutation_equivariant(norm):
    torch.manual_seed(9)
    enc = Encoder(D, 2, H, norm=norm).eval()
    x = _x(2, 7, D, seed=10)
    perm = torch.randperm(7, generator=torch.Generator().manual_seed(11))
    torch.testing.assert_close(enc(x[:, perm]), enc(x)[:, perm], atol=1e-5, rtol=1e-5)
    # With a key-padding mask permuted along with the tokens.
    is_pad = torch.tensor([[False] * 7, [False] * 4 + [True] * 3])
    out = enc(x, mask=masks.padding(is_pad))
    torch.testing.assert_close(enc(x[:, perm], mask=masks.padding(is_pad[:, perm])), out[:, perm], **TOL)


def test_encoder_with_positions_is_not_permutation_equivariant():
    torch.manual_seed(12)
    enc = Encoder(D, 2, H).eval()
    pos = SinusoidalPosition(D)
    x = _x(2, 7, D, seed=13)
    perm = torch.randperm(7, generator=torch.Generator().manual_seed(14))
    assert not torch.allclose(enc(pos(x[:, perm])), enc(pos(x))[:, perm], atol=1e-3)


def test_encoder_with_rope_is_not_permutation_equivariant():
    torch.manual_seed(15)
    enc = Encoder(D, 2, H).eval()
    rope = RotaryEmbedding(D // H)(7)
    x = _x(2, 7, D, seed=16)
    perm = torch.randperm(7, generator=torch.Generator().manual_seed(17))
    assert not torch.allclose(enc(x[:, perm], rope=rope), enc(x, rope=rope)[:, perm], atol=1e-3)


# ---- Decoder: causality ----------------------------------------------------------------------------


def _assert_causal(f, N: int):
    """d f(x)[:, t] / d x[:, s] is exactly 0 for s > t and nonzero for some s <= t."""
    x = _x(2, N, D, seed=18, requires_grad=True)
    out = f(x)
    w = _x(*out.shape, seed=99)  # a random projection: the plain sum of a LayerNorm output is constant
    for t in range(N):
        (g,) = torch.autograd.grad((out[:, t] * w[:, t]).sum(), x, retain_graph=True)
        assert bool((g[:, t + 1 :] == 0).all()), f"output {t} depends on a later input"
        assert bool((g[:, : t + 1].abs().sum(-1) > 0).any()), f"output {t} depends on nothing before it"
        assert bool((g[:, t].abs().sum(-1) > 0).all())


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_decoder_is_causal(backend, norm):
    torch.manual_seed(19)
    dec = Decoder(D, 2, H, norm=norm, backend=backend).eval()
    _assert_causal(dec, 6)


def test_decoder_with_alibi_and_rope_is_causal():
    torch.manual_seed(20)
    dec = Decoder(D, 2, H).eval()
    rope, bias = RotaryEmbedding(D // H)(6), alibi_bias(H, 6)
    _assert_causal(lambda x: dec(x, rope=rope, bias=bias), 6)


def test_encoder_is_not_causal():
    torch.manual_seed(21)
    enc = Encoder(D, 1, H).eval()
    x = _x(1, 4, D, requires_grad=True)
    (g,) = torch.autograd.grad((enc(x)[:, 0] * _x(1, D, seed=99)).sum(), x)
    assert bool((g[:, 1:].abs().sum(-1) > 0).all())


# ---- weight sharing ---------------------------------------------------------------------------------


def _numel(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_shared_weights_apply_one_block_repeatedly(norm):
    torch.manual_seed(22)
    enc = Encoder(D, 3, H, norm=norm, share_weights=True).eval()
    assert len(enc.blocks) == 1
    assert _numel(enc) == _numel(enc.blocks[0]) + _numel(enc.norm)
    assert _numel(Encoder(D, 3, H, norm=norm)) == 3 * _numel(enc.blocks[0]) + _numel(enc.norm)
    assert all(b is enc.blocks[0] for b in enc.layers()) and len(enc.layers()) == 3
    x = _x(2, 5, D, seed=23)
    h = x
    for _ in range(3):
        h = enc.blocks[0](h)
    torch.testing.assert_close(enc(x), enc.norm(h), **TOL)
    # One application is not the same as three.
    assert not torch.allclose(enc(x), enc.norm(enc.blocks[0](x)), atol=1e-4)


# ---- token mixer -----------------------------------------------------------------------------------


def test_token_mixer_is_input_independent_attention_is_not():
    torch.manual_seed(24)
    tok = Block(D, H, mixer="token", num_tokens=8).eval()
    assert isinstance(tok.attn, TokenMixing)
    nn.init.normal_(tok.attn.W)  # at init W = 0 (uniform mixing): make it non-trivial
    att = Block(D, H).eval()
    x1, x2 = _x(2, 6, D, seed=25), _x(2, 6, D, seed=26)
    w1 = tok(x1, return_weights=True)[1]["self"]
    w2 = tok(x2, return_weights=True)[1]["self"]
    assert w1.shape == (2, 1, 6, 6)
    torch.testing.assert_close(w1, w2)  # the same W for every input ...
    torch.testing.assert_close(w1[0], w1[1])  # ... and every batch entry
    torch.testing.assert_close(w1.sum(-1), torch.ones(2, 1, 6))
    assert not torch.allclose(w1[..., 0], w1[..., 1])  # and it is not uniform
    a1 = att(x1, return_weights=True)[1]["self"]
    a2 = att(x2, return_weights=True)[1]["self"]
    assert a1.shape == (2, H, 6, 6)
    assert not torch.allclose(a1, a2, atol=1e-4)  # attention's A depends on the input


def test_token_mixer_formula():
    torch.manual_seed(27)
    mix = TokenMixing(D, 8).eval()
    nn.init.normal_(mix.W)
    x = _x(2, 5, D, seed=28)
    w = torch.softmax(mix.W[:5, :5], dim=-1)
    torch.testing.assert_close(mix(x), mix.out_proj(w @ mix.v_proj(x)), **TOL)


def test_token_mixer_is_causal():
    torch.manual_seed(29)
    blk = Block(D, H, mixer="token", num_tokens=6).eval()
    nn.init.normal_(blk.attn.W)
    _assert_causal(lambda x: blk(x, is_causal=True), 6)
    dec = Decoder(D, 2, H, mixer="token", num_tokens=6).eval()
    for b in dec.blocks:
        nn.init.normal_(b.attn.W)
    _assert_causal(dec, 6)


def test_token_mixer_rejects_long_sequences_and_context():
    blk = Block(D, H, mixer="token", num_tokens=4)
    with pytest.raises(ValueError, match="num_tokens=4"):
        blk(_x(1, 5, D))
    with pytest.raises(ValueError, match="cross"):
        blk.attn(_x(1, 3, D), _x(1, 3, D))
    with pytest.raises(ValueError, match="num_tokens"):
        TokenMixing(D, 0)


def test_token_mixer_decoder_with_cache_matches_full_pass_or_refuses():
    """A decoder whose mixer ignores the KV cache must not decode silently wrong."""
    torch.manual_seed(30)
    dec = Decoder(D, 1, H, mixer="token", num_tokens=5).eval()
    nn.init.normal_(dec.blocks[0].attn.W)
    x = _x(1, 5, D, seed=31)
    full = dec(x)
    caches = dec.make_caches(5)
    try:
        stepped = torch.cat([dec(x[:, t : t + 1], caches=caches) for t in range(5)], dim=1)
    except ValueError:
        return
    torch.testing.assert_close(stepped, full, **TOL)


# ---- Decoder: cached decoding ----------------------------------------------------------------------


@pytest.mark.parametrize("share_weights", [False, True])
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_decoder_cached_decoding_equals_full_pass(share_weights, norm):
    torch.manual_seed(32)
    dec = Decoder(D, 2, H, cross_attention=True, context_dim=12, share_weights=share_weights, norm=norm).eval()
    N, M = 6, 5
    x, ctx = _x(2, N, D, seed=33), _x(2, M, 12, seed=34)
    cm = masks.valid_lengths(torch.tensor([M, 3]), M)
    rot = RotaryEmbedding(D // H)
    full = dec(x, ctx, context_mask=cm, rope=rot(N))
    caches, cross = dec.make_caches(N), dec.make_cross_caches()
    assert len(caches) == len(cross) == 2
    outs, t = [], 0
    for n in (2, 1, 1, 2):  # a prompt, then single tokens, then a chunk
        outs.append(dec(x[:, t : t + n], ctx, context_mask=cm, rope=rot(n, t), caches=caches, cross_caches=cross))
        t += n
    torch.testing.assert_close(torch.cat(outs, dim=1), full, **TOL)
    assert all(c.length == N for c in caches) and all(c.length == M for c in cross)


def test_decoder_cached_decoding_with_alibi():
    torch.manual_seed(35)
    dec = Decoder(D, 2, H).eval()
    x = _x(1, 5, D, seed=36)
    full = dec(x, bias=alibi_bias(H, 5))
    caches = dec.make_caches(5)
    outs = [dec(x[:, t : t + 1], bias=alibi_bias(H, 1, t + 1), caches=caches) for t in range(5)]
    torch.testing.assert_close(torch.cat(outs, dim=1), full, **TOL)


def test_decoder_context_errors():
    with pytest.raises(ValueError, match="context"):
        Decoder(D, 1, H, cross_attention=True)(_x(1, 3, D))
    with pytest.raises(ValueError, match="cross_attention=True"):
        Decoder(D, 1, H)(_x(1, 3, D), _x(1, 2, D))
    with pytest.raises(ValueError, match="num_layers"):
        Encoder(D, 0, H)


def test_encoder_takes_a_mask_per_layer():
    """A list of masks, one per depth, is the blocks run one by one with their own mask (a window in the first
    layer only, say); a list of the wrong length is an error."""
    torch.manual_seed(0)
    enc = Encoder(16, 2, 2).eval()
    x = torch.randn(2, 5, 16)
    first = torch.eye(5, dtype=torch.bool)  # layer 0: each token sees only itself
    out = enc(x, mask=[first, None])
    want = enc.norm(enc.blocks[1](enc.blocks[0](x, mask=first), mask=None))
    torch.testing.assert_close(out, want)
    assert not torch.allclose(out, enc(x))
    with pytest.raises(ValueError, match="a mask per layer"):
        enc(x, mask=[first])
