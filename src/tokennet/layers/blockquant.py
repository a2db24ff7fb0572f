"""Weights in blocks with their own scales: GGUF's Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K and Q6_K, kept as they are.

llama.cpp stores a quantized matrix ``W (N, K)`` row by row in blocks of 32 weights along K; block ``g`` of
row ``n`` holds small integers ``q`` and a float16 scale ``d`` (and, in Q4_1, a float16 minimum ``m``)::

    Q8_0:  W_nk = d_ng · q_nk,          q ∈ [−127, 127]   (34 bytes per 32 weights)
    Q4_0:  W_nk = d_ng · (q_nk − 8),    q ∈ [0, 15]       (18 bytes)
    Q4_1:  W_nk = d_ng · q_nk + m_ng,   q ∈ [0, 15]       (20 bytes)

with ``g = ⌊k / 32⌋``. A 4-bit block packs its 32 values in 16 bytes: byte ``j`` holds value ``j`` in its low
nibble and value ``j + 16`` in its high nibble. :class:`BlockLinear` keeps exactly those bits (``qs``,
``d``, ``m`` as tensors, one row of blocks per output channel), so a GGUF file's weights are read as
llama.cpp reads them, and a 4-bit layer reads about a sixth of the bytes of float32 per token.

Q5_0 and the K-quants (llama.cpp's ``ggml-common.h``) are kept as the file's bytes, ``qs`` ``(N, G·B)`` uint8 for
``B`` bytes per block (no separate ``d``/``m``); their blocks and formulas::

    Q5_0 (32 weights, 22 bytes):   d (f16) · qh (4 bytes: bit j = 5th bit of weight j) · qs (16 bytes of nibbles)
                                   W_k = d · (q_k − 16),  q ∈ [0, 31]
    Q4_K (256 weights, 144 bytes): d, dmin (f16) · 12 bytes of eight 6-bit (scale, min) pairs · 128 bytes of nibbles
                                   W_k = d·s_j · q_k − dmin·m_j  for sub-block j = ⌊k / 32⌋, q ∈ [0, 15]
    Q5_K (256 weights, 176 bytes): as Q4_K, plus qh (32 bytes: bit j of byte i = 5th bit of weight 32j + i)
                                   W_k = d·s_j · q_k − dmin·m_j,  q ∈ [0, 31]
    Q6_K (256 weights, 210 bytes): ql (128 bytes of low nibbles) · qh (64 bytes of 2-bit pairs) · 16 int8 scales · d
                                   W_k = d·s_j · (q_k − 32)  for sub-block j = ⌊k / 16⌋, q ∈ [0, 63]

In a K-quant, the 4-bit value of weight ``64c + 32h + i`` is nibble ``h`` (low, high) of byte ``32c + i``; in Q6_K
the low nibble of weight ``128c + 32h + i`` is nibble ``⌊h/2⌋`` of byte ``64c + 32(h mod 2) + i`` and its two high
bits are bits ``2h, 2h+1`` of ``qh[32c + i]``. The unpacking is a few vectorized shifts and masks over all
blocks at once (no loop over blocks).

Dequantization is the formula above in float32 (the ``gguf`` package's, bit for bit). A decoding step
compiled by torch.compile computes ``y = x Wᵀ`` without forming ``W``: for Q4,
``y_n = Σ_g d_ng Σ_{j<16} (x_{g,j} lo_ngj + x_{g,j+16} hi_ngj) + Σ_g m_ng Σ_{k∈g} x_k``, which Inductor turns
into one loop over the packed bytes. On an x86 CPU with AVX-512 VNNI, ``quantize(model, "int4")`` replaces
Q8_0/Q4_0/Q4_1/Q5_0 and Q4_K/Q5_K/Q6_K layers by :class:`tokennet.layers.quantize.BlockDotLinear`: the same
blocks, multiplied by int8 activations with integer dot products (:mod:`tokennet.layers.int8dot`), eager and
compiled alike.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["FORMATS", "QUANTIZE_FORMATS", "RAW_FORMATS", "GROUP", "QK_K", "group_size", "raw_dequantize",
           "BlockLinear", "BlockEmbedding", "quantize_blocks", "dequantize_blocks",
           "block_bytes", "gemv", "gemv_rows", "symbolic_rows", "unwritten_blocks", "GEMV_ROWS", "WIDENS_TO_Q8_0",
           "widen_to_q8_0", "pack4", "unpack4"]

FORMATS = ("q8_0", "q4_0", "q4_1", "q5_0", "q4_k", "q5_k", "q6_k")
QUANTIZE_FORMATS = ("q8_0", "q4_0", "q4_1")  # the formats quantize_blocks makes (the others are read from files)
RAW_FORMATS = ("q5_0", "q4_k", "q5_k", "q6_k")  # kept as the file's bytes: qs (N, G·B) uint8, no d or m
GROUP = 32  # weights per block along K (Q8_0, Q4_0, Q4_1, Q5_0)
QK_K = 256  # weights per K-quant super-block
_BYTES = {"q8_0": 34, "q4_0": 18, "q4_1": 20, "q5_0": 22, "q4_k": 144, "q5_k": 176, "q6_k": 210}  # per block
_GROUPS = {"q4_k": QK_K, "q5_k": QK_K, "q6_k": QK_K}

# Up to this many rows, a linear layer traced by torch.compile is written as a sum of products (see gemv).
GEMV_ROWS = 4


_UNWRITTEN = False  # True while unwritten_blocks() is active


@contextlib.contextmanager
def unwritten_blocks():
    """While active, :meth:`BlockLinear.reset_parameters` leaves a layer's blocks as allocated: for a loader that
    builds a model whose blocks it replaces next by a file's (memory allocated and never written is never touched,
    so it costs no resident memory before it is freed). Outside it, a model made without a file has zero blocks."""
    global _UNWRITTEN
    before, _UNWRITTEN = _UNWRITTEN, True
    try:
        yield
    finally:
        _UNWRITTEN = before


_SYMBOLIC_ROWS = False  # True while symbolic_rows() is active (Dynamo reads it as a constant and guards on it)


@contextlib.contextmanager
def symbolic_rows(on: bool = True):
    """While active, :func:`gemv_rows` is False: for a caller that traces a graph whose row count is symbolic
    (the serving engine's batch from 2 rows on, marked dynamic). Inductor's loop over a symbolic number of rows
    is not the one-pass loop of a static one (measured: the engine's 2–4-row int8 graph decoded 6× slower per
    step than its 1-row graph), and a branch on the symbolic count would guard the graph into ranges of rows."""
    global _SYMBOLIC_ROWS
    before, _SYMBOLIC_ROWS = _SYMBOLIC_ROWS, on
    try:
        yield
    finally:
        _SYMBOLIC_ROWS = before


def gemv_rows(x: Tensor) -> bool:
    """Whether a linear layer writes ``x (M, K)`` as :func:`gemv`: while torch.compile traces it, outside
    :func:`symbolic_rows`, with up to ``GEMV_ROWS`` rows."""
    return torch.compiler.is_compiling() and not _SYMBOLIC_ROWS and x.shape[0] <= GEMV_ROWS


def gemv(x: Tensor, weight: Tensor) -> Tensor:
    """``y = x Wᵀ`` as ``y_mn = Σ_k x_mk W_nk`` written elementwise, for a few rows ``x (M, K)`` and ``W (N, K)``.

    The same numbers as ``F.linear`` up to float rounding. Its point is what torch.compile makes of it:
    Inductor fuses the product, the sum and whatever produced ``W`` (a conversion from int8 or bfloat16,
    a dequantization) into one C++ loop that reads each stored weight once, at memory speed, where a
    matrix-multiply kernel would be called on a dequantized copy. Eager PyTorch would materialize the
    ``(M, N, K)`` product: call it only while compiling (``torch.compiler.is_compiling()``).
    """
    return (x.float()[:, None, :] * weight.float()).sum(-1)  # (M, 1, K) · (N, K) → (M, N)


def block_bytes(fmt: str) -> int:
    """Bytes per block (32 weights, or 256 for a K-quant) in a GGUF file (scales included)."""
    return _BYTES[fmt]


def group_size(fmt: str) -> int:
    """Weights per block along K: 32, or 256 for the K-quants."""
    return _GROUPS.get(fmt, GROUP)


def _check(fmt: str, K: int) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"block format must be one of {FORMATS}, got {fmt!r}")
    if K % group_size(fmt):
        raise ValueError(f"{fmt} needs in_features divisible by {group_size(fmt)}, got {K}")


def _f16(b: Tensor) -> Tensor:
    """Two bytes per row ``(n, 2)`` uint8 → their float16 as float32 ``(n, 1)``."""
    return b.contiguous().view(torch.float16).float()


def _nibbles(qs: Tensor, width: int) -> Tensor:
    """Bytes ``(n, C·width)`` → ``(n, C·2, width)``: chunk c's low nibbles, then its high nibbles."""
    n = qs.shape[0]
    b = qs.reshape(n, -1, 1, width)  # (n, C, 1, width)
    return torch.cat([b & 15, b >> 4], dim=2).reshape(n, -1, width)  # (n, C, 2, width) → (n, 2C, width)


def _k_scales(s: Tensor) -> tuple[Tensor, Tensor]:
    """Q4_K/Q5_K's 12 bytes ``(n, 12)`` → eight 6-bit scales and eight 6-bit mins, each ``(n, 8)`` float32.

    Bytes 0–3 hold scales 0–3 (low 6 bits) and the top 2 bits of scales 4–7; bytes 4–7 the same for the mins;
    bytes 8–11 the low 4 bits of scales 4–7 (low nibble) and mins 4–7 (high nibble).
    """
    n = s.shape[0]
    s = s.reshape(n, 3, 4)  # (n, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], -1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], -1)
    return sc.float(), mn.float()


def raw_dequantize(fmt: str, raw: Tensor) -> Tensor:
    """The float32 weights ``(..., K)`` of a row's GGUF bytes ``raw (..., G·B)`` in a :data:`RAW_FORMATS` format.

    The same float32 operations, in the same order, as the ``gguf`` package's ``dequantize`` (bit for bit).
    """
    *lead, nbytes = raw.shape
    B, Q = _BYTES[fmt], group_size(fmt)
    b = raw.reshape(-1, B)  # (n blocks, B)
    n = b.shape[0]
    if fmt == "q5_0":
        d = _f16(b[:, 0:2])
        h = b[:, 2:6].to(torch.int64)
        qh = h[:, 0] | (h[:, 1] << 8) | (h[:, 2] << 16) | (h[:, 3] << 24)  # (n,) the little-endian uint32
        hi = (qh[:, None] >> torch.arange(32, device=b.device)) & 1  # (n, 32)
        lo = _nibbles(b[:, 6:22], 16).reshape(n, 32)
        w = d * ((lo.to(torch.int64) | (hi << 4)).float() - 16)
    elif fmt in ("q4_k", "q5_k"):
        d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
        sc, mn = _k_scales(b[:, 4:16])
        ds, dm = (d * sc)[..., None], (dmin * mn)[..., None]  # (n, 8, 1)
        q = _nibbles(b[:, 16:144] if fmt == "q4_k" else b[:, 48:176], 32)  # (n, 8, 32)
        if fmt == "q5_k":
            qh = b[:, 16:48].reshape(n, 1, 32) >> torch.arange(8, dtype=torch.uint8, device=b.device)[:, None]
            q = q | ((qh & 1) << 4)  # (n, 8, 32): bit j of byte i is weight 32j + i's 5th bit
        w = ds * q.float() - dm
    elif fmt == "q6_k":
        ql = _nibbles(b[:, 0:128], 64).reshape(n, 8, 32)  # (n, 2, 2, 64) → (n, 8, 32)
        shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=b.device)[:, None]
        qh = ((b[:, 128:192].reshape(n, 2, 1, 32) >> shifts) & 3).reshape(n, 8, 32)  # (n, 2, 4, 32) → (n, 8, 32)
        q = ((ql | (qh << 4)).float() - 32).reshape(n, 16, 16)  # (n, 16 sub-blocks, 16)
        ds = _f16(b[:, 208:210]) * b[:, 192:208].view(torch.int8).float()  # (n, 16)
        w = ds[..., None] * q
    else:
        raise ValueError(f"{fmt} is not a raw block format ({RAW_FORMATS})")
    return w.reshape(*lead, nbytes // B * Q)


def unpack4(qs: Tensor) -> Tensor:
    """4-bit values ``(..., G·16)`` bytes → ``(..., G·32)`` integers 0..15, in the order of the weights (byte j of a
    block holds value j in its low nibble, value j + 16 in its high one)."""
    *lead, half = qs.shape
    b = qs.reshape(*lead, half // 16, 1, 16)  # (..., G, 1, 16)
    return torch.cat([b & 15, b >> 4], dim=-2).reshape(*lead, 2 * half)  # (..., G, 2, 16) → (..., K)


def pack4(q: Tensor) -> Tensor:
    """Integers 0..15 ``(N, G·32)`` → GGUF's 4-bit bytes ``(N, G·16)``: the inverse of :func:`unpack4`."""
    N, K = q.shape
    v = q.to(torch.uint8).view(N, K // GROUP, 2, 16)  # values j and j + 16 of each block
    return (v[:, :, 0] | (v[:, :, 1] << 4)).reshape(N, K // 2)


def dequantize_blocks(fmt: str, qs: Tensor, d: Tensor | None = None, m: Tensor | None = None) -> Tensor:
    """The float32 weights ``(..., K)`` of blocks ``qs (..., K or K/2)``, ``d (..., G)``, ``m (..., G)`` (for a
    :data:`RAW_FORMATS` format, ``qs`` is the file's bytes and ``d``, ``m`` are None)."""
    if fmt in RAW_FORMATS:
        return raw_dequantize(fmt, qs)
    if fmt == "q8_0":
        q = qs.float()
    else:
        q = unpack4(qs).float()
    *lead, K = q.shape
    q = q.view(*lead, K // GROUP, GROUP)  # (..., G, 32)
    if fmt == "q4_0":
        q = q - 8
    w = d.float()[..., None] * q
    if fmt == "q4_1":
        w = w + m.float()[..., None]
    return w.view(*lead, K)


WIDENS_TO_Q8_0 = ("q8_0", "q4_0", "q5_0")  # formats whose blocks are Q8_0 blocks exactly (see widen_to_q8_0)


def widen_to_q8_0(fmt: str, qs: Tensor, d: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Q4_0 or Q5_0 blocks ``(N, …)`` as Q8_0 blocks ``(qs (N, K) int8, d (N, G) float16)`` of the same weights.

    A Q4_0 or Q5_0 weight is ``d · (q − o)`` with a float16 ``d`` per 32 weights and ``q − o`` in [−8, 7] or
    [−16, 15]; Q8_0's ``d · q`` holds it with the same ``d`` and ``q = q − o``, so :func:`dequantize_blocks` gives
    the same float32 weights bit for bit (one float16 → float32 scale times one small integer, in both). What
    the import does to a projection whose rows mix these formats (Gemma 3's Q5_0 Q and K, Q8_0 V).
    """
    if fmt == "q8_0":
        return qs, d
    if fmt == "q4_0":
        return (unpack4(qs).to(torch.int8) - 8), d
    if fmt != "q5_0":
        raise ValueError(f"{fmt} blocks are not Q8_0 blocks; only {WIDENS_TO_Q8_0} widen exactly")
    N = qs.shape[0]
    b = qs.reshape(N, -1, _BYTES["q5_0"])  # (N, G, 22)
    h = b[..., 2:6].to(torch.int32)
    qh = h[..., 0] | (h[..., 1] << 8) | (h[..., 2] << 16) | (h[..., 3] << 24)  # (N, G) the little-endian 32 bits
    hi = ((qh[..., None] >> torch.arange(32, dtype=torch.int32)) & 1).to(torch.uint8)  # (N, G, 32)
    lo = unpack4(b[..., 6:22])  # (N, G, 32) integers 0..15
    q = ((lo | (hi << 4)).to(torch.int8) - 16).reshape(N, -1)  # (N, K) in [−16, 15]
    return q, b[..., 0:2].contiguous().view(torch.float16)[..., 0]


def quantize_blocks(w: Tensor, fmt: str) -> tuple[Tensor, Tensor, Tensor | None]:
    """Quantize float weights ``(N, K)`` into blocks ``(qs, d, m)`` as llama.cpp does (the ``gguf`` package's formulas).

    Q8_0: ``d = max|w| / 127``, ``q = round(w / d)`` (half away from zero). Q4_0: ``d = w* / −8`` for the
    weight ``w*`` of largest magnitude, ``q = min(15, ⌊w / d + 8.5⌋)``. Q4_1: ``d = (max − min) / 15``,
    ``m = min``, ``q = min(15, ⌊(w − min) / d + 0.5⌋)``. Scales are stored in float16.
    """
    N, K = w.shape
    _check(fmt, K)
    if fmt not in QUANTIZE_FORMATS:
        raise ValueError(f"quantize_blocks makes {QUANTIZE_FORMATS}; {fmt} blocks are read from GGUF files")
    b = w.detach().float().reshape(N, K // GROUP, GROUP)  # (N, G, 32)
    m = None
    if fmt == "q8_0":
        d = b.abs().amax(-1, keepdim=True) / 127
        inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
        x = b * inv
        qs = (x.sign() * (x.abs() + 0.5).floor()).to(torch.int8).reshape(N, K)  # roundf: half away from zero
    else:
        if fmt == "q4_0":
            idx = b.abs().argmax(-1, keepdim=True)
            d = b.gather(-1, idx) / -8
            inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
            q = torch.trunc(b * inv + 8.5)
        else:
            lo, hi = b.amin(-1, keepdim=True), b.amax(-1, keepdim=True)
            d = (hi - lo) / 15
            inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
            q = torch.trunc((b - lo) * inv + 0.5)
            m = lo[..., 0].half()
        qs = pack4(q.clamp(0, 15).reshape(N, K))
    return qs, d[..., 0].half(), m


DENSE_CHUNK = 1 << 22  # weights of more values than this are dequantized for a product in slices of rows (16 MB)


class BlockLinear(nn.Module):
    """``y = x Wᵀ + b`` with ``W`` in GGUF blocks (one of :data:`FORMATS`); for inference.

    Buffers: ``qs`` (``(N, K)`` int8 for Q8_0, ``(N, K/2)`` uint8 of packed nibbles for Q4), ``d`` (``(N, K/32)``
    float16 scales), ``m`` (Q4_1's float16 minimums) and ``bias`` (float32, optional); for Q5_0 and the
    K-quants, ``qs`` is each row's GGUF bytes ``(N, G·B)`` uint8 and ``d``, ``m`` are None. Outside torch.compile
    the layer multiplies by the dequantized weight; traced by torch.compile with a few rows, it computes
    the fused sum of the module docstring.

    Args:
        in_features, out_features: K and N.
        fmt: the block format.
        bias: hold a bias.
    """

    def __init__(self, in_features: int, out_features: int, fmt: str, *, bias: bool = False):
        super().__init__()
        _check(fmt, in_features)
        self.in_features, self.out_features, self.fmt = in_features, out_features, fmt
        N, K, G = out_features, in_features, in_features // group_size(fmt)
        if fmt in RAW_FORMATS:
            qs = torch.zeros(N, G * _BYTES[fmt], dtype=torch.uint8)
        else:
            qs = torch.zeros(N, K, dtype=torch.int8) if fmt == "q8_0" else torch.zeros(N, K // 2, dtype=torch.uint8)
        self.register_buffer("qs", qs)
        self.register_buffer("d", None if fmt in RAW_FORMATS else torch.zeros(N, G, dtype=torch.float16))
        self.register_buffer("m", torch.zeros(N, G, dtype=torch.float16) if fmt == "q4_1" else None)
        self.register_buffer("bias", torch.zeros(N) if bias else None)

    def reset_parameters(self) -> None:
        """Zero blocks (a layer whose buffers were allocated, not written), unless :func:`unwritten_blocks` is on."""
        if _UNWRITTEN:
            return
        for t in (self.qs, self.d, self.m, self.bias):
            if t is not None:
                t.zero_()

    @classmethod
    def from_float(cls, linear: nn.Linear, fmt: str) -> BlockLinear:
        """Quantize a linear layer (read, not modified)."""
        out = cls(linear.in_features, linear.out_features, fmt, bias=linear.bias is not None)
        out.set_blocks(*quantize_blocks(linear.weight, fmt))
        if linear.bias is not None:
            out.bias = linear.bias.detach().float().clone()
        return out

    def set_blocks(self, qs: Tensor, d: Tensor | None = None, m: Tensor | None = None) -> None:
        """Use the given blocks (GGUF's bits, e.g.) as the weight; shapes must be this layer's."""
        for name, t in (("qs", qs), ("d", d), ("m", m)):
            mine = getattr(self, name)
            if (t is None) != (mine is None) or (t is not None and (t.shape != mine.shape or t.dtype != mine.dtype)):
                raise ValueError(f"{self.fmt} block tensor {name}: expected "
                                 f"{None if mine is None else (tuple(mine.shape), mine.dtype)}, got "
                                 f"{None if t is None else (tuple(t.shape), t.dtype)}")
            if t is not None:
                setattr(self, name, t)

    def dequantized_weight(self) -> Tensor:
        """``W`` ``(N, K)`` in float32, the plain formula (what the fused forward is tested against)."""
        return dequantize_blocks(self.fmt, self.qs, self.d, self.m)

    def _fused(self, x: Tensor) -> Tensor:
        """``x (M, K) → (M, N)`` without forming ``W``: the sums of the module docstring."""
        M, K = x.shape
        N, G = self.out_features, K // GROUP
        if self.fmt in RAW_FORMATS:  # Inductor fuses the unpacking into the product's loop
            return gemv(x, raw_dequantize(self.fmt, self.qs))
        if self.fmt == "q8_0":
            w = (self.qs.view(N, G, GROUP).float() * self.d.float()[:, :, None]).view(N, K)  # fused, never stored
            return gemv(x, w)
        xg = x.float().view(M, G, 2, GROUP // 2)  # (M, G, 2, 16): the inputs of low and high nibbles
        xl = xg[:, :, 0].reshape(M, 1, K // 2)
        xh = xg[:, :, 1].reshape(M, 1, K // 2)
        q = self.qs.to(torch.int32)  # AVX-512 has no 8-bit shift: unpacking in 32-bit lanes measured 1.5× faster
        lo, hi = (q & 15).float(), (q >> 4).float()  # (N, K/2)
        d = self.d.float()[:, :, None].expand(N, G, GROUP // 2).reshape(N, K // 2)  # each byte's scale
        y = (d * (xl * lo + xh * hi)).sum(-1)  # (M, N)
        xs = xg.sum((2, 3))[:, None, :]  # (M, 1, G): Σ_{k∈g} x_k
        if self.fmt == "q4_1":
            return y + (xs * self.m.float()).sum(-1)
        return y - 8 * (xs * self.d.float()).sum(-1)

    def forward(self, x: Tensor) -> Tensor:
        """``(..., K) → (..., N)`` in x's dtype."""
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)  # (M, K)
        # (torch.export traces with dynamic batch and length: a branch on the row count would pin them)
        if not torch.compiler.is_exporting() and gemv_rows(x2):
            y = self._fused(x2)
            if self.bias is not None:
                y = y + self.bias
            y = y.to(x.dtype)
        elif self.out_features * self.in_features <= DENSE_CHUNK or torch.compiler.is_compiling():
            b = None if self.bias is None else self.bias.to(x.dtype)
            y = F.linear(x2, self.dequantized_weight().to(x.dtype), b)
        else:  # a large weight (Gemma's 262,144-row tied head: 671 MB in float32) dequantized a slice of rows at a time
            y = torch.empty(x2.shape[0], self.out_features, dtype=x.dtype, device=x.device)
            step = max(1, DENSE_CHUNK // self.in_features)
            for a in range(0, self.out_features, step):
                rows = slice(a, a + step)
                w = dequantize_blocks(self.fmt, self.qs[rows], None if self.d is None else self.d[rows],
                                      None if self.m is None else self.m[rows])
                b = None if self.bias is None else self.bias[rows].to(x.dtype)
                y[:, rows] = F.linear(x2, w.to(x.dtype), b)
        return y.view(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, fmt={self.fmt}, "
                f"bias={self.bias is not None}")


class BlockEmbedding(nn.Module):
    """A token embedding whose table is the weight of a :class:`BlockLinear`: row ``i`` dequantized on lookup.

    Tied to an LM head, the two modules hold the same block tensors (one copy in memory and on disk).

    Args:
        blocks: the layer whose weight ``(V, D)`` is the table.
    """

    def __init__(self, blocks: BlockLinear):
        super().__init__()
        if blocks.bias is not None:
            raise ValueError("an embedding table has no bias")
        self.num_embeddings, self.embedding_dim, self.fmt = blocks.out_features, blocks.in_features, blocks.fmt
        self.register_buffer("qs", blocks.qs)
        self.register_buffer("d", blocks.d)
        self.register_buffer("m", blocks.m)
        self.out_dtype = torch.float32  # the rows' dtype (an inference copy in bfloat16 sets it)

    def forward(self, idx: Tensor) -> Tensor:
        """Token ids ``(...)`` → rows ``(..., D)`` in ``out_dtype`` (float32)."""
        m = None if self.m is None else self.m[idx]
        d = None if self.d is None else self.d[idx]
        return dequantize_blocks(self.fmt, self.qs[idx], d, m).to(self.out_dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, fmt={self.fmt}"
