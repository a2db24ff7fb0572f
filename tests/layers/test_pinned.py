"""Pinned float steps (tokennet.layers.pinned): each C++ step computes its layer's formula (up to float32 rounding,
the sums in another order), and an int4 copy gives the same logits, bit for bit, from its eager forward and from a
compiled step, one token at a time or several verified at once."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tokennet import sampling
from tokennet.attention.functional import attention
from tokennet.layers import int8dot, pinned
from tokennet.layers.block import Block
from tokennet.layers.norm import OffsetRMSNorm
from tokennet.layers.quantize import decoding_copy, quantize
from tokennet.models.gpt import GPT, GPTConfig
from tokennet.position.rope import RotaryEmbedding

pytestmark = pytest.mark.skipif(not int8dot.blocks_available(), reason="the int8dot kernel does not run here")

# Where these tests compare exactly, exactness is the contract, on any CPU: both sides run the same C++ functions and
# kernels of this machine on the same inputs, and what Inductor computes between them is one rounding per element,
# the same as PyTorch's, because it fuses no multiply-add (pinned below). Elsewhere: a tolerance.


def test_what_makes_the_paths_agree_is_in_place():
    """Inductor's C++ is built without floating-point contraction (its default): a fused multiply-add would round
    RoPE's ``x·cos + r·sin`` once where PyTorch rounds it three times."""
    from torch._inductor import config

    assert config.cpp.enable_floating_point_contract_flag == "off"


def test_the_kernel_library_is_built_without_contraction_both_ways():
    """The same for the int8dot library, built at install (setup.py) or at first use (int8dot.CFLAGS): its C++
    steps (RoPE's turn and the residuals in block_qkv / block_rest) round each product and sum as PyTorch does."""
    import ast
    from pathlib import Path

    setup = ast.parse((Path(__file__).resolve().parents[2] / "setup.py").read_text())
    lists = [ast.literal_eval(node.value) for node in ast.walk(setup) if isinstance(node, ast.Assign)
             and any(getattr(t, "id", None) == "flags" for t in node.targets)]
    assert lists and all("-ffp-contract=off" in flags for flags in lists)
    assert "-ffp-contract=off" in int8dot.CFLAGS and set(int8dot.CFLAGS) <= set(lists[0])

# A float32 step: the pinned order of a sum of D terms against PyTorch's differs by a few ulps of the result.
TOL = dict(rtol=1e-5, atol=1e-5)


def test_rms_norm_is_the_layers_formula():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 64, generator=g) * 3
    plain = nn.RMSNorm(64, eps=1e-6)
    offset = OffsetRMSNorm(64, eps=1e-6)
    with torch.no_grad():
        plain.weight.normal_(generator=g)
        offset.weight.normal_(generator=g)
    torch.testing.assert_close(pinned.PinnedRMSNorm(plain)(x), plain(x), **TOL)
    torch.testing.assert_close(pinned.PinnedRMSNorm(offset)(x), offset(x), **TOL)
    default_eps = nn.RMSNorm(64)  # eps None: float32's machine epsilon, as PyTorch's
    assert pinned.PinnedRMSNorm(default_eps).eps == torch.finfo(torch.float32).eps


def test_activations_are_the_layers_formulas():
    x = torch.linspace(-12, 12, 4001)
    torch.testing.assert_close(pinned.PinnedActivation("silu")(x), F.silu(x), **TOL)
    torch.testing.assert_close(pinned.PinnedActivation("gelu_tanh")(x), F.gelu(x, approximate="tanh"), **TOL)
    with pytest.raises(ValueError, match="relu"):
        pinned.PinnedActivation("relu")


def test_rope_tables_are_the_layers():
    rope = RotaryEmbedding(32, base=1e4)
    got, want = pinned.PinnedRotary(rope)(7, offset=100), rope(7, offset=100)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("n", [1, 3])
