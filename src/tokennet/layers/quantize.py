"""Low-precision inference copies of a model: bf16 weights, int8 weights with per-channel scales, or 4-bit blocks.

Decoding one token at a time reads every weight once per token and does little arithmetic with it, so
its speed is set by the bytes of weights read: fp32 → bf16 halves them, int8 quarters them, 4-bit blocks
(with their scales) take 5/32 of them.

- ``"bf16"``: every floating-point parameter and buffer in bfloat16 (activations follow);
- ``"int8"``: as ``"bf16"``, and every ``nn.Linear`` (the LM head too, also when tied to the embedding)
  becomes an :class:`Int8Linear`: int8 weights with one scale per output channel,
  ``W ≈ s ⊙ Q``, ``s_n = max_k |W_nk| / 127``, ``Q = round(W / s)``. On an x86 CPU with AVX-512 VNNI they are
  multiplied by :mod:`tokennet.layers.int8dot`'s kernel: the activations rounded to int8 in groups of 32 (one
  scale each, llama.cpp's Q8_0 activations) and integer dot products, bit for bit a stated formula, in eager
  and compiled steps alike (its decoding speed against the weight-only path and llama.cpp:
  ``bench/results/interop.json``; its loss in :mod:`tokennet.layers.int8dot`). Elsewhere
  (or ``TOKENNET_INT8DOT=0``), weight-only: PyTorch's ``_weight_int8pack_mm`` (bf16 activations × int8
  weights, dequantized inside the kernel), or :func:`gemv` in a compiled step;
- ``"int4"``: every ``nn.Linear`` becomes a :class:`~tokennet.layers.blockquant.BlockLinear` in GGUF's
  Q4_1 blocks (32 weights, a scale and a minimum each), the LM head in Q8_0 (llama.cpp's choice for its
  Q4 files: the head is the layer most sensitive to rounding); layers already held in blocks (an
  imported GGUF file's) stay exactly as they are, so the weights are the file's; a layer whose width is
  not a multiple of 32 stays float32, with a note; everything else stays float32. On an x86 CPU with AVX-512
  VNNI, every Q8_0/Q4_0/Q4_1/Q5_0 layer and every Q4_K/Q5_K/Q6_K one (a ``Q4_K_M`` file's: Gemma 3's) becomes a
  :class:`BlockDotLinear`: the same blocks repacked for
  :mod:`tokennet.layers.int8dot`'s block kernel (the activations rounded to int8 in groups of 32 — one group
  per block — and integer dot products, bit for bit :func:`~tokennet.layers.int8dot.block_reference`, in eager
  and compiled steps alike; a GGUF Q4_1 layer reads the file's 20 bytes per 32 weights). Elsewhere (or
  ``TOKENNET_BLOCKDOT=0`` / ``TOKENNET_INT8DOT=0``, with a note in the log) the blocks stay
  :class:`~tokennet.layers.blockquant.BlockLinear` with float32 activations: dequantized in eager steps, fused
  into the product's loop in compiled ones. In ``"int8"``, a layer in blocks becomes int8 from its blocks a slice of
  rows at a time (:func:`quantize_int8_blocks`: no float32 copy of a weight), an embedding in blocks dequantizes only
  the rows it looks up, and an LM head tied to it stays in its blocks (a :class:`BlockDotLinear` where the kernel
  runs; elsewhere int8 with per-row scales), so the copy holds no float32 table and at most one quantized one;
- ``"none"``: the model itself, unchanged (a model holding blocks decodes from their float32 values).

Each layer type has a fused form for a decoding step compiled by torch.compile (:func:`gemv`): see
:class:`tokennet.sampling.CompiledStep`.

Decoding in float32 on the CPU goes through :func:`decoding_copy`, which also changes the *layout* of
every linear layer's weight (not its values): a :class:`PackedLinear` holds ``Wᵀ`` cut into P column
blocks ``(P, K, N/P)``, one per thread, so that a decoding step's ``x Wᵀ`` is one batched product whose P
blocks stream from memory in parallel. With one token per step the product reads every weight once and
does two flops per weight: its speed is memory bandwidth, and PyTorch's ``F.linear`` on the ``(N, K)``
layout at batch 1 is a matrix–vector product on one core (measured on a 2-core machine: the SmolLM2
head, 49152 × 576, takes 8.7 ms with ``F.linear``, 5.0 ms with ``x @ Wᵀ`` on a contiguous ``Wᵀ``, and
3.5 ms with two column blocks; ``bench/interop.py`` has the whole model).

:func:`quantize` never touches the model it is given and keeps no weights derived from it anywhere
else: it returns a separate inference copy, to be built again after the model's parameters change
(an optimizer updates them in place; a stale copy would silently decode with old weights).
"""

