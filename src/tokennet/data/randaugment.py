"""RandAugment on a batch (Cubuk et al. 2020, https://arxiv.org/abs/1909.13719), as DeiT trains with it.

Each image gets ``n`` operations drawn uniformly from a fixed list, each applied at one global magnitude
``m`` on a 0–10 scale (DeiT: ``rand-m9-mstd0.5``: m = 9 with Gaussian noise of std 0.5 per operation,
Touvron et al. 2021, https://arxiv.org/abs/2012.12877). Two numbers replace a searched policy.

The operations are PIL's, written as torch ops on ``(B, C, H, W)`` images in [0, 1], so a batch is
augmented at once, and every draw comes from an explicit ``torch.Generator`` (the same generator state
gives the same batch: exact resume). At magnitude 10:

=================  ==================================================================================
identity           the image
auto_contrast      each channel's min..max stretched to 0..1
equalize           each channel's histogram equalized (256 levels)
rotate             ± 30°
solarize           pixels above ``1 − m/10`` inverted
posterize          ``8 − round(4·m/10)`` bits kept
contrast           blend with the mean grey, factor ``1 ± 0.9·m/10``
brightness         blend with black, factor ``1 ± 0.9·m/10``
sharpness          blend with PIL's smoothed image, factor ``1 ± 0.9·m/10``
color              blend with the grey image, factor ``1 ± 0.9·m/10`` (grey images: unchanged)
shear_x, shear_y   ± 0.3
translate_x, _y    ± 45% of the side
=================  ==================================================================================

Signed operations draw their sign at random per image; geometric ones fill with 0 (black).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["OPS", "rand_augment"]


def _affine(x: Tensor, theta: Tensor) -> Tensor:
    """Warp each image by its ``theta`` ``(B, 2, 3)`` (output → input coordinates in [-1, 1]), zero fill."""
    grid = F.affine_grid(theta.to(x.dtype), list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def _eye(b: int) -> Tensor:
    return torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]).repeat(b, 1, 1)  # (B, 2, 3)


def _rotate(x, v):  # v: signed magnitude in [-1, 1] per image
    angle = v * math.radians(30.0)
    t = _eye(len(x))
    t[:, 0, 0], t[:, 0, 1], t[:, 1, 0], t[:, 1, 1] = angle.cos(), -angle.sin(), angle.sin(), angle.cos()
    return _affine(x, t)


def _shear(axis):
    def op(x, v):
        t = _eye(len(x))
        t[:, axis, 1 - axis] = v * 0.3
        return _affine(x, t)
    return op


def _translate(axis):
    def op(x, v):
        t = _eye(len(x))
        t[:, axis, 2] = v * 0.45 * 2  # a fraction of the side, in [-1, 1] coordinates (the side spans 2)
        return _affine(x, t)
    return op


def _blend(x, other, v):  # PIL's ImageEnhance: other + f·(x − other), f = 1 + 0.9·v
    factor = (1 + 0.9 * v).view(-1, 1, 1, 1)
    return (other + factor * (x - other)).clamp(0, 1)


def _grey(x):
    if x.shape[1] != 3:
        return x
    weights = torch.tensor([0.299, 0.587, 0.114], dtype=x.dtype).view(1, 3, 1, 1)
    return (x * weights).sum(1, keepdim=True).expand_as(x)


def _auto_contrast(x, v):  # noqa: ARG001
    low, high = x.amin((2, 3), keepdim=True), x.amax((2, 3), keepdim=True)
    return torch.where(high > low, (x - low) / (high - low).clamp_min(1e-8), x)


def _equalize(x, v):  # noqa: ARG001
    B, C, H, W = x.shape
    q = (x * 255).round().long().clamp(0, 255).flatten(2)  # (B, C, H·W) levels
    hist = torch.zeros(B, C, 256, dtype=x.dtype).scatter_add_(2, q, torch.ones_like(q, dtype=x.dtype))
    cdf = hist.cumsum(2)
    first = torch.where(hist > 0, cdf, torch.full_like(cdf, float("inf"))).amin(2, keepdim=True)  # cdf at min level
    lut = ((cdf - first) / (H * W - first).clamp_min(1)).clamp(0, 1)  # (B, C, 256)
    return lut.gather(2, q).view(B, C, H, W)


def _solarize(x, v):
    thresh = (1 - v.abs()).view(-1, 1, 1, 1)
    return torch.where(x >= thresh, 1 - x, x)


def _posterize(x, v):
    bits = (8 - (4 * v.abs()).round()).clamp(1, 8).view(-1, 1, 1, 1)
    levels = 2**bits
    return torch.floor(x * 255 / (256 / levels)) * (256 / levels) / 255


def _contrast(x, v):
    return _blend(x, _grey(x).mean((1, 2, 3), keepdim=True).expand_as(x), v)


def _brightness(x, v):
    return _blend(x, torch.zeros_like(x), v)


def _sharpness(x, v):
    C = x.shape[1]
    k = torch.tensor([[1.0, 1.0, 1.0], [1.0, 5.0, 1.0], [1.0, 1.0, 1.0]], dtype=x.dtype) / 13
    smooth = F.conv2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), k.expand(C, 1, 3, 3), groups=C)
    return _blend(x, smooth, v)


def _color(x, v):
    return _blend(x, _grey(x), v)


OPS = {
    "identity": lambda x, v: x,
    "auto_contrast": _auto_contrast,
    "equalize": _equalize,
    "rotate": _rotate,
    "solarize": _solarize,
    "posterize": _posterize,
    "contrast": _contrast,
    "brightness": _brightness,
    "sharpness": _sharpness,
    "color": _color,
    "shear_x": _shear(0),
    "shear_y": _shear(1),
    "translate_x": _translate(0),
    "translate_y": _translate(1),
}
"""The operations: ``op(images (b, C, H, W), v (b,)) → images``, ``v`` the signed magnitude in [-1, 1]."""


def rand_augment(x: Tensor, generator: torch.Generator, *, n: int = 2, magnitude: float = 9.0, std: float = 0.5,
                 ops: tuple[str, ...] | None = None) -> Tensor:
    """Apply ``n`` random operations of :data:`OPS` to each image of ``x`` ``(B, C, H, W)`` in [0, 1].

    Args:
        generator: the source of every draw.
        n: operations per image (each drawn uniformly, with repetition).
        magnitude: m on the 0–10 scale.
        std: noise of the magnitude per image and operation (DeiT's ``mstd``), clipped to 0–10.
        ops: the names of the operations to draw from (default: all of :data:`OPS`).
    """
    names = tuple(OPS) if ops is None else ops
    B = x.shape[0]
    for _ in range(n):
        pick = torch.randint(len(names), (B,), generator=generator)
        m = (magnitude + std * torch.randn(B, generator=generator)).clamp(0, 10) / 10
        sign = torch.where(torch.rand(B, generator=generator) < 0.5, -1.0, 1.0)
        v = m * sign
        out = x.clone()
        for k, name in enumerate(names):
            sel = (pick == k).nonzero().flatten()
            if len(sel):
                out[sel] = OPS[name](x[sel], v[sel]).to(x.dtype)
        x = out
    return x
