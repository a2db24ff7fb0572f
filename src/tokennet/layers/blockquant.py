"""Weights in blocks of 32 with their own scale: GGUF's Q8_0, Q4_0 and Q4_1, kept as they are.

llama.cpp stores a quantized matrix ``W (N, K)`` row by row in blocks of 32 weights along K; block ``g`` of
row ``n`` holds small integers ``q`` and a float16 scale ``d`` (and, in Q4_1, a float16 minimum ``m``)::

    Q8_0:  W_nk = d_ng · q_nk,          q ∈ [−127, 127]   (34 bytes per 32 weights)
    Q4_0:  W_nk = d_ng · (q_nk − 8),    q ∈ [0, 15]       (18 bytes)
    Q4_1:  W_nk = d_ng · q_nk + m_ng,   q ∈ [0, 15]       (20 bytes)

with ``g = ⌊k / 32⌋``. A 4-bit block packs its 32 values in 16 bytes: byte ``j`` holds value ``j`` in its low
nibble and value ``j + 16`` in its high nibble. :class:`BlockLinear` keeps exactly those bits (``qs``,
``d``, ``m`` as tensors, one row of blocks per output channel), so a GGUF file's weights are read as
llama.cpp reads them, and a 4-bit layer reads about a sixth of the bytes of float32 per token.

Dequantization is the formula above in float32 (the ``gguf`` package's, bit for bit). A decoding step
compiled by torch.compile computes ``y = x Wᵀ`` without forming ``W``: for Q4,
``y_n = Σ_g d_ng Σ_{j<16} (x_{g,j} lo_ngj + x_{g,j+16} hi_ngj) + Σ_g m_ng Σ_{k∈g} x_k``, which Inductor turns
into one loop over the packed bytes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["FORMATS", "GROUP", "BlockLinear", "BlockEmbedding", "quantize_blocks", "dequantize_blocks",
           "block_bytes", "gemv", "GEMV_ROWS"]

FORMATS = ("q8_0", "q4_0", "q4_1")
GROUP = 32  # weights per block along K
_BYTES = {"q8_0": 34, "q4_0": 18, "q4_1": 20}  # per block, as stored in a GGUF file

# Up to this many rows, a linear layer traced by torch.compile is written as a sum of products (see gemv).
GEMV_ROWS = 4


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
    """Bytes per block of 32 weights in a GGUF file (scales included)."""
    return _BYTES[fmt]


def _check(fmt: str, K: int) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"block format must be one of {FORMATS}, got {fmt!r}")
    if K % GROUP:
        raise ValueError(f"{fmt} needs in_features divisible by {GROUP}, got {K}")


def _unpack4(qs: Tensor) -> Tensor:
    """4-bit values ``(..., G·16)`` bytes → ``(..., G·32)`` integers 0..15, in the order of the weights."""
    *lead, half = qs.shape
    b = qs.reshape(*lead, half // 16, 1, 16)  # (..., G, 1, 16)
    return torch.cat([b & 15, b >> 4], dim=-2).reshape(*lead, 2 * half)  # (..., G, 2, 16) → (..., K)


def dequantize_blocks(fmt: str, qs: Tensor, d: Tensor, m: Tensor | None = None) -> Tensor:
    """The float32 weights ``(..., K)`` of blocks ``qs (..., K or K/2)``, ``d (..., G)``, ``m (..., G)``."""
    if fmt == "q8_0":
        q = qs.float()
    else:
        q = _unpack4(qs).float()
    *lead, K = q.shape
    q = q.view(*lead, K // GROUP, GROUP)  # (..., G, 32)
    if fmt == "q4_0":
        q = q - 8
    w = d.float()[..., None] * q
    if fmt == "q4_1":
        w = w + m.float()[..., None]
    return w.view(*lead, K)


def quantize_blocks(w: Tensor, fmt: str) -> tuple[Tensor, Tensor, Tensor | None]:
    """Quantize float weights ``(N, K)`` into blocks ``(qs, d, m)`` as llama.cpp does (the ``gguf`` package's formulas).

    Q8_0: ``d = max|w| / 127``, ``q = round(w / d)`` (half away from zero). Q4_0: ``d = w* / −8`` for the
    weight ``w*`` of largest magnitude, ``q = min(15, ⌊w / d + 8.5⌋)``. Q4_1: ``d = (max − min) / 15``,
    ``m = min``, ``q = min(15, ⌊(w − min) / d + 0.5⌋)``. Scales are stored in float16.
    """
    N, K = w.shape
    _check(fmt, K)
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
        q = q.clamp(0, 15).to(torch.uint8).view(N, K // GROUP, 2, 16)  # values j and j + 16 of each block
        qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(N, K // 2)
    return qs, d[..., 0].half(), m


class BlockLinear(nn.Module):
    """``y = x Wᵀ + b`` with ``W`` in GGUF blocks (``"q8_0"``, ``"q4_0"``, ``"q4_1"``); for inference.

    Buffers: ``qs`` (``(N, K)`` int8 for Q8_0, ``(N, K/2)`` uint8 of packed nibbles for Q4), ``d`` (``(N, K/32)``
    float16 scales), ``m`` (Q4_1's float16 minimums) and ``bias`` (float32, optional). Outside torch.compile
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
        N, K, G = out_features, in_features, in_features // GROUP
        qs = torch.zeros(N, K, dtype=torch.int8) if fmt == "q8_0" else torch.zeros(N, K // 2, dtype=torch.uint8)
        self.register_buffer("qs", qs)
        self.register_buffer("d", torch.zeros(N, G, dtype=torch.float16))
        self.register_buffer("m", torch.zeros(N, G, dtype=torch.float16) if fmt == "q4_1" else None)
        self.register_buffer("bias", torch.zeros(N) if bias else None)

    @classmethod
    def from_float(cls, linear: nn.Linear, fmt: str) -> BlockLinear:
        """Quantize a linear layer (read, not modified)."""
        out = cls(linear.in_features, linear.out_features, fmt, bias=linear.bias is not None)
        out.set_blocks(*quantize_blocks(linear.weight, fmt))
        if linear.bias is not None:
            out.bias = linear.bias.detach().float().clone()
        return out

    def set_blocks(self, qs: Tensor, d: Tensor, m: Tensor | None = None) -> None:
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
        if torch.compiler.is_compiling() and x2.shape[0] <= GEMV_ROWS:
            y = self._fused(x2)
            if self.bias is not None:
                y = y + self.bias
            y = y.to(x.dtype)
        else:
            b = None if self.bias is None else self.bias.to(x.dtype)
            y = F.linear(x2, self.dequantized_weight().to(x.dtype), b)
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

    def forward(self, idx: Tensor) -> Tensor:
        """Token ids ``(...)`` → float32 rows ``(..., D)``."""
        m = None if self.m is None else self.m[idx]
        return dequantize_blocks(self.fmt, self.qs[idx], self.d[idx], m)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, fmt={self.fmt}"