from __future__ import annotations

import copy
import logging
import weakref

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ConfigError
from . import int8dot, pinned
from .blockquant import BlockEmbedding, BlockLinear, dequantize_blocks, gemv, gemv_rows

__all__ = ["QUANTIZE_MODES", "DOT_FORMATS", "Int8Linear", "BlockDotLinear", "PackedLinear", "GemvLinear", "quantize",
           "quantize_int8", "quantize_int8_blocks", "check_mode", "resolve_mode", "holds_file_blocks", "decoding_copy",
           "gemv"]

logger = logging.getLogger(__name__)

QUANTIZE_MODES = ("none", "bf16", "int8", "int4")
# The block formats BlockDotLinear multiplies with the integer-dot kernel: Q8_0/Q4_0/Q4_1/Q5_0 and the K-quants
# Q4_K/Q5_K/Q6_K.
DOT_FORMATS = (*int8dot.BLOCK_FORMATS, *int8dot.KBLOCK_FORMATS)

# _weight_int8pack_mm reads its input in blocks of 8 along K; other widths crash the CPU kernel
# (PyTorch 2.13), so such a layer stays bf16.
_K_ALIGN = 8
_ROWS = 2048  # rows quantized at a time (a block of a 384-wide matrix is 3 MiB)
_PACK_ROWS = 256  # rows transposed at a time when packing
# Weights of a layer in blocks dequantized at a time when it becomes int8 (1 MB of float32), and rows of blocks
# repacked at a time for the integer-dot kernel (a multiple of 16; Gemma 3's Q8_0 table: 2.7 MB a slice). Small
# slices, freed and allocated again at the same size, keep the heap from growing: one float32 weight per layer
# (Gemma 3's 18 layers, 22 MB each) left ~290 MB of freed memory that glibc kept resident.
_SLICE_WEIGHTS = 1 << 18
_PACK_SLICE_ROWS = 4096


def check_mode(mode: str) -> str:
    """Validate a quantization mode name; returns it."""
    if mode not in QUANTIZE_MODES:
        raise ConfigError(f"quantize must be one of {', '.join(QUANTIZE_MODES)}, got {mode!r}")
    return mode


def holds_file_blocks(model: nn.Module) -> bool:
    """Whether ``model`` is on the CPU with every linear layer in GGUF blocks of :data:`DOT_FORMATS` (an imported
    file's: Q8_0/Q4_0/Q4_1/Q5_0, or the K-quants Q4_K/Q5_K/Q6_K) and the block kernel runs here
    (:func:`tokennet.layers.int8dot.blocks_available`): then ``"int4"`` decodes the file's own weights, as they
    are, with integer dot products, as llama.cpp does."""
    if next(model.parameters()).device.type != "cpu":
        return False
    blocks = [m for m in model.modules() if isinstance(m, BlockLinear)]
    floats = any(type(m) is nn.Linear for m in model.modules())  # int4 would round these to 4 bits
    return bool(blocks) and not floats and all(b.fmt in DOT_FORMATS for b in blocks) \
        and int8dot.blocks_available()


def resolve_mode(model: nn.Module, mode: str) -> str:
    """``mode`` checked, with ``"auto"`` (the default of ``generate``) resolved: ``"int4"`` for a model that
    :func:`holds_file_blocks` (the file's weights, read at their own 4.5-8.5 bits instead of dequantized to 32),
    ``"none"`` for every other (a trained run decodes its float32 weights, as it always has)."""
    if mode == "auto":
        return "int4" if holds_file_blocks(model) else "none"
    return check_mode(mode)


