"""GGUF's Q4_K / Q5_K / Q6_K super-blocks × int8 activations with integer dot products (AVX-512 VNNI): the block
layout decoded as the ``gguf`` package's reference dequantizers decode it, and the kernel bit for bit the formula of
``int8dot.kblock_reference`` (random blocks, several shapes, float32 and bf16 rows, 1 and 2 threads)."""

from __future__ import annotations

import pytest
import torch

from tokennet.layers import int8dot
from tokennet.layers.blockquant import block_bytes, raw_dequantize

pytestmark = pytest.mark.usefixtures("one_thread")

needs_kernel = pytest.mark.skipif(not int8dot.available(), reason=f"int8dot: {int8dot.unavailable_reason()}")
FORMATS = int8dot.KBLOCK_FORMATS


def random_raw(fmt: str, N: int, K: int, seed: int) -> torch.Tensor:
    """Random GGUF bytes ``(N, K/256 · B)``: every integer and scale bit random, the float16 d (and dmin) set to
    finite values of varied size (random bits would give infinities and NaNs)."""
    g = torch.Generator().manual_seed(seed)
    B, T = block_bytes(fmt), K // 256
    raw = torch.randint(0, 256, (N, T, B), generator=g, dtype=torch.uint8)
    for o in (208,) if fmt == "q6_k" else (0, 2):
        d = torch.rand(N, T, 1, generator=g) * 10.0 ** torch.randint(-4, 0, (N, T, 1), generator=g)
        raw[..., o : o + 2] = d.half().view(torch.uint8)
    return raw.reshape(N, T * B)


