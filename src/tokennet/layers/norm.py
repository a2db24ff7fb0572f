"""Normalization layers of a block, as a kind: ``Norm("rmsnorm", eps=1e-6)(dim)`` builds one.

LayerNorm (Ba et al. 2016, https://arxiv.org/abs/1607.06450): ``LN(x) = (x − μ) / √(σ² + ε) ⊙ γ + β``, over
the features of each token. RMSNorm (Zhang & Sennrich 2019, https://arxiv.org/abs/1910.07467; Llama's
choice): ``RMS(x) = x / √(mean(x²) + ε) ⊙ γ``, no centring and no bias. Gemma's RMSNorm (``"rmsnorm1p"``)
stores the gain as an offset from one, ``x / √(mean(x²) + ε) ⊙ (1 + w)`` with ``w`` initialised to 0, computed in
float32: weight decay then pulls the gain towards 1, not 0.

A block and a stack take a :class:`Norm` (one value naming the kind, its ε and bias) rather than a flag per
variant, and build every normalization they need from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

__all__ = ["Norm", "NORM_LAYERS", "make_norm", "OffsetRMSNorm"]

NORM_LAYERS = ("layernorm", "rmsnorm", "rmsnorm1p")


class OffsetRMSNorm(nn.Module):
    """Gemma's RMSNorm, ``y = x / √(mean(x²) + ε) ⊙ (1 + w)`` over the last dim, in float32, cast back to x's dtype.

    Args:
        dim: the normalized width.
        eps: ε.
    """

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        hidden = x.float()
        hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.eps)  # (..., D)
        return (hidden * (1.0 + self.weight.float())).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


@dataclass(frozen=True)
class Norm:
    """A normalization kind; calling it with a width builds the layer.

    Args:
        kind: ``"layernorm"``, ``"rmsnorm"`` or ``"rmsnorm1p"`` (Gemma's ``1 + w`` gain).
        eps: ε.
        bias: LayerNorm's β (RMSNorm has none).
    """

    kind: str = "layernorm"
    eps: float = 1e-5
    bias: bool = True

    def __post_init__(self):
        if self.kind not in NORM_LAYERS:
            raise ValueError(f"norm_layer must be one of {NORM_LAYERS}, got {self.kind!r}")

    def __call__(self, dim: int) -> nn.Module:
        if self.kind == "layernorm":
            return nn.LayerNorm(dim, eps=self.eps, bias=self.bias)
        if self.kind == "rmsnorm1p":
            return OffsetRMSNorm(dim, eps=self.eps)
        return nn.RMSNorm(dim, eps=self.eps)


def make_norm(kind: str, dim: int, *, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """``Norm(kind, eps, bias)(dim)``: LayerNorm ``(x − μ)/√(σ² + ε) ⊙ γ + β`` or RMSNorm ``x/√(mean(x²) + ε) ⊙ γ``."""
    return Norm(kind, eps, bias)(dim)