def test_attention_is_the_formula(n):
    """GQA (4 query heads on 2 key heads) over a cache view (its capacity past the length), causal, with a key mask
    and a window; a query with no key gives 0."""
    g = torch.Generator().manual_seed(1)
    B, H, Hkv, L, E = 2, 4, 2, 9, 32
    q = torch.randn(B, H, n, E, generator=g)
    k = torch.randn(B, Hkv, 16, E, generator=g)[:, :, :L]  # a cache's buffer: strides of its capacity
    v = torch.randn(B, Hkv, 16, E, generator=g)[:, :, :L]
    rep = dict(repeats=H // Hkv, dim=1)
    want = attention(q, k.repeat_interleave(**rep), v.repeat_interleave(**rep), None, is_causal=True, backend="math")
    got = pinned.pinned_attention(q, k, v, None, bias=None, dropout=0.0, return_weights=False, is_causal=True)
    torch.testing.assert_close(got, want, **TOL)
    keys = torch.ones(B, 1, 1, L, dtype=torch.bool)
    keys[0, ..., :4] = False  # row 0's first keys are padding
    keys[1] = False  # row 1 has no key: 0
    got = pinned.pinned_attention(q, k, v, keys, bias=None, dropout=0.0, return_weights=False, is_causal=True)
    causal = torch.ones(n, L, dtype=torch.bool).tril(L - n)
    want = attention(q[:1], k[:1].repeat_interleave(**rep), v[:1].repeat_interleave(**rep), keys[:1] & causal,
                     backend="math")
    torch.testing.assert_close(got[:1], want, **TOL)
    assert torch.equal(got[1], torch.zeros_like(got[1]))  # written as zeros: exact anywhere
    # what it leaves to the layer's backend
    assert pinned.pinned_attention(q, k, v, None, bias=torch.zeros(1), dropout=0.0, return_weights=False) is None
    assert pinned.pinned_attention(q.double(), k.double(), v.double(), None, bias=None, dropout=0.0,
                                   return_weights=False) is None


LLAMA = dict(position="rope", norm_layer="rmsnorm", gated_mlp=True, activation="silu", bias=False, num_kv_heads=1,
             rope_base=1e5)
GEMMA = dict(position="rope", norm_layer="rmsnorm1p", qk_norm="rmsnorm1p", norm_placement="sandwich", gated_mlp=True,
             activation="gelu_tanh", bias=False, num_kv_heads=1, head_dim=32, embedding_scale=64 ** 0.5,
             attention_windows=[4, 0], rope_base=1e6, rope_local_base=1e4)


def tiny(**kw) -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=96, block_size=64, dim=64, num_layers=2, num_heads=2, mlp_ratio=2,
                          dropout=0.0, **kw)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


def greedy_logits(net, step, prompt, n) -> list[torch.Tensor]:
    """Each greedy step's logits, ``step(tok, caches)`` after an eager prefill of ``prompt``."""
    caches = net.make_caches(64)
    out = []
    with torch.inference_mode():
        logits = net.forward_head(net.forward_features(prompt, caches=caches))[:, -1]
        for _ in range(n):
            out.append(logits)
            logits = step(logits.argmax(-1, keepdim=True), caches)
    return out