def random_q5_0(N: int, K: int, seed: int) -> torch.Tensor:
    """Random Q5_0 blocks ``(N, K/32 · 22)``: random bits, a finite float16 d in bytes 0-1 of each."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (N, K // 32, 22), generator=g, dtype=torch.uint8)
    raw[..., 0:2] = (torch.rand(N, K // 32, 1, generator=g) * 0.01).half().view(torch.uint8)
    return raw.reshape(N, -1)


def gguf_dequantize(fmt: str, raw: torch.Tensor) -> torch.Tensor:
    from gguf import GGMLQuantizationType, quants

    return torch.from_numpy(quants.dequantize(raw.numpy(), GGMLQuantizationType[fmt.upper()])).float()


@pytest.mark.parametrize("fmt", FORMATS)
def test_parts_are_ggmls_layout(fmt):
    pytest.importorskip("gguf")
    raw = random_raw(fmt, 7, 768, 0)
    q, sc, m, d, dmin = int8dot.kblock_parts(fmt, raw)
    assert int(q.max()) == {"q4_k": 15, "q5_k": 31, "q6_k": 63}[fmt] and int(q.min()) == 0
    assert torch.equal(int8dot.kblock_dequantize(fmt, q, sc, m, d, dmin), gguf_dequantize(fmt, raw))
    assert torch.equal(raw_dequantize(fmt, raw), gguf_dequantize(fmt, raw))


@needs_kernel
@pytest.mark.parametrize("fmt", FORMATS)
def test_pack_keeps_the_blocks(fmt):
    raw = random_raw(fmt, 37, 512, 1)
    packed = int8dot.pack_kblocks(fmt, raw)
    assert packed.shape == (3, 2, int8dot.kblock_super_bytes(fmt)) and packed.dtype == torch.uint8
    # the file's bytes per super-block, 16 rows, plus (Q4_K, Q5_K) 4 bytes for the scales held a byte each
    assert int8dot.kblock_super_bytes(fmt) == 16 * {"q4_k": 148, "q5_k": 180, "q6_k": 210}[fmt]
    parts = int8dot.kblock_parts(fmt, raw)
    for a, b in zip(int8dot.unpack_kblocks(fmt, packed, 37), parts):
        assert (a is None and b is None) or torch.equal(a, b)
    rows = int8dot.unpack_kblocks(fmt, packed, 48)  # rows past N are zero
    assert int(rows[0][37:].sum()) == 0 and int(rows[3][37:].view(torch.int16).abs().sum()) == 0


@needs_kernel
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("M, K, N", [(1, 256, 16), (1, 1024, 640), (1, 2048, 33), (3, 512, 100), (40, 256, 7)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_is_the_formula_bit_for_bit(fmt, M, K, N, dtype):
    raw = random_raw(fmt, N, K, M * 1000 + K + N)
    g = torch.Generator().manual_seed(N)
    x = (torch.randn(M, K, generator=g) * 3).to(dtype)
    x[0, 5] = 40.0  # an outlier sets its group's scale
    x[0, -32:] = 0.0  # an all-zero group: scale 1, adds nothing
    if M > 1:
        x[1] = 0.0  # an all-zero row: output = bias
    b = torch.randn(N, generator=g)
    packed = int8dot.pack_kblocks(fmt, raw)
    for bias in (None, b):
        y = int8dot.kblock_linear(x, packed, fmt, bias, N)
        assert y.dtype == torch.float32 and y.shape == (M, N)
        assert torch.equal(y, int8dot.kblock_reference(x, fmt, raw, bias))
    if M > 1:
        assert torch.equal(int8dot.kblock_linear(x, packed, fmt, b, N)[1], b)
    # the formula is the product with the dequantized weights up to the rounding of the activations
    w = raw_dequantize(fmt, raw)
    y, exact = int8dot.kblock_linear(x, packed, fmt, None, N), x.float() @ w.T
    assert (y - exact).norm() <= 0.02 * exact.norm()


@needs_kernel
@pytest.mark.parametrize("fmt", FORMATS)
def test_integer_sums_are_exact_at_the_extremes(fmt):
    # Activations ±127 in every group (every s_g = 1), the largest integers and scales of each format, d = 1 and
    # dmin = 0: y is the integer sum itself, |J| at its bound (Q6_K: 128 · 32 · 127 · 32 < 2^24) and every partial
    # sum exact in float32 (equal terms: k · J has few significant bits), against an int64 product of the
    # dequantized integers.
    K, N = 256, 32
    raw = random_raw(fmt, N, K, 2)
    r = raw.view(N, block_bytes(fmt))
    one = torch.tensor([1.0]).half().view(torch.uint8)
    if fmt == "q6_k":
        r[:, :192] = 0  # q = 0: q − 32 = −32, the largest magnitude
        r[:, 192:208] = torch.tensor(-128, dtype=torch.int8).view(torch.uint8)
        r[1:, 192:208] = 127
        r[:, 208:210] = one
    else:
        r[:, 0:2], r[:, 2:4] = one, 0
        r[:, 4:16] = 255  # every 6-bit scale and min 63
        r[:, 16:] = 255  # every nibble (and Q5_K's fifth bit) set: q = 15 or 31
    x = torch.full((2, K), -127.0)
    x[1, 1::2] = 127.0
    y = int8dot.kblock_linear(x, int8dot.pack_kblocks(fmt, raw), fmt, None, N)
    exact = x.long() @ raw_dequantize(fmt, raw).long().T
    corner = {"q4_k": 127 * 15 * 63 * K, "q5_k": 127 * 31 * 63 * K, "q6_k": 127 * 32 * 128 * K}[fmt]
    assert abs(int(exact[0, 0])) == corner
    assert torch.equal(y, exact.float())


@needs_kernel
@pytest.mark.parametrize("fmt", FORMATS)
def test_threads_split_the_output_rows_and_change_no_bit(fmt):
    raw = random_raw(fmt, 1000, 512, 3)  # 63 blocks of rows: an odd split
    packed = int8dot.pack_kblocks(fmt, raw)
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(4))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = int8dot.kblock_linear(x, packed, fmt, None, 1000)
        one_row = int8dot.kblock_linear(x[:1], packed, fmt, None, 1000)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(two, int8dot.kblock_linear(x, packed, fmt, None, 1000))
    assert torch.equal(two, int8dot.kblock_reference(x, fmt, raw))
    assert torch.equal(one_row, two[:1])


def _kquant_gpt():
    from tokennet.layers.blockquant import BlockLinear
    from tokennet.models import create_model

    formats = {"decoder.blocks.*.mlp.fc2": "q6_k", "decoder.blocks.*.mlp.fc1": "q4_k",
               "decoder.blocks.*.attn.qkv_proj": "q5_k", "decoder.blocks.*.attn.out_proj": "q5_0", "tok_emb": "q8_0"}
    m = create_model("gpt-micro", vocab_size=64, block_size=32, dim=256, num_heads=4, mlp_ratio=4, bias=False,
                     quantized=formats).eval()
    for i, mod in enumerate(m.modules()):
        if isinstance(mod, BlockLinear) and mod.fmt in FORMATS:
            mod.set_blocks(random_raw(mod.fmt, mod.out_features, mod.in_features, i))
        elif isinstance(mod, BlockLinear) and mod.fmt == "q5_0":
            mod.set_blocks(random_q5_0(mod.out_features, mod.in_features, i))
        elif isinstance(mod, BlockLinear):  # q8_0
            mod.qs.copy_(torch.randint(-127, 128, mod.qs.shape, dtype=torch.int8))
            mod.d.copy_(torch.rand(mod.d.shape).half() * 0.01)
    return m


@needs_kernel
def test_a_file_of_k_quants_decodes_through_the_kernel_and_auto_chooses_it():
    from tokennet.layers.blockquant import BlockEmbedding, BlockLinear
    from tokennet.layers.quantize import BlockDotLinear, holds_file_blocks, quantize, resolve_mode

    torch.manual_seed(0)
    m = _kquant_gpt()
    assert holds_file_blocks(m) and resolve_mode(m, "auto") == "int4"
    q4 = quantize(m, "int4")
    for name in ("mlp.fc1", "mlp.fc2", "attn.qkv_proj", "attn.out_proj"):
        mine, theirs = q4.decoder.blocks[0].get_submodule(name), m.decoder.blocks[0].get_submodule(name)
        assert isinstance(mine, BlockDotLinear) and isinstance(theirs, BlockLinear)
        x = torch.randn(3, theirs.in_features)
        assert torch.equal(mine.dequantized_weight(), theirs.dequantized_weight())  # the file's weights exactly
        if theirs.fmt in FORMATS:
            assert torch.equal(mine(x), int8dot.kblock_reference(x, theirs.fmt, theirs.qs))
        else:  # Q5_0
            assert mine.fmt == "q5_0" and torch.equal(mine(x), int8dot.block_reference(x, "q5_0", theirs.qs))
    with torch.no_grad():
        idx = m.example_input(2)
        ref, got = m(idx).logits, q4(idx).logits
    assert 0 < (got - ref).norm() / ref.norm() < 0.2  # the activations rounded to int8, random weights (~10%)
    assert isinstance(q4.tok_emb, BlockEmbedding) and q4.tok_emb.qs is m.tok_emb.qs


@needs_kernel
def test_int8_keeps_a_tied_head_in_its_blocks():
    from tokennet.layers.blockquant import BlockEmbedding
    from tokennet.layers.quantize import BlockDotLinear, Int8Linear, quantize

    torch.manual_seed(0)
    m = _kquant_gpt()
    q8 = quantize(m, "int8")
    assert isinstance(q8.lm_head, BlockDotLinear) and q8.lm_head.fmt == "q8_0"
    assert isinstance(q8.tok_emb, BlockEmbedding) and q8.tok_emb.qs is m.tok_emb.qs  # the model's table, no copy
    assert isinstance(q8.decoder.blocks[0].mlp.fc1, Int8Linear)  # the other layers requantized as before
    V, D = m.config.vocab_size, m.config.dim
    assert not any(t.shape == (V, D) and t.is_floating_point() for t in (*q8.parameters(), *q8.buffers()))
    idx = m.example_input(2)
    with torch.no_grad():
        assert q8.tok_emb(idx).dtype == torch.bfloat16
        ref, got = m(idx).logits, q8(idx).logits.float()
    assert torch.equal(q8.lm_head(torch.ones(1, D)), int8dot.block_reference(torch.ones(1, D), "q8_0", m.lm_head.qs,
                                                                              m.lm_head.d).to(torch.float32))
    assert (got - ref).norm() / ref.norm() < 0.2  # bf16 and int8 per channel on random weights (~12%)


# ---- Q5_0 (32-weight blocks, a fifth bit each): the block kernel of test_int8dot_blocks.py, with its own test here
# because its blocks are the file's bytes (quantize_blocks does not make them)


@needs_kernel
@pytest.mark.parametrize("M, K, N", [(1, 640, 2048), (1, 32, 17), (3, 256, 100), (40, 96, 33)])
def test_q5_0_kernel_is_the_formula_bit_for_bit(M, K, N):
    raw = random_q5_0(N, K, M + K + N)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(N)) * 3
    x[0, :32] = 0.0
    packed = int8dot.pack_blocks("q5_0", raw)
    assert packed.shape[-1] == int8dot.block_chunk_bytes("q5_0") == 16 * 22  # the file's bytes per weight
    qs, d, m = int8dot.unpack_blocks("q5_0", packed, N)
    assert torch.equal(qs, raw) and d is None and m is None
    b = torch.randn(N)
    for bias in (None, b):
        assert torch.equal(int8dot.block_linear(x, packed, "q5_0", bias, N), int8dot.block_reference(x, "q5_0", raw,
                                                                                                  bias=bias))
    y, exact = int8dot.block_linear(x, packed, "q5_0", None, N), x @ raw_dequantize("q5_0", raw).T
    assert (y - exact).norm() <= 0.02 * exact.norm()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = int8dot.block_linear(x, packed, "q5_0", None, N)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(two, y)


@needs_kernel
def test_q5_0_integer_sums_are_exact_at_the_extremes():
    K, N = 1024, 32
    raw = random_q5_0(N, K, 5).view(N, K // 32, 22)
    raw[..., 0:2] = torch.tensor([1.0]).half().view(torch.uint8)
    raw[0, :, 2:] = 0  # q = 0: weight −16
    raw[1, :, 2:] = 255  # q = 31: weight 15
    raw = raw.reshape(N, -1)
    x = torch.full((2, K), -127.0)
    x[1, 1::2] = 127.0
    y = int8dot.block_linear(x, int8dot.pack_blocks("q5_0", raw), "q5_0", None, N)
    exact = x.long() @ raw_dequantize("q5_0", raw).long().T
    assert int(exact[0, 0]) == 127 * 16 * K and int(exact[0, 1]) == -127 * 15 * K
    assert torch.equal(y, exact.float())


@needs_kernel
def test_a_large_table_is_packed_in_slices_to_the_same_bytes(monkeypatch):
    raw_k, raw_5 = random_raw("q6_k", 100, 256, 6), random_q5_0(100, 64, 7)
    whole = int8dot.pack_kblocks("q6_k", raw_k), int8dot.pack_blocks("q5_0", raw_5)
    monkeypatch.setattr(int8dot, "_PACK_SLICE", 32)  # 100 rows: slices of 32, 32, 32 and 4
    assert torch.equal(int8dot.pack_kblocks("q6_k", raw_k), whole[0])
    assert torch.equal(int8dot.pack_blocks("q5_0", raw_5), whole[1])