def quantize_int8(w: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric per-output-channel int8: ``W (N, K) → (Q (N, K) int8, s (N,) float32)`` with ``W ≈ s[:, None] Q``."""
    w = w.detach().float()
    N, K = w.shape
    q = torch.empty(N, K, dtype=torch.int8, device=w.device)
    s = torch.empty(N, device=w.device)
    buf = torch.empty(min(N, _ROWS), K, device=w.device)
    # In blocks of rows that stay in cache: one pass over W instead of one per elementwise step.
    for i in range(0, N, _ROWS):
        rows = w[i : i + _ROWS]
        torch.div(torch.linalg.vector_norm(rows, ord=float("inf"), dim=1), 127.0, out=s[i : i + _ROWS])
        inv = 1.0 / s[i : i + _ROWS].clamp_min(torch.finfo(torch.float32).tiny)  # an all-zero row stays 0
        b = torch.mul(rows, inv[:, None], out=buf[: rows.shape[0]]).round_()  # |W_nk / s_n| <= 127
        q[i : i + _ROWS].copy_(b)
    return q, s


def quantize_int8_blocks(fmt: str, qs: Tensor, d: Tensor | None = None, m: Tensor | None = None, *,
                         pack: bool = False) -> tuple[Tensor, Tensor]:
    """:func:`quantize_int8` of GGUF blocks' weights (``dequantize_blocks(fmt, qs, d, m)``), bit for bit, computed a
    slice of rows at a time: the float32 weight is never whole (each row's scale depends on that row alone).

    ``pack``: ``Q`` in :func:`tokennet.layers.int8dot.pack`'s layout instead, each slice packed as it is made (the
    layout holds 16 rows per leading index): no whole ``(N, K)`` int8 copy beside it either."""
    N = qs.shape[0]
    out = scale = None
    a, step = 0, 16
    while a < N:
        rows = slice(a, a + step)
        w = dequantize_blocks(fmt, qs[rows], None if d is None else d[rows], None if m is None else m[rows])
        part, part_scale = quantize_int8(w)
        if pack:
            part = int8dot.pack(part)
        if out is None:  # the first slice tells the width; every result is allocated before the next temporaries
            out = part.new_empty((-(-N // 16) if pack else N, *part.shape[1:]))
            scale = torch.empty(N, device=qs.device)
        (out[a // 16 : a // 16 + part.shape[0]] if pack else out[rows]).copy_(part)
        scale[rows] = part_scale
        a += step
        step = max(16, _SLICE_WEIGHTS // w.shape[1] // 16 * 16)
    return out, scale


class Int8Linear(nn.Module):
    """``y = x (s ⊙ Q)ᵀ + b`` with int8 weights ``Q (N, K)`` and per-channel scales ``s (N,)``; for inference.

    On an x86 CPU with AVX-512 VNNI (:func:`tokennet.layers.int8dot.available`), when K is a multiple of 32, the
    weights are held in that kernel's packed layout (``packed``; ``qweight`` is None) and every call goes through
    it: the activations rounded to int8 in groups of 32, integer dot products, float32 ``scale`` and ``bias``
    (the formula in :mod:`tokennet.layers.int8dot`). Elsewhere it computes in bf16 (the input is cast) with PyTorch's
    ``_weight_int8pack_mm`` (fast for bf16 activations, several times slower for fp32 ones), or, in a compiled
    step, :func:`gemv`; off the CPU the weights are dequantized at each call. The output is bf16 either way.

    Args:
        linear: the layer to quantize (read, not modified).
        quantized: its weight already quantized, ``(Q, s)`` as :func:`quantize_int8` makes them (``linear.weight``
            is then not read: it may be on the meta device).
    """

    def __init__(self, linear: nn.Linear, quantized: tuple[Tensor, Tensor] | None = None):
        super().__init__()
        if linear.in_features % _K_ALIGN:
            raise ValueError(f"Int8Linear needs in_features divisible by {_K_ALIGN}, got {linear.in_features}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        q, s = quantize_int8(linear.weight) if quantized is None else quantized
        b = linear.bias
        if q.dim() == 4:  # already in the kernel's layout (from_blocks)
            self.register_buffer("packed", q)
            self.register_buffer("qweight", None)
            self.register_buffer("scale", s)
            self.register_buffer("bias", None if b is None else b.detach().float())
        elif self.kernel_runs(q.device, self.in_features):
            self.register_buffer("packed", int8dot.pack(q))  # (⌈N/16⌉, K/4, 16, 4) int8
            self.register_buffer("qweight", None)
            self.register_buffer("scale", s)  # (N,) float32
            self.register_buffer("bias", None if b is None else b.detach().float())
        else:
            self.register_buffer("packed", None)
            self.register_buffer("qweight", q)  # (N, K) int8
            self.register_buffer("scale", s.to(torch.bfloat16))  # (N,)
            self.register_buffer("bias", None if b is None else b.detach().to(torch.bfloat16))

    @staticmethod
    def kernel_runs(device: torch.device, in_features: int) -> bool:
        """Whether the weights are held in the integer-dot kernel's layout (on the CPU, K a multiple of 32)."""
        return device.type == "cpu" and in_features % int8dot.GROUP == 0 and int8dot.available()

    @classmethod
    def from_blocks(cls, blocks: BlockLinear) -> Int8Linear:
        """The int8 layer of a layer in GGUF blocks (read, not modified): its dequantized weight quantized as
        :func:`quantize_int8` does, without ever holding that float32 weight whole, nor a second int8 copy of it
        (:func:`quantize_int8_blocks`, packed slice by slice where the kernel runs)."""
        shape = nn.Linear(blocks.in_features, blocks.out_features, bias=False, device="meta")
        if blocks.bias is not None:
            shape.bias = nn.Parameter(blocks.bias.detach().float(), requires_grad=False)
        pack = cls.kernel_runs(blocks.qs.device, blocks.in_features)
        return cls(shape, quantize_int8_blocks(blocks.fmt, blocks.qs, blocks.d, blocks.m, pack=pack))

    def int8_weight(self) -> Tensor:
        """``Q`` ``(N, K)`` int8 (rebuilt from the packed layout when the integer-dot kernel holds it)."""
        return self.qweight if self.packed is None else int8dot.unpack(self.packed, self.out_features)

    def dequantized_weight(self) -> Tensor:
        """``s ⊙ Q`` ``(N, K)`` in float32 (the reference the kernel is tested against)."""
        return self.int8_weight().float() * self.scale.float()[:, None]

    def forward(self, x: Tensor) -> Tensor:
        """``(..., K) → (..., N)`` in bf16."""
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)  # (M, K)
        if self.packed is not None and x2.device.type == "cpu":
            y = int8dot.linear(x2, self.packed, self.scale, self.bias, self.out_features)
            return y.to(torch.bfloat16).view(*lead, self.out_features)
        x2 = x2.to(torch.bfloat16)
        if self.packed is not None:  # moved off the CPU: dequantize (correct, not faster)
            y = F.linear(x2, (self.dequantized_weight()).to(x2.dtype), None if self.bias is None else
                         self.bias.to(x2.dtype))
        elif gemv_rows(x2):  # one fused loop over Q (see gemv)
            y = gemv(x2, self.qweight) * self.scale.float()
            if self.bias is not None:
                y = y + self.bias.float()
            y = y.to(torch.bfloat16)
        elif x2.device.type == "cpu":
            y = torch.ops.aten._weight_int8pack_mm(x2, self.qweight, self.scale)  # (M, N)
            if self.bias is not None:
                y += self.bias
        else:  # no int8 kernel on every accelerator: dequantize (correct, not faster)
            y = F.linear(x2, self.qweight.to(x2.dtype) * self.scale[:, None], self.bias)
        return y.view(*lead, self.out_features)

    def extra_repr(self) -> str:
        kernel = "int8dot" if self.packed is not None else "int8pack"
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"kernel={kernel}")


