"""Batch augmentation for small-data ViTs: translation, affine warps, flips, RandAugment, random erasing, mixup,
cutmix.

Every function works on a whole batch with torch ops and draws from an explicit ``torch.Generator``,
so the same generator state gives the same batch; :class:`~tokennet.data.image_batches.ImageBatches`
seeds it by the batch index (exact resume).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..errors import ConfigError
from .randaugment import rand_augment

__all__ = ["Augment", "random_translate", "random_affine", "random_flip", "random_erase", "mixup", "cutmix"]


def _uniform(n: int, generator: torch.Generator) -> Tensor:
    return torch.rand(n, generator=generator)


def random_translate(x: Tensor, max_shift: int, generator: torch.Generator) -> Tensor:
    """Shift each item by a random integer offset in ``[-max_shift, max_shift]`` per spatial axis, with zero
    fill (a random crop of the zero-padded batch, as in CIFAR training). ``(B, C, H, W)`` or ``(B, C, L)``."""
    if max_shift <= 0:
        return x
    B, shift = x.shape[0], max_shift
    if x.dim() == 3:
        L = x.shape[-1]
        padded = torch.nn.functional.pad(x, (shift, shift))  # (B, C, L + 2s)
        off = torch.randint(0, 2 * shift + 1, (B,), generator=generator)
        idx = (off[:, None] + torch.arange(L))[:, None, :].expand(-1, x.shape[1], -1)  # (B, C, L)
        return padded.gather(2, idx)
    H, W = x.shape[-2:]
    padded = torch.nn.functional.pad(x, (shift, shift, shift, shift))  # (B, C, H + 2s, W + 2s)
    dy = torch.randint(0, 2 * shift + 1, (B,), generator=generator)
    dx = torch.randint(0, 2 * shift + 1, (B,), generator=generator)
    rows = (dy[:, None] + torch.arange(H))[:, :, None]  # (B, H, 1)
    cols = (dx[:, None] + torch.arange(W))[:, None, :]  # (B, 1, W)
    batch_idx = torch.arange(B)[:, None, None]  # (B, 1, 1)
    return padded.permute(0, 2, 3, 1)[batch_idx, rows, cols].permute(0, 3, 1, 2)  # (B, H, W, C) → (B, C, H, W)


def random_affine(x: Tensor, generator: torch.Generator, *, degrees: float = 10.0, scale: float = 0.1,
                  translate: float = 0.0, shear: float = 0.0) -> Tensor:
    """A random small affine warp per image (rotation, scale, shear, sub-pixel shift), bilinear, zero fill:
    one ``affine_grid`` + ``grid_sample`` for the whole batch ``(B, C, H, W)``.

    Args:
        degrees: rotation drawn from ``[-degrees, degrees]``.
        scale: zoom factor drawn from ``[1 - scale, 1 + scale]``.
        translate: shift drawn from ``[-translate, translate]`` pixels per axis.
        shear: horizontal shear factor drawn from ``[-shear, shear]``.
    """
    B, _, H, W = x.shape

    def u(a: float) -> Tensor:
        return (2 * _uniform(B, generator) - 1) * a

    angle = u(float(np.deg2rad(degrees)))
    zoom = 1 + u(scale)
    shear_amount = u(shear)
    shift_x, shift_y = u(translate) * 2 / W, u(translate) * 2 / H  # in the [-1, 1] coordinates of affine_grid
    cos, sin = torch.cos(angle) / zoom, torch.sin(angle) / zoom
    # theta maps output coordinates to input coordinates: rotation/zoom, then shear, then shift.
    theta = torch.stack([torch.stack([cos, -sin + shear_amount * cos, shift_x], -1),
                         torch.stack([sin, cos + shear_amount * sin, shift_y], -1)], 1)  # (B, 2, 3)
    grid = torch.nn.functional.affine_grid(theta.to(x.dtype), list(x.shape), align_corners=False)
    return torch.nn.functional.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def random_flip(x: Tensor, generator: torch.Generator, p: float = 0.5) -> Tensor:
    """Mirror each item left–right with probability ``p`` (the last axis)."""
    flip = _uniform(x.shape[0], generator) < p
    return torch.where(flip.view(-1, *([1] * (x.dim() - 1))), x.flip(-1), x)


def random_erase(x: Tensor, generator: torch.Generator, p: float = 0.25, scale=(0.02, 0.25)) -> Tensor:
    """Random erasing (Zhong et al. 2020, https://arxiv.org/abs/1708.04896): with probability ``p`` set a
    random rectangle of ``scale`` of the area (aspect ratio 1/3..3) to zero. ``(B, C, H, W)``."""
    B, H, W = x.shape[0], x.shape[-2], x.shape[-1]
    area = (scale[0] + (scale[1] - scale[0]) * _uniform(B, generator)) * H * W
    aspect = torch.exp((2 * _uniform(B, generator) - 1) * np.log(3.0))
    box_h = (area * aspect).sqrt().round().clamp(1, H)
    box_w = (area / aspect).sqrt().round().clamp(1, W)
    top = (_uniform(B, generator) * (H - box_h + 1)).floor()
    left = (_uniform(B, generator) * (W - box_w + 1)).floor()
    erase = _uniform(B, generator) < p
    rows = torch.arange(H)[None, :, None]  # (1, H, 1)
    cols = torch.arange(W)[None, None, :]  # (1, 1, W)
    box = (rows >= top[:, None, None]) & (rows < (top + box_h)[:, None, None]) & \
          (cols >= left[:, None, None]) & (cols < (left + box_w)[:, None, None])  # (B, H, W)
    box = box & erase[:, None, None]
    return x.masked_fill(box[:, None], 0.0)


def mixup(x: Tensor, y: Tensor, num_classes: int, alpha: float, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Mixup (Zhang et al. 2018, https://arxiv.org/abs/1710.09412): ``x̃ = λ x_i + (1 − λ) x_j`` and the same
    mix of one-hot labels, ``λ ~ Beta(α, α)`` per batch, ``j`` a random pairing. Returns class
    probabilities ``(B, K)`` as targets (the models' cross-entropy takes them as well as class ids)."""
    lam = _beta(alpha, generator)
    perm = torch.randperm(len(x), generator=generator)
    onehot = torch.nn.functional.one_hot(y, num_classes).to(x.dtype)  # (B, K)
    return lam * x + (1 - lam) * x[perm], lam * onehot + (1 - lam) * onehot[perm]


def cutmix(x: Tensor, y: Tensor, num_classes: int, alpha: float, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """CutMix (Yun et al. 2019, https://arxiv.org/abs/1905.04899): paste a box of the paired image ``x_j`` into
    ``x_i`` and mix the one-hot labels by the area each keeps. ``λ ~ Beta(α, α)`` per batch sets the box's
    share ``1 − λ`` of the area (a box clipped at the border keeps the label weights exact: they are the
    areas actually pasted). ``(B, C, H, W)``, or ``(B, C, L)`` (a segment). Returns class probabilities."""
    lam = _beta(alpha, generator)
    perm = torch.randperm(len(x), generator=generator)
    sizes = x.shape[2:]
    cut = [int(round(n * (1 - lam) ** (1 / len(sizes)))) for n in sizes]  # the box's side per axis
    centre = [int(torch.randint(n, (1,), generator=generator)) for n in sizes]
    starts = [max(0, mid - k // 2) for mid, k in zip(centre, cut, strict=True)]
    ends = [min(n, mid + k - k // 2) for mid, k, n in zip(centre, cut, sizes, strict=True)]
    box = (slice(None), slice(None), *(slice(start, end) for start, end in zip(starts, ends, strict=True)))
    out = x.clone()
    out[box] = x[perm][box]
    kept = 1 - float(np.prod([end - start for start, end in zip(starts, ends, strict=True)])) / float(np.prod(sizes))
    onehot = torch.nn.functional.one_hot(y, num_classes).to(x.dtype)  # (B, K)
    return out, kept * onehot + (1 - kept) * onehot[perm]


def _beta(alpha: float, generator: torch.Generator) -> float:
    """One draw of Beta(α, α), reproducible from ``generator`` (torch's Beta sampler takes no generator,
    so numpy's is seeded from it)."""
    rng = np.random.default_rng(int(torch.randint(2**62, (1,), generator=generator)))
    return float(rng.beta(alpha, alpha))


@dataclass
class Augment:
    """Batch augmentation for small-data ViTs: an affine warp, random translation, horizontal flip, RandAugment,
    random erasing, in that order (DeiT's: crop and flip, RandAugment, erasing).

    Args:
        translate: largest shift in pixels (0 = none).
        flip: mirror half of the images left–right (right for clothes, wrong for digits).
        erase: probability of erasing a random rectangle (0 = never; 2-D images only).
        rotate: largest random rotation in degrees (2-D images; with ``scale``, one affine warp).
        scale: largest relative zoom, e.g. 0.1 for 0.9..1.1 (2-D images).
        randaugment: RandAugment's operations per image, n (0 = off; 2-D images only; see
            :mod:`~tokennet.data.randaugment`).
        magnitude: RandAugment's magnitude m on the 0–10 scale.
    """

    translate: int = 0
    flip: bool = False
    erase: float = 0.0
    rotate: float = 0.0
    scale: float = 0.0
    randaugment: int = 0
    magnitude: float = 9.0

    def __post_init__(self):
        if self.translate < 0:
            raise ConfigError(f"translate must be >= 0 pixels, got {self.translate}")
        if self.rotate < 0 or not 0 <= self.scale < 1:
            raise ConfigError(f"rotate must be >= 0 degrees and scale in [0, 1), got {self.rotate}, {self.scale}")
        if not 0 <= self.erase <= 1:
            raise ConfigError(f"erase must be a probability in [0, 1], got {self.erase}")
        if self.randaugment < 0 or not 0 <= self.magnitude <= 10:
            raise ConfigError(f"randaugment must be >= 0 operations and magnitude in [0, 10], got "
                              f"{self.randaugment}, {self.magnitude}")

    @property
    def active(self) -> bool:
        return (self.translate > 0 or self.flip or self.erase > 0 or self.rotate > 0 or self.scale > 0
                or self.randaugment > 0)

    def __call__(self, x: Tensor, generator: torch.Generator) -> Tensor:
        """Augment a batch ``(B, C, H, W)`` (or ``(B, C, L)``); the same generator state gives the same result."""
        if (self.rotate > 0 or self.scale > 0) and x.dim() == 4:
            x = random_affine(x, generator, degrees=self.rotate, scale=self.scale)
        x = random_translate(x, self.translate, generator)
        if self.flip:
            x = random_flip(x, generator)
        if self.randaugment > 0 and x.dim() == 4:
            x = rand_augment(x, generator, n=self.randaugment, magnitude=self.magnitude)
        if self.erase > 0 and x.dim() == 4:
            x = random_erase(x, generator, p=self.erase)
        return x
