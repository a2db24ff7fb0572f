"""Stochastic depth (Huang et al. 2016, https://arxiv.org/abs/1603.09382): drop whole residual branches.

In training, each *sample*'s branch output is kept with probability ``1 − p`` and scaled by ``1/(1 − p)``::

    x ← x + b·f(x) / (1 − p),   b ~ Bernoulli(1 − p) per sample

so a deep stack trains as an ensemble of shallower ones; at test time every branch is kept (``x + f(x)``).
DeiT (Touvron et al. 2021) and Swin train with it; the rate usually grows linearly with depth.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["DropPath", "drop_path_rates"]


class DropPath(nn.Module):
    """Zero a residual branch for a random ``p`` of the samples (axis 0) and rescale the rest by ``1/(1 − p)``.

    Args:
        p: the drop probability, in ``[0, 1)``.
    """

    def __init__(self, p: float = 0.0):
        super().__init__()
        if not 0 <= p < 1:
            raise ValueError(f"drop path probability must be in [0, 1), got {p}")
        self.p = float(p)

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0:
            return x
        keep = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(1 - self.p)  # (B, 1, ..., 1)
        return x * keep / (1 - self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def drop_path_rates(rate: float, depth: int) -> list[float]:
    """The usual schedule: ``rate · ℓ / (depth − 1)`` for blocks ℓ = 0 … depth − 1 (0 for the first block)."""
    if depth <= 1:
        return [0.0] * depth
    # numbers, even while building on meta
    return [float(rate_i) for rate_i in torch.linspace(0, rate, depth, device="cpu")]
