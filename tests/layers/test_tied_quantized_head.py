"""An LM head tied to an embedding in GGUF blocks (Gemma 3's 262,144 × 640 Q8_0 table) stays quantized in an int8
inference copy: the head multiplies quantized weights within their rounding of the float head, the embedding
dequantizes only the rows it looks up (exactly), and no float32 copy of the table (nor of any block layer) is made."""

import pytest
import torch
from torch import nn

from tokennet.layers import blockquant, int8dot
from tokennet.layers import quantize as quantize_module
from tokennet.layers.blockquant import BlockEmbedding, BlockLinear, dequantize_blocks, quantize_blocks
from tokennet.layers.quantize import BlockDotLinear, Int8Linear, quantize, quantize_int8, quantize_int8_blocks
from tokennet.models import create_model

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, DIM = 8192, 64  # a table of 524,288 weights: more than one slice of quantize's streaming


def _tied_model() -> nn.Module:
    """A small GPT whose tied embedding/head and MLP input layers hold random GGUF blocks."""
    torch.manual_seed(0)
    m = create_model("gpt-micro", vocab_size=VOCAB, block_size=16, bias=False,
                     quantized={"decoder.blocks.*.mlp.fc1": "q4_1", "tok_emb": "q8_0"}).eval()
    for mod in m.modules():
        if isinstance(mod, BlockLinear):
            mod.set_blocks(*quantize_blocks(torch.randn(mod.out_features, mod.in_features) * 0.05, mod.fmt))
    m.tok_emb.qs, m.tok_emb.d, m.tok_emb.m = m.lm_head.qs, m.lm_head.d, m.lm_head.m
    return m


@pytest.fixture(params=["block kernel", "int8 per row"])
def head_path(request, monkeypatch):
    """The copy's head: the table's own blocks × the block kernel (where it runs), or int8 with per-row scales."""
    if request.param == "block kernel" and not int8dot.blocks_available():
        pytest.skip(f"the block kernel does not run here: {int8dot.blocks_unavailable_reason()}")
    if request.param == "int8 per row":
        monkeypatch.setattr(int8dot, "blocks_available", lambda: False)
    return request.param