class BlockDotLinear(nn.Module):
    """A :class:`~tokennet.layers.blockquant.BlockLinear`'s Q8_0, Q4_0 or Q4_1 blocks × int8 activations (VNNI).

    The same blocks (the same weights, bit for bit: a GGUF file's own), repacked once by
    :func:`tokennet.layers.int8dot.pack_blocks` into chunks of 16 output rows × 32 weights that one pass of
    ``vpdpbusd`` reads in order (the file's bytes per weight: Q4_1 20 per 32, Q8_0 34); every call rounds the
    activations to int8 in groups of 32 (one scale each, llama.cpp's Q8_0/Q8_1 activations) and computes
    :func:`tokennet.layers.int8dot.block_reference`'s formula, e.g. for Q4_1 (``W = d·q + m``)::

        y_n = Σ_g ((d_ng · s_g) · Σ_{k∈g} x_q,k q_nk + m_ng · (s_g · Σ_{k∈g} x_q,k))   (+ b_n)

    in float32, eagerly and inside a compiled graph alike. Built by :func:`quantize` (mode ``"int4"``) where
    :func:`tokennet.layers.int8dot.blocks_available`; the output is in the input's dtype, as ``BlockLinear``'s.
    Off the CPU the weight is dequantized at each call (correct, not faster).

    Args:
        blocks: the layer whose blocks are used (read, not modified).
    """

    def __init__(self, blocks: BlockLinear):
        super().__init__()
        if blocks.fmt not in DOT_FORMATS:
            raise ValueError(f"BlockDotLinear takes {DOT_FORMATS} blocks, not {blocks.fmt}")
        self.in_features, self.out_features = blocks.in_features, blocks.out_features
        fmt, qs, d, m = blocks.fmt, blocks.qs, blocks.d, blocks.m
        self.fmt = fmt
        if fmt in int8dot.KBLOCK_FORMATS:
            # (⌈N/16⌉, K/256, S)
            packed = _packed_in_slices(lambda a, b: int8dot.pack_kblocks(fmt, qs[a:b]), qs.shape[0])
        else:
            packed = _packed_in_slices(lambda a, b: int8dot.pack_blocks(fmt, qs[a:b], None if d is None else d[a:b],
                                                                        None if m is None else m[a:b]), qs.shape[0])
        self.register_buffer("packed", packed)  # (⌈N/16⌉, G, C)
        self.register_buffer("bias", None if blocks.bias is None else blocks.bias.detach().float())

    def blocks(self) -> tuple:
        """The GGUF blocks ``(qs, d, m)`` as a ``BlockLinear`` holds them, or for a K-quant
        :func:`~tokennet.layers.int8dot.kblock_parts`' ``(q, sc, m, d, dmin)`` (rebuilt from the packed layout)."""
        if self.fmt in int8dot.KBLOCK_FORMATS:
            return int8dot.unpack_kblocks(self.fmt, self.packed, self.out_features)
        return int8dot.unpack_blocks(self.fmt, self.packed, self.out_features)

    def dequantized_weight(self) -> Tensor:
        """``W`` ``(N, K)`` in float32 (the blocks' plain formula)."""
        if self.fmt in int8dot.KBLOCK_FORMATS:
            return int8dot.kblock_dequantize(self.fmt, *self.blocks())
        return dequantize_blocks(self.fmt, *self.blocks())

    def forward(self, x: Tensor) -> Tensor:
        """``(..., K) → (..., N)`` in x's dtype."""
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)  # (M, K)
        if x2.device.type != "cpu":
            y = F.linear(x2.float(), self.dequantized_weight().to(x2.device), self.bias)
        elif self.fmt in int8dot.KBLOCK_FORMATS:
            y = int8dot.kblock_linear(x2, self.packed, self.fmt, self.bias, self.out_features)
        else:
            y = int8dot.block_linear(x2, self.packed, self.fmt, self.bias, self.out_features)
        return y.to(x.dtype).view(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, fmt={self.fmt}, "
                f"bias={self.bias is not None}, kernel=int8dot")


