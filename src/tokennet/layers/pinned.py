"""Pinned float steps: the same greedy tokens from a compiled decoding step and an eager one.

An int4 decoding copy (:func:`tokennet.layers.quantize.quantize`, the block kernel) rounds its activations to int8
before every integer product (:mod:`tokennet.layers.int8dot`). Two floats one ulp apart on either side of a
rounding boundary then become different integers, and a step later the logits differ by tenths, not by 1e-5: a
compiled step (Inductor's loops, their own order of each sum) and the eager step (PyTorch's kernels) part after a
few dozen greedy tokens where their float32 models would not (measured on SmolLM2-135M Q4_1: the first token that
differs at step 44 of 128, its eager top-2 margin 0.06).

So the float steps whose results meet such a rounding are computed by one C++ function each, with a fixed order of
every sum, called eagerly and from a compiled graph alike (there an opaque operation, its output shape declared
in :mod:`~tokennet.layers.int8dot`): the norms (:class:`PinnedRMSNorm`), RoPE's cos and sin (:class:`PinnedRotary`),
attention over the cache (:func:`pinned_attention`) and the MLP's activation (:class:`PinnedActivation`). What is
left to Inductor is one rounding per element (a residual sum, RoPE's rotation, the gate's product), which it
computes as PyTorch does (it fuses no multiply–add). Both paths then give the same floats, bit for bit, and the
same greedy tokens. :func:`pin` installs them in a copy; a compiled step keeps them (:mod:`tokennet.sampling`).

The steps are the formulas the layers they replace compute, in another order of the sums: the logits of a pinned
copy are those of the unpinned one up to float32 rounding.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..attention.multihead import MultiHeadAttention, use_kernel
from ..position.rope import RotaryEmbedding
from . import int8dot
from .norm import OffsetRMSNorm

__all__ = ["PinnedRMSNorm", "PinnedActivation", "PinnedRotary", "pinned_attention", "pin", "is_pinned",
           "EAGER_QUERIES"]

# A prompt of more queries than this is attended by the layer's own backend (a fused kernel, faster there): it is
# eager in both paths (a compiled step takes one token, a verification a few), so the paths still agree.
EAGER_QUERIES = 64

_ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}


def _ops():
    return torch.ops.tokennet_int8dot


class PinnedRMSNorm(nn.Module):
    """``y = x / √(mean(x²) + ε) ⊙ (w + offset)`` over the last dim in float32 (the squares summed in order, in
    float64): ``nn.RMSNorm`` (offset 0) or Gemma's :class:`~tokennet.layers.norm.OffsetRMSNorm` (offset 1).

    Args:
        norm: the layer replaced (its weight is shared, not copied).
    """

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.weight = norm.weight
        self.offset = 1.0 if isinstance(norm, OffsetRMSNorm) else 0.0
        eps = norm.eps
        self.eps = float(torch.finfo(torch.float32).eps if eps is None else eps)

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, x.shape[-1]).float().contiguous()
        y = _ops().rms_norm(rows, self.weight.float(), self.eps, self.offset)
        return y.view(x.shape).to(x.dtype)

    def extra_repr(self) -> str:
        return f"dim={self.weight.numel()}, eps={self.eps}, offset={self.offset}"


class PinnedActivation(nn.Module):
    """SiLU ``x σ(x)`` or GELU's tanh form, elementwise in float32.

    Args:
        kind: ``"silu"`` or ``"gelu_tanh"``.
    """

    def __init__(self, kind: str):
        super().__init__()
        if kind not in _ACTIVATIONS:
            raise ValueError(f"PinnedActivation takes {sorted(_ACTIVATIONS)}, not {kind!r}")
        self.kind = kind

    def forward(self, x: Tensor) -> Tensor:
        return _ops().activation(x.float().contiguous(), _ACTIVATIONS[self.kind]).to(x.dtype)

    def extra_repr(self) -> str:
        return self.kind


class PinnedRotary(RotaryEmbedding):
    """:class:`~tokennet.position.rope.RotaryEmbedding` whose cos and sin of the angles ``i·θ_j`` are taken in C++
    (the angles themselves are one product each, the same in both paths).

    Args:
        rope: the tables' module replaced (its ``inv_freq`` is shared).
    """

    def __init__(self, rope: RotaryEmbedding):
        nn.Module.__init__(self)
        self.head_dim, self.base = rope.head_dim, rope.base
        self.register_buffer("inv_freq", rope.inv_freq, persistent=False)

    def cos_sin(self, freqs: Tensor) -> tuple[Tensor, Tensor]:
        if freqs.dtype != torch.float32:
            return super().cos_sin(freqs)
        rows = freqs.reshape(-1, freqs.shape[-1]).contiguous()
        cos, sin = _ops().cos_sin(rows)
        shape = (*freqs.shape[:-1], 2 * freqs.shape[-1])
        return cos.view(shape), sin.view(shape)


def pinned_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, *, bias: Tensor | None, dropout: float,
                     return_weights: bool, is_causal: bool = False) -> Tensor | None:
    """An attention kernel (:func:`~tokennet.attention.multihead.use_kernel`): ``softmax(Q Kᵀ / √E) V`` in C++, keys
    in order (scores, their maximum, ``exp``, the weighted sum of values, then one division), for a step's few
    queries against the cache; a boolean mask ``(N, L)`` or ``(B or 1, 1, N or 1, L)`` and the causal rule (the
    queries are the last ``N`` positions) both apply; a query with no key gives 0. Float32 only. A longer prompt
    (more than :data:`EAGER_QUERIES` queries, eager in every path), a bias, dropout or the weights asked for are left
    to the layer's backend (None)."""
    if bias is not None or dropout or return_weights or q.dtype != torch.float32:
        return None
    B, H, N, _ = q.shape
    if N > EAGER_QUERIES and not torch.compiler.is_compiling():
        return None
    L = k.shape[2]
    keys_mask = None
    if mask is not None:
        if mask.dtype != torch.bool or mask.dim() not in (2, 4) or (mask.dim() == 4 and mask.shape[1] != 1):
            return None
        keys_mask = (mask if mask.dim() == 4 else mask[None, None]).expand(B, 1, N, L)[:, 0]  # (B, N, L)
    if q.stride(-1) != 1:
        q = q.contiguous()
    return _ops().attend(q, k, v, keys_mask, is_causal)


def is_pinned(net: nn.Module) -> bool:
    """Whether :func:`pin` installed the pinned steps in ``net``."""
    return bool(getattr(net, "_pinned_float_steps", False))


def pin(net: nn.Module) -> nn.Module:
    """Install the pinned float steps in ``net`` (a decoding copy, modified in place) and return it: every RMSNorm,
    the RoPE tables, every self-attention's kernel and the SiLU / GELU-tanh activations. Layers of other kinds stay
    as they are. A no-op where the C++ library does not run (:func:`tokennet.layers.int8dot.available`)."""
    if not int8dot.available():
        return net
    for m in list(net.modules()):
        for name, child in list(m.named_children()):
            if type(child) in (nn.RMSNorm, OffsetRMSNorm):
                setattr(m, name, PinnedRMSNorm(child))
            elif type(child) is RotaryEmbedding:
                setattr(m, name, PinnedRotary(child))
            elif type(child) is nn.SiLU:
                setattr(m, name, PinnedActivation("silu"))
            elif type(child) is nn.GELU and child.approximate == "tanh":
                setattr(m, name, PinnedActivation("gelu_tanh"))
    if any(isinstance(m, MultiHeadAttention) for m in net.modules()):
        use_kernel(net, pinned_attention)
    net._pinned_float_steps = True
    return net