def _bound(x: torch.Tensor, w: torch.Tensor, head: nn.Module) -> torch.Tensor:
    """The largest error the copy's head may make against ``x Wᵀ`` in float32, from the rounding steps' scales.

    Weights: exact for the block kernel (the table's own blocks), else within half a step of their row's int8 scale
    ``s_n = max_k |W_nk| / 127``. Activations: within half a step of their group's scale ``max_{k∈g} |x_k| / 127``
    (the kernels' int8 groups of 32; bfloat16 activations round by less). Then the output's bfloat16 rounding
    (Int8Linear returns bfloat16) and float32 sums."""
    M, K = x.shape
    w_half = torch.zeros(w.shape[0]) if isinstance(head, BlockDotLinear) else w.abs().amax(1) / 127 / 2  # (N,)
    a_half = (x.abs().view(M, K // 32, 32).amax(-1) / 127 / 2).repeat_interleave(32, 1)  # (M, K)
    exact = x.abs() @ w.abs().T  # Σ_k |x_k W_nk|
    bound = x.abs().sum(1, keepdim=True) * w_half + a_half @ w.abs().T + K * a_half.amax(1, keepdim=True) * w_half
    out_half = 0 if isinstance(head, BlockDotLinear) else 2.0**-8 * (exact + bound)
    return bound + out_half + 1e-5 * exact


def test_tied_quantized_head_gives_the_float_head_s_logits_within_its_rounding(head_path):
    m = _tied_model()
    q = quantize(m, "int8")
    want_type = BlockDotLinear if head_path == "block kernel" else Int8Linear
    assert type(q.lm_head) is want_type and isinstance(q.tok_emb, BlockEmbedding)
    torch.manual_seed(1)
    x = torch.randn(3, DIM)
    x[0, 5] = 20.0  # an outlier channel, as language models' hidden states hold
    w = m.lm_head.dequantized_weight()
    got = q.lm_head(x).float()
    err = (got - x @ w.T).abs()
    bound = _bound(x, w, q.lm_head)
    assert (err <= bound).all(), (err - bound).max()
    assert err.max() > 0  # the bound is not vacuous: the copy does round
    # and the whole model: the copy's logits follow the float model's (the same greedy choice on most positions)
    ids = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        agree = (q(ids).logits.float().argmax(-1) == m(ids).logits.argmax(-1)).float().mean()
    assert agree >= 0.9, agree


def test_embedding_gather_of_a_quantized_tied_table_is_dequantize_then_gather(head_path):
    m = _tied_model()
    q = quantize(m, "int8")
    ids = torch.tensor([[0, 7, VOCAB - 1], [3, 3, 4096]])
    table = dequantize_blocks("q8_0", m.lm_head.qs, m.lm_head.d)
    # exact on every CPU: a row's dequantization is one elementwise product (scale × int), no reduction, so the
    # rows gathered then dequantized and the table dequantized then gathered round identically
    assert torch.equal(m.tok_emb(ids), table[ids])  # the model: float32 rows
    assert torch.equal(q.tok_emb(ids), table[ids].to(torch.bfloat16))  # the copy: the same rows in its dtype
    assert q.tok_emb.qs is m.lm_head.qs and q.tok_emb.d is m.lm_head.d  # the model's own blocks, not a copy


def test_no_float32_copy_of_the_tied_table_is_made(head_path, monkeypatch):
    m = _tied_model()
    largest = []
    real = blockquant.dequantize_blocks

    def watched(*args):
        weights = real(*args)
        largest.append(weights.numel())
        return weights

    monkeypatch.setattr(quantize_module, "dequantize_blocks", watched)
    monkeypatch.setattr(blockquant, "dequantize_blocks", watched)
    q = quantize(m, "int8")
    assert max(largest, default=0) <= quantize_module._SLICE_WEIGHTS < VOCAB * DIM  # a slice at a time, at most
    for name, t in (*q.named_parameters(), *q.named_buffers()):
        assert not (t.is_floating_point() and t.numel() >= VOCAB * DIM), name  # no float table in the copy
    quantized = [t for t in (*q.buffers(),) if t.numel() >= VOCAB * DIM]
    held = {t.untyped_storage().data_ptr() for t in quantized} - {m.lm_head.qs.untyped_storage().data_ptr()}
    assert len(held) <= 1  # at most one quantized table beside the model's (the kernel's layout of it)
    ids = torch.randint(0, VOCAB, (1, 6))
    largest.clear()
    with torch.no_grad():
        q(ids)
    assert 0 < max(largest) <= ids.numel() * DIM  # a lookup dequantizes the rows it gathers, never the table


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q4_1"])
def test_int8_from_blocks_is_quantize_int8_of_the_dequantized_weight_bit_for_bit(fmt, monkeypatch):
    monkeypatch.setattr(quantize_module, "_SLICE_WEIGHTS", 1000)  # many slices, one not full
    torch.manual_seed(2)
    qs, d, m = quantize_blocks(torch.randn(77, 96), fmt)
    q, s = quantize_int8_blocks(fmt, qs, d, m)
    want_q, want_s = quantize_int8(dequantize_blocks(fmt, qs, d, m))
    # bit for bit is the contract, and it holds on any CPU: both sides run the same per-row operations (a max, which
    # is order-free, then elementwise division and rounding) on the same machine; slicing rows changes no row's sum
    assert torch.equal(q, want_q) and torch.equal(s, want_s)
    if int8dot.available():  # packed slice by slice: the kernel's layout of the whole, byte for byte
        packed, s = quantize_int8_blocks(fmt, qs, d, m, pack=True)
        assert torch.equal(packed, int8dot.pack(want_q)) and torch.equal(s, want_s)
    blocks = BlockLinear(96, 77, fmt)
    blocks.set_blocks(qs, d, m)
    lin = nn.Linear(96, 77, bias=False)
    lin.weight.data = blocks.dequantized_weight()
    a, b = Int8Linear.from_blocks(blocks), Int8Linear(lin)  # the layer as the float path made it
    assert torch.equal(a.int8_weight(), b.int8_weight()) and torch.equal(a.scale, b.scale)
