"""Normalization layers of a block, as a kind: ``Norm("rmsnorm", eps=1e-6)(dim)`` builds one.

LayerNorm (Ba et al. 2016, https://arxiv.org/abs/1607.06450): ``LN(x) = (x − μ) / √(σ² + ε) ⊙ γ + β``, over
the features of each token. RMSNorm (Zhang & Sennrich 2019, https://arxiv.org/abs/1910.07467; Llama's
choice): ``RMS(x) = x / √(mean(x²) + ε) ⊙ γ``, no centring and no bias.

A block and a stack take a :class:`Norm` (one value naming the kind, its ε and bias) rather than a flag per
variant, and build every normalization they need from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

__all__ = ["Norm", "NORM_LAYERS", "make_norm"]

NORM_LAYERS = ("layernorm", "rmsnorm")


@dataclass(frozen=True)
class Norm:
    """A normalization kind; calling it with a width builds the layer.

    Args:
        kind: ``"layernorm"`` or ``"rmsnorm"``.
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
        return nn.RMSNorm(dim, eps=self.eps)


def make_norm(kind: str, dim: int, *, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """``Norm(kind, eps, bias)(dim)``: LayerNorm ``(x − μ)/√(σ² + ε) ⊙ γ + β`` or RMSNorm ``x/√(mean(x²) + ε) ⊙ γ``."""
    return Norm(kind, eps, bias)(dim)
