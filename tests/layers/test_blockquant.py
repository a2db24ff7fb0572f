"""GGUF blocks as layers: bit for bit llama.cpp's quantization (through the ``gguf`` package), the fused sum equal
to the plain formula, the embedding/LM-head tie, and a GPT that holds blocks saving and loading unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support import assert_same_function
from torch import nn

from tokennet.errors import ConfigError
from tokennet.layers.blockquant import (
    QUANTIZE_FORMATS as FORMATS,
)
from tokennet.layers.blockquant import (
    BlockEmbedding,
    BlockLinear,
    block_bytes,
    dequantize_blocks,
    quantize_blocks,
)
from tokennet.models import create_model
from tokennet.models.registry import load_pretrained, save_pretrained

pytestmark = pytest.mark.usefixtures("one_thread")


def _weights(n=40, k=96):
    torch.manual_seed(0)
    w = torch.randn(n, k)
    w[3, :32] = 0  # an all-zero block: scale 0, no division by zero
    w[5, 32:64] = 7.0  # a constant block: Q4_1's range is 0
    return w


def _raw(fmt, qs, d, m):
    """The bytes a GGUF file holds for these blocks: per block d (f16), [m (f16)], qs."""
    n, g = d.shape
    parts = [d.view(torch.uint8).view(n, g, 2)]
    if m is not None:
        parts.append(m.view(torch.uint8).view(n, g, 2))
    parts.append(qs.view(torch.uint8).view(n, g, -1))
    return torch.cat(parts, -1).reshape(n, -1).numpy()


@pytest.mark.parametrize("fmt", FORMATS)
def test_blocks_are_llama_cpp_bits_and_values(fmt):
    gguf = pytest.importorskip("gguf")
    from gguf.quants import dequantize, quantize

    w = _weights()
    kind = gguf.GGMLQuantizationType[fmt.upper()]
    raw = quantize(w.numpy(), kind)
    qs, d, m = quantize_blocks(w, fmt)
    assert np.array_equal(_raw(fmt, qs, d, m), raw)  # the same bytes as the gguf package (ggml's reference)
    assert raw.shape[1] == w.shape[1] // 32 * block_bytes(fmt)
    assert np.array_equal(dequantize_blocks(fmt, qs, d, m).numpy(), dequantize(raw, kind))  # the same floats


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantization_error_is_within_half_a_step(fmt):
    w = _weights()
    qs, d, m = quantize_blocks(w, fmt)
    err = (dequantize_blocks(fmt, qs, d, m) - w).abs().view(40, 3, 32)
    step = d.float().abs()[..., None]  # one quantization step per block (f16 scales add a little)
    # Q4_0 maps the weight of largest magnitude to −8·d, so the other end (+8·d) is clipped to 7·d: one step.
    bound = 1.0 if fmt == "q4_0" else 0.5
    assert (err <= bound * step * 1.01 + 1e-3).all()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("bias", [False, True])
def test_block_linear_is_the_dequantized_linear_and_the_fused_sum_agrees(fmt, bias):
    torch.manual_seed(0)
    lin = nn.Linear(96, 40, bias=bias)
    b = BlockLinear.from_float(lin, fmt)
    x = torch.randn(2, 3, 96)
    w = b.dequantized_weight()
    assert torch.equal(b(x), F.linear(x, w, b.bias))  # eager: the plain formula
    ref = F.linear(x.view(6, 96).double(), w.double()).float()
    fused = b._fused(x.view(6, 96))  # what a compiled step computes, written without W
    torch.testing.assert_close(fused, ref, rtol=1e-5, atol=1e-5)
    assert (b.dequantized_weight() - lin.weight).abs().max() < 0.2  # close to the float layer


def test_block_embedding_rows_and_the_tie():
    torch.manual_seed(0)
    head = BlockLinear.from_float(nn.Linear(64, 50, bias=False), "q8_0")
    emb = BlockEmbedding(head)
    assert emb.qs is head.qs and emb.d is head.d  # one set of blocks
    ids = torch.tensor([[0, 7, 49], [3, 3, 1]])
    assert torch.equal(emb(ids), head.dequantized_weight()[ids])


def test_bad_blocks_are_refused():
    with pytest.raises(ValueError, match="divisible by 32"):
        BlockLinear(48, 8, "q4_0")
    with pytest.raises(ValueError, match="block format"):
        BlockLinear(64, 8, "q5_1")
    with pytest.raises(ValueError, match="divisible by 256"):
        BlockLinear(64, 8, "q4_k")
    b = BlockLinear(64, 8, "q4_1")
    with pytest.raises(ValueError, match="block tensor qs"):
        b.set_blocks(torch.zeros(8, 64, dtype=torch.uint8), b.d, b.m)


QUANTIZED = {"decoder.blocks.*.attn.qkv_proj": "q4_1", "decoder.blocks.*.mlp.fc1": "q4_0", "tok_emb": "q8_0"}


def test_gpt_with_blocks_saves_loads_and_keeps_the_tie(tmp_path):
    torch.manual_seed(0)
    m = create_model("gpt-micro", vocab_size=64, block_size=32, bias=False, quantized=QUANTIZED)
    assert isinstance(m.tok_emb, BlockEmbedding) and isinstance(m.lm_head, BlockLinear)
    assert m.tok_emb.qs is m.lm_head.qs  # tied: one table
    assert isinstance(m.decoder.blocks[1].attn.qkv_proj, BlockLinear) and m.decoder.blocks[1].mlp.fc1.fmt == "q4_0"
    assert type(m.decoder.blocks[0].mlp.fc2) is nn.Linear
    for mod in m.modules():  # random blocks, as an imported file would hold
        if isinstance(mod, BlockLinear):
            mod.set_blocks(*quantize_blocks(torch.randn(mod.out_features, mod.in_features) * 0.05, mod.fmt))
    m.tok_emb.qs, m.tok_emb.d = m.lm_head.qs, m.lm_head.d
    plain = create_model("gpt-micro", vocab_size=64, block_size=32, bias=False)
    assert m.num_parameters() == plain.num_parameters()  # a weight in blocks counts as one parameter
    save_pretrained(m, tmp_path / "m")
    back = load_pretrained(tmp_path / "m").eval()
    assert back.tok_emb.qs.data_ptr() == back.lm_head.qs.data_ptr()
    x = m.example_input(2)
    with torch.no_grad():
        assert_same_function(back(x).logits, m.eval()(x).logits)  # read from the file: other memory, other kernels


@pytest.mark.parametrize("quantized, match", [
    ({"decoder.blocks.*.mlp.fc1": "q5_1"}, "block formats"),
    ({"decoder.blocks.*.mlp.fc1": "q4_k"}, "multiple of 256"),
    ({"decoder.blocks.*.mlp.fc9": "q4_0"}, "does not have"),
    ({"decoder.blocks.*.norm1": "q4_0"}, "not a linear layer"),
    ({"tok_emb": "q8_0", "lm_head": "q4_0"}, "one format"),
])
def test_bad_quantized_field_is_a_config_error(quantized, match):
    with pytest.raises(ConfigError, match=match):
        create_model("gpt-micro", vocab_size=64, block_size=32, quantized=quantized)


def test_a_width_blocks_cannot_take_is_a_config_error():
    with pytest.raises(ConfigError, match="multiple of 32"):
        create_model("gpt-micro", vocab_size=64, block_size=32, dim=48, num_heads=4,
                     quantized={"decoder.blocks.*.mlp.fc1": "q4_0"})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_gemv_is_the_linear_product(dtype):
    """The sum of products a compiled step fuses (``gemv``) against ``F.linear`` on the same (converted) weight."""
    from tokennet.layers.blockquant import gemv

    g = torch.Generator().manual_seed(0)
    w = (torch.randn(40, 64, generator=g) * 20).to(dtype)
    x = torch.randn(3, 64, generator=g)
    torch.testing.assert_close(gemv(x, w), F.linear(x.double(), w.double()).float(), rtol=1e-5, atol=1e-4)