def _packed_in_slices(pack_rows, N: int) -> Tensor:
    """``pack_rows(a, b)`` (the kernel's layout of rows ``a … b − 1``, 16 rows per leading index) over slices of
    :data:`_PACK_SLICE_ROWS` rows, written into one tensor: a large table's temporaries stay a few MB."""
    first = pack_rows(0, min(N, _PACK_SLICE_ROWS))
    if N <= _PACK_SLICE_ROWS:
        return first
    out = first.new_empty(-(-N // 16), *first.shape[1:])
    out[: first.shape[0]] = first
    del first
    for a in range(_PACK_SLICE_ROWS, N, _PACK_SLICE_ROWS):
        part = pack_rows(a, min(a + _PACK_SLICE_ROWS, N))
        out[a // 16 : a // 16 + part.shape[0]] = part
    return out


class PackedLinear(nn.Module):
    """``y = x Wᵀ + b`` with ``Wᵀ`` stored as P column blocks ``(P, K, n)``, ``n = ⌈N/P⌉``; for inference.

    ``forward`` is one ``torch.bmm`` of the input against the P blocks (each block a ``K × n`` slice of
    ``Wᵀ``: block p gives outputs ``p·n … p·n + n − 1``), which PyTorch runs one block per thread. The last
    block is zero-padded when P does not divide N. Same values as ``F.linear`` up to float rounding (the
    sums run in another order).

    Args:
        linear: the layer to pack (read, not modified).
        parts: P, the number of column blocks (default: PyTorch's intra-op threads, at most N/64).
    """

    def __init__(self, linear: nn.Linear, parts: int | None = None):
        super().__init__()
        w = linear.weight.detach()
        N, K = w.shape
        P = max(1, min(parts or torch.get_num_threads(), N // 64 or 1))
        n = -(-N // P)
        self.in_features, self.out_features, self.parts = K, N, P
        blocks = w.new_empty(P, K, n)  # block p = (rows p·n … p·n + n − 1 of W)ᵀ
        if P * n > N:
            blocks[-1].zero_()
        for p in range(P):  # a few hundred rows at a time: the transpose stays in cache (3–4× faster)
            for i in range(p * n, min((p + 1) * n, N), _PACK_ROWS):
                rows = w[i : min(i + _PACK_ROWS, (p + 1) * n, N)]
                blocks[p, :, i - p * n : i - p * n + rows.shape[0]].copy_(rows.T)
        self.register_buffer("blocks", blocks)
        b = linear.bias
        self.register_buffer("bias", None if b is None else b.detach().clone())

    def weight_t(self) -> Tensor:
        """``Wᵀ`` ``(K, N)`` reassembled from the blocks (a view where no block is padded)."""
        return self.blocks.permute(1, 0, 2).reshape(self.in_features, -1)[:, : self.out_features]

    def forward(self, x: Tensor) -> Tensor:
        """``(..., K) → (..., N)``."""
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)  # (M, K)
        M, P = x2.shape[0], self.parts
        if P == 1:
            y = x2 @ self.blocks[0]
        else:
            y = torch.bmm(x2.expand(P, M, self.in_features), self.blocks)  # (P, M, n): block p on thread p
            y = y.transpose(0, 1).reshape(M, -1)
        if y.shape[1] != self.out_features:
            y = y[:, : self.out_features]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, parts={self.parts}, "
                f"bias={self.bias is not None}")


class GemvLinear(nn.Module):
    """``y = x Wᵀ + b`` over a float weight of any dtype; traced by torch.compile, a few rows go through :func:`gemv`.

    For compiled decoding: PyTorch's matrix kernels at one row read a bfloat16 weight at a fraction of the
    memory bandwidth; the fused loop Inductor writes for :func:`gemv` reads it at full speed. In eager mode,
    or for more rows, it is ``F.linear``. The weight and bias are the given layer's own tensors (no copy).

    Args:
        linear: the layer whose tensors are used.
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias

    def forward(self, x: Tensor) -> Tensor:
        """``(..., K) → (..., N)`` in x's dtype."""
        x2 = x.reshape(-1, self.in_features)  # (M, K)
        if not gemv_rows(x2):
            return F.linear(x, self.weight, self.bias)
        y = gemv(x2, self.weight)
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)


def _replace_linears(model: nn.Module, make, keep_if=lambda lin: True) -> None:
    """Replace every plain ``nn.Linear`` of ``model`` (for which ``keep_if`` holds) by ``make(linear)``, in
    place; a layer registered in two places (tied) becomes one new layer in both."""
    made: dict[int, nn.Module] = {}
    for m in list(model.modules()):
        for child_name, child in list(m.named_children()):
            if type(child) is nn.Linear and keep_if(child):
                if id(child) not in made:
                    made[id(child)] = make(child)
                setattr(m, child_name, made[id(child)])


def _share_tensors(model: nn.Module) -> dict[int, object]:
    # deepcopy memo that maps every parameter and buffer to itself: the copy's structure is new, its
    # tensors are the original's until replaced below (no transient fp32 duplicate of the weights).
    memo: dict[int, object] = {}
    for t in list(model.parameters()) + list(model.buffers()):
        memo[id(t)] = t
    return memo


def _to_float(model: nn.Module, keep: frozenset[int] = frozenset()) -> None:
    """Replace every block-quantized layer of ``model`` (a copy) by a float32 one holding its dequantized weight,
    in place; an embedding and an LM head that share blocks share the float weight. Layers whose ``qs`` is in
    ``keep`` (by id) stay as they are."""
    weights: dict[int, nn.Parameter] = {}

    def weight(blocks) -> nn.Parameter:
        if id(blocks.qs) not in weights:
            w = BlockLinear.dequantized_weight(blocks) if isinstance(blocks, BlockLinear) else \
                blocks.forward(torch.arange(blocks.num_embeddings, device=blocks.qs.device))
            weights[id(blocks.qs)] = nn.Parameter(w, requires_grad=False)
        return weights[id(blocks.qs)]

    for m in list(model.modules()):
        for name, child in list(m.named_children()):
            if isinstance(child, (BlockLinear, BlockEmbedding)) and id(child.qs) in keep:
                continue
            if isinstance(child, BlockLinear):
                new = nn.Linear(child.in_features, child.out_features, bias=child.bias is not None, device="meta")
                new.weight = weight(child)
                if child.bias is not None:
                    new.bias = nn.Parameter(child.bias.float(), requires_grad=False)
            elif isinstance(child, BlockEmbedding):
                new = nn.Embedding(child.num_embeddings, child.embedding_dim, device="meta")
                new.weight = weight(child)
            else:
                continue
            setattr(m, name, new)


def _to_int4(model: nn.Module) -> list[str]:
    """Every float linear layer of ``model`` (a copy) → Q4_1 blocks, the LM head → Q8_0, in place; layers already
    in blocks stay as they are. Returns the layers that cannot take blocks (in_features not a multiple of 32)."""
    from .blockquant import GROUP

    kept, made = [], {}
    for mname, m in list(model.named_modules()):
        for name, child in list(m.named_children()):
            if type(child) is not nn.Linear:
                continue
            full = f"{mname}.{name}" if mname else name
            if child.in_features % GROUP:
                kept.append(full)
                continue
            if id(child) not in made:
                made[id(child)] = BlockLinear.from_float(child, "q8_0" if full == "lm_head" else "q4_1")
            setattr(m, name, made[id(child)])
    return kept


def _blocks_to_int8(model: nn.Module, keep: frozenset[int]) -> None:
    """Every :class:`BlockLinear` of ``model`` (a copy) whose ``qs`` is not in ``keep`` → an :class:`Int8Linear` of its
    weights (:meth:`Int8Linear.from_blocks`: no float32 copy of a weight, a slice at a time), in place; a layer
    registered in two places becomes one new layer in both. An embedding sharing its blocks keeps them."""
    made: dict[int, nn.Module] = {}
    for m in list(model.modules()):
        for name, child in list(m.named_children()):
            if isinstance(child, BlockLinear) and id(child.qs) not in keep:
                if id(child) not in made:
                    made[id(child)] = Int8Linear.from_blocks(child)  # blocks hold K a multiple of 32
                setattr(m, name, made[id(child)])


def _tied_tables(model: nn.Module) -> frozenset[int]:
    """The ids of the block tensors ``qs`` that an embedding shares with a linear layer (a tied LM head: Gemma 3's
    262,144 × 640 table) that :class:`BlockDotLinear` multiplies here; empty without the block kernel."""
    if not int8dot.blocks_available():
        return frozenset()
    tables = {id(m.qs) for m in model.modules() if isinstance(m, BlockEmbedding)}
    return frozenset(id(m.qs) for m in model.modules() if isinstance(m, BlockLinear) and id(m.qs) in tables
                     and m.fmt in DOT_FORMATS and m.qs.device.type == "cpu")


def _to_block_dot(model: nn.Module, only: frozenset[int] | None = None) -> None:
    """Every :data:`DOT_FORMATS` :class:`BlockLinear` of ``model`` (a copy) on the CPU → a :class:`BlockDotLinear` of
    the same blocks, in place (a layer registered twice becomes one new layer in both)."""
    made: dict[int, nn.Module] = {}
    for m in list(model.modules()):
        for name, child in list(m.named_children()):
            if isinstance(child, BlockLinear) and child.fmt in DOT_FORMATS and child.qs.device.type == "cpu" and \
                    (only is None or id(child.qs) in only):
                if id(child) not in made:
                    made[id(child)] = BlockDotLinear(child)
                setattr(m, name, made[id(child)])


def quantize(model: nn.Module, mode: str = "int8") -> nn.Module:
    """An inference copy of ``model`` in ``mode`` (``"none"``: the model itself); the model is not modified.

    Args:
        model: any module; its ``nn.Linear`` layers are quantized in ``"int8"`` and ``"int4"`` modes.
        mode: ``"none"``, ``"bf16"``, ``"int8"`` or ``"int4"`` (see the module docstring).
    """
    check_mode(mode)
    if mode == "none":
        return model
    out = copy.deepcopy(model, _share_tensors(model))
    out.eval()
    if mode == "int4":
        kept = _to_int4(out)
        if kept:
            logger.warning("int4: %d linear layer(s) stay float32 (4-bit blocks need in_features divisible by 32): "
                           "%s", len(kept), ", ".join(kept[:4]) + (" …" if len(kept) > 4 else ""))
        cpu = any(isinstance(m, BlockLinear) and m.qs.device.type == "cpu" for m in out.modules())
        if cpu and int8dot.blocks_available():
            _to_block_dot(out)
            pinned.pin(out, BlockDotLinear)  # the float steps before each rounding: one order, eager and compiled
        elif cpu:
            logger.info("int4: blocks multiplied without the integer-dot kernel (%s): dequantized per call, fused by "
                        "a compiled step", int8dot.blocks_unavailable_reason())
        return out
    if mode == "int8":
        # Layers in blocks become int8 from their blocks, a slice at a time (no float32 weight); an embedding in
        # blocks stays in them and dequantizes only the rows it looks up. A head tied to it stays in its blocks where
        # the block kernel multiplies them (the file's own weights), else it is int8 (per-row scales): either way the
        # copy holds no float32 table (Gemma 3's: 671 MB) and at most one quantized one.
        tied = _tied_tables(out)
        _blocks_to_int8(out, keep=tied)
        _to_block_dot(out, only=tied)
        _replace_linears(out, Int8Linear, lambda lin: lin.in_features % _K_ALIGN == 0)
        for m in out.modules():
            if isinstance(m, BlockEmbedding):
                m.out_dtype = torch.bfloat16  # the rows in the copy's dtype, as a bf16 nn.Embedding's
    else:
        _to_float(out)
    converted: dict[int, Tensor] = {}  # tied tensors (embedding = LM head) stay tied in the copy

    def low(t: Tensor) -> Tensor:
        if id(t) not in converted:
            converted[id(t)] = t.detach().to(torch.bfloat16) if t.is_floating_point() else t
        return converted[id(t)]

    for m in out.modules():
        if isinstance(m, (Int8Linear, BlockDotLinear, BlockEmbedding)):
            continue
        for k, p in m._parameters.items():
            if p is not None:
                m._parameters[k] = nn.Parameter(low(p), requires_grad=False)
        for k, b in m._buffers.items():
            if b is not None:
                m._buffers[k] = low(b)
    return out


def _signature(model: nn.Module) -> tuple | None:
    """Who the model's tensors are and how often each was changed in place, or None if untrackable."""
    try:
        return tuple((id(t), t.data_ptr(), t._version) for t in (*model.parameters(), *model.buffers()))
    except RuntimeError:  # inference-mode tensors keep no version counter
        return None


# model → (signature, {mode: decoding copy}). Weak keys: a copy lives no longer than its model.
_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def decoding_copy(model: nn.Module, mode: str = "none") -> nn.Module:
    """The copy of ``model`` that :func:`tokennet.sampling.stream` decodes with; the model is not modified.

    ``"bf16"``/``"int8"``: :func:`quantize`'s copy. ``"none"``: for a float32 model on the CPU, a copy whose
    ``nn.Linear`` layers are :class:`PackedLinear` (same weights, decoding layout; every other tensor is the
    model's own), elsewhere the model itself (cuBLAS needs no repacking).

    Building a copy costs a pass over the weights (packing SmolLM2-135M: 0.35 s, copy included), and a
    compiled decoding step is kept with its copy, so each mode's copy is kept with the model (weakly: it
    goes when the model goes) and reused while every parameter and buffer is the same tensor, at the same
    address, with the same in-place version counter. Any optimizer step, ``load_state_dict``, ``.to()`` or
    in-place edit changes one of those, and the next call builds it again: a stale copy is never used. The
    price is memory: the copy's weights live beside the model's.
    """
    check_mode(mode)
    blocks = any(isinstance(m, (BlockLinear, BlockEmbedding)) for m in model.modules())
    if mode == "none" and not blocks:
        linears = [m for m in model.modules() if type(m) is nn.Linear]
        if not linears or any(m.weight.device.type != "cpu" or m.weight.dtype != torch.float32 for m in linears):
            return model
    if any(type(p.data) is not torch.Tensor for p in model.parameters()):  # sharded (DTensor) and the like
        return model if mode == "none" else quantize(model, mode)
    sig = _signature(model)
    kept = _COPIES.get(model)
    if kept is not None and (sig is None or kept[0] != sig):
        del _COPIES[model]  # stale: drop every mode's copy before building the next one
        kept = None
    if kept is not None and mode in kept[1]:
        return kept[1][mode]
    if mode == "none":  # float32: blocks dequantized, every linear layer packed
        out = copy.deepcopy(model, _share_tensors(model))
        out.eval()
        _to_float(out)
        if all(m.weight.device.type == "cpu" for m in out.modules() if type(m) is nn.Linear):
            _replace_linears(out, PackedLinear)
    else:
        out = quantize(model, mode)
    if sig is not None:
        _COPIES.setdefault(model, (sig, {}))[1][mode] = out
    return out