@pytest.mark.parametrize("family", ["llama", "gemma"])
def test_int4_copy_is_pinned_and_keeps_the_unpinned_logits(family, monkeypatch):
    model = tiny(**(LLAMA if family == "llama" else GEMMA))
    net = quantize(model, "int4")
    assert pinned.is_pinned(net)
    kinds = {type(m).__name__ for m in net.modules()}
    assert {"PinnedRMSNorm", "PinnedRotary", "PinnedActivation"} <= kinds and "RMSNorm" not in kinds
    assert not pinned.is_pinned(quantize(model, "bf16"))
    monkeypatch.setattr(pinned, "pin", lambda net, product=None: net)
    unpinned = quantize(model, "int4")  # the same blocks, the layers' own float steps
    assert not pinned.is_pinned(unpinned)
    ids = torch.randint(0, 96, (2, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got, want = net(ids).logits, unpinned(ids).logits
    # float32 steps in another order: an activation now and then rounds to the next integer (a step of 1/127 of
    # its group's largest), so the logits agree to a small fraction of their spread, not to float32's ulps
    assert (got - want).abs().max() <= 0.02 * want.std()


@pytest.mark.parametrize("family", ["llama", "gemma"])
def test_a_pinned_block_computes_the_blocks_own_forward_bit_for_bit(family):
    """PinnedBlock (the block's formulas without its modules' calls) against Block's forward on the same copy: a
    prompt of 8 tokens, then 30 greedy steps, past a window of 4 (gemma): equal logits at every step."""
    net = decoding_copy(tiny(**(LLAMA if family == "llama" else GEMMA)), "int4")
    blocks = list(net.decoder.blocks)
    assert all(type(b) is pinned.PinnedBlock for b in blocks)
    prompt = torch.tensor([[3, 14, 15, 92, 65, 35, 89, 79]])

    def eager(tok, caches):
        return net.forward_head(net.forward_features(tok, caches=caches))[:, -1]

    got = greedy_logits(net, eager, prompt, 30)
    try:
        for b in blocks:
            b.__class__ = Block
        want = greedy_logits(net, eager, prompt, 30)
    finally:
        for b in blocks:
            b.__class__ = pinned.PinnedBlock
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), (i, (a - b).abs().max().item())


@pytest.mark.parametrize("family", ["llama", "gemma"])
def test_the_two_call_block_is_the_blocks_steps_one_call_each_bit_for_bit(family, monkeypatch):
    """block_qkv and block_rest (one C++ call each side of the cache) against the same steps called one by one."""
    net = decoding_copy(tiny(**(LLAMA if family == "llama" else GEMMA)), "int4")
    assert all(b.lean.one_norm is not None for b in net.decoder.blocks)
    prompt = torch.tensor([[3, 14, 15, 92, 65, 35, 89, 79]])

    def eager(tok, caches):
        return net.forward_head(net.forward_features(tok, caches=caches))[:, -1]

    calls = []
    two_calls = pinned.PinnedBlock._in_two_calls
    monkeypatch.setattr(pinned.PinnedBlock, "_in_two_calls", lambda *a: calls.append(1) or two_calls(*a))
    got = greedy_logits(net, eager, prompt, 30)
    assert len(calls) == 31 * len(net.decoder.blocks)  # the prompt and every step, every block
    monkeypatch.setattr(pinned.PinnedBlock, "_in_two_calls", lambda *a: None)
    want = greedy_logits(net, eager, prompt, 30)
    # exactly: the contract (the module comment above), the two calls being the same C++ functions and the same
    # one-rounding steps as the calls one by one, on this machine's kernels
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), (i, (a - b).abs().max().item())


@pytest.mark.parametrize("family", ["llama", "gemma"])
def test_compiled_and_eager_steps_give_the_same_logits_bit_for_bit(family):
    """The contract: a compiled step (Inductor's own loops around the pinned steps) and the eager forward give
    equal logits at every one of 40 greedy steps, past a window of 4 (gemma) — so the same greedy tokens."""
    net = decoding_copy(tiny(**(LLAMA if family == "llama" else GEMMA)), "int4")
    step = sampling.CompiledStep(net)
    prompt = torch.tensor([[3, 14, 15, 92, 65, 35, 89, 79]])

    def eager(tok, caches):
        return net.forward_head(net.forward_features(tok, caches=caches))[:, -1]

    want = greedy_logits(net, eager, prompt, 40)
    got = greedy_logits(net, step, prompt, 40)
    assert step.compiled
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), (i, (a - b).abs().max().item())


def test_a_verification_of_several_tokens_gives_each_steps_logits_bit_for_bit():
    """Speculative decoding's verification (several new tokens in one forward) computes each row as one step does:
    the same logits, so the same greedy tokens as plain decoding."""
    net = decoding_copy(tiny(**GEMMA), "int4")
    prompt = torch.tensor([[3, 14, 15, 92, 65]])
    drafts = torch.tensor([[7, 21, 50, 4, 33, 12]])
    with torch.inference_mode():
        one = net.make_caches(64)
        net.forward_features(prompt, caches=one)
        steps = [net.forward_head(net.forward_features(drafts[:, i:i + 1], caches=one))[0, -1] for i in range(6)]
        many = net.make_caches(64)
        net.forward_features(prompt, caches=many)
        rows = net.forward_head(net.forward_features(drafts, caches=many))[0]
    for i in range(6):
        assert torch.equal(rows[i], steps[i]), i
