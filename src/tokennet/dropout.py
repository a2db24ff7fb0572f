"""Dropout (Srivastava et al. 2014): during training each unit is kept with probability ``1 - p`` and scaled by
``1 / (1 - p)``, so that its expectation is unchanged, ``E[drop(x)] = x``; at evaluation it is the identity.

On a CPU, drawing the mask is most of dropout's cost: PyTorch draws one 32-bit random number per unit, and a
training step of a small transformer with ``dropout=0.1`` took about twice the step without it (``bench/dropout.py``).
Here a CPU mask is cut from 64-bit random words, four 16-bit draws each, so ``p`` is kept to a multiple of
``1/65536`` (``p = 0.1`` is ``6554/65536 = 0.100006``) and the scale is that probability's, which keeps the
expectation exact. The mask is saved for the backward pass (one byte per unit), whose gradient is the same mask
times the same scale. Other devices, and a graph being compiled (``torch.compile``: Inductor draws and fuses the
mask itself), use :func:`torch.nn.functional.dropout`. The masks come from torch's generator, so
``torch.manual_seed`` makes them repeat (and a checkpoint that saves the generator's state resumes them), but they
differ from ``torch.nn.functional.dropout``'s for the same seed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["Dropout", "dropout", "kept_probability", "LEVELS"]

LEVELS = 65536  # a CPU mask's unit: p is kept to a multiple of 1 / LEVELS


def kept_probability(p: float) -> float:
    """The probability a CPU mask keeps a unit: ``1 - round(p · 65536) / 65536``."""
    return 1.0 - round(p * LEVELS) / LEVELS


def _check(p: float) -> None:
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")


def _keep_mask(shape: torch.Size, p: float) -> Tensor:
    """A boolean mask of ``shape``, each entry True with probability :func:`kept_probability` ``(p)``: 16-bit
    uniform draws (four cut from each 64-bit random word), kept where at or above ``round(p · 65536)``."""
    numel = shape.numel()
    words = torch.randint(-(2**63), 2**63 - 1, ((numel + 3) // 4,), dtype=torch.int64)
    draws = words.view(torch.int16)[:numel]  # uniform on [-32768, 32767]
    return (draws >= round(p * LEVELS) - LEVELS // 2).view(shape)


class _MaskedScale(torch.autograd.Function):
    """``x ⊙ m / (1 - p)`` for a fixed mask ``m``; its gradient is the same mask and scale."""

    @staticmethod
    def forward(ctx, x: Tensor, keep: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return torch.where(keep, x * scale, 0.0)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (keep,) = ctx.saved_tensors
        return torch.where(keep, grad * ctx.scale, 0.0), None, None


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Dropout of ``x`` with probability ``p`` (the identity when not ``training`` or ``p == 0``)."""
    _check(p)
    if not training or p == 0.0:
        return x
    kept = kept_probability(p)
    if x.device.type != "cpu" or not x.is_floating_point() or kept <= 0.0 or torch.compiler.is_compiling():
        return F.dropout(x, p, training=True)  # fused where it is compiled or runs on an accelerator
    return _MaskedScale.apply(x, _keep_mask(x.shape, p), 1.0 / kept)


class Dropout(nn.Module):
    """:func:`dropout` as a module, in place of :class:`torch.nn.Dropout` (the same ``p``, the same state dict:
    none); the identity in eval mode."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        _check(p)
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
