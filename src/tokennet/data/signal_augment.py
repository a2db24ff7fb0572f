"""Augmentation for 1-D signals ``(B, C, L)``, after the MNIST-1D generator's transformations.

MNIST-1D (Greydanus 2020, "Scaling down deep learning", https://arxiv.org/abs/2011.14439) makes each signal
from one of ten 12-sample templates: it pads and resamples it (a stretch), scales its amplitude, shifts it
circularly, adds correlated and iid Gaussian noise, adds a random linear trend (shear) and resamples it to 40
samples. :class:`SignalAugment` draws the same kinds of change again for each training batch, so a model sees
more of the generator's variation than 4,000 signals hold.

Every function works on a whole batch with torch ops and draws from an explicit ``torch.Generator`` (the same
generator state gives the same batch); :class:`~tokennet.data.image_batches.ImageBatches` seeds it by the batch
index, and only training batches pass through it: the test set is never augmented.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import ConfigError

__all__ = ["SignalAugment", "random_roll", "random_stretch", "random_gain", "gaussian_noise", "correlated_noise",
           "random_shear"]


def _symmetric(n: int, amount: float, generator: torch.Generator) -> Tensor:
    """``n`` draws from the uniform distribution on ``[-amount, amount]``."""
    return (2 * torch.rand(n, generator=generator) - 1) * amount


def random_roll(x: Tensor, max_shift: int, generator: torch.Generator) -> Tensor:
    """Shift each signal circularly by a random integer in ``[-max_shift, max_shift]`` samples: what falls off
    one end comes back at the other (the generator's ``translate``)."""
    if max_shift <= 0:
        return x
    B, C, L = x.shape
    shift = torch.randint(-max_shift, max_shift + 1, (B,), generator=generator)
    idx = (torch.arange(L)[None, :] - shift[:, None]) % L  # (B, L) the sample each output position reads
    return x.gather(2, idx[:, None, :].expand(B, C, L))


def random_stretch(x: Tensor, scale: float, generator: torch.Generator) -> Tensor:
    """Resample each signal about its centre by a random factor ``f`` in ``[1 − scale, 1 + scale]``:
    ``x̃(t) = x(c + (t − c) / f)``, linear interpolation, zero outside the signal (f > 1 stretches it)."""
    if scale <= 0:
        return x
    B, C, L = x.shape
    factor = 1 + _symmetric(B, scale, generator)
    centre = (L - 1) / 2
    pos = centre + (torch.arange(L, dtype=x.dtype)[None, :] - centre) / factor[:, None].to(x.dtype)  # (B, L)
    left = pos.floor()
    frac = (pos - left)[:, None, :]  # (B, 1, L)

    def read(at: Tensor) -> Tensor:  # x at integer positions (B, L), zero outside 0..L-1
        inside = ((at >= 0) & (at <= L - 1))[:, None, :]  # (B, 1, L)
        idx = at.clamp(0, L - 1).long()[:, None, :].expand(B, C, L)
        return x.gather(2, idx) * inside

    return read(left) * (1 - frac) + read(left + 1) * frac


def random_gain(x: Tensor, gain: float, generator: torch.Generator) -> Tensor:
    """Multiply each signal by a random factor in ``[1 − gain, 1 + gain]`` (the generator's amplitude scale)."""
    if gain <= 0:
        return x
    return x * (1 + _symmetric(x.shape[0], gain, generator)).to(x.dtype)[:, None, None]


def gaussian_noise(x: Tensor, std: float, generator: torch.Generator) -> Tensor:
    """Add iid Gaussian noise of standard deviation ``std`` to every sample."""
    if std <= 0:
        return x
    return x + std * torch.randn(x.shape, generator=generator, dtype=x.dtype)


def correlated_noise(x: Tensor, std: float, generator: torch.Generator, width: float = 2.0) -> Tensor:
    """Add Gaussian noise smoothed along the signal by a Gaussian of ``width`` samples (the generator's
    ``corr_noise``, ``gaussian_filter(noise, 2)``), rescaled so that each sample's noise has standard deviation
    ``std``."""
    if std <= 0:
        return x
    B, C, L = x.shape
    half = int(math.ceil(3 * width))
    taps = torch.exp(-0.5 * (torch.arange(-half, half + 1, dtype=x.dtype) / width) ** 2)
    taps = taps / taps.norm()  # unit L2 norm: smoothing unit-variance white noise keeps unit variance
    white = torch.randn(B * C, 1, L + 2 * half, generator=generator, dtype=x.dtype)
    smooth = torch.nn.functional.conv1d(white, taps.view(1, 1, -1)).view(B, C, L)  # valid: no edge effect
    return x + std * smooth


def random_shear(x: Tensor, shear: float, generator: torch.Generator) -> Tensor:
    """Add a random linear trend to each signal: ``x̃(t) = x(t) + a (t / (L − 1) − ½)`` with ``a`` drawn from
    ``[-shear, shear]`` (the generator's ``shear``)."""
    if shear <= 0:
        return x
    B, _, L = x.shape
    ramp = torch.linspace(-0.5, 0.5, L, dtype=x.dtype)  # (L,)
    return x + _symmetric(B, shear, generator).to(x.dtype)[:, None, None] * ramp


@dataclass
class SignalAugment:
    """The MNIST-1D generator's changes, drawn anew per training batch of signals ``(B, C, L)``, in its order:
    stretch (resample), amplitude, circular shift, correlated noise, iid noise, shear.

    Args:
        roll: largest circular shift in samples (0 = none).
        scale: largest relative stretch, e.g. 0.1 for factors 0.9..1.1 (0 = none).
        gain: largest relative change of amplitude, e.g. 0.2 for 0.8..1.2 (0 = none).
        noise: standard deviation of added iid Gaussian noise (0 = none).
        corr_noise: standard deviation of added correlated (smoothed) Gaussian noise (0 = none).
        shear: largest slope of an added linear trend, its rise over the whole signal (0 = none).
    """

    roll: int = 0
    scale: float = 0.0
    gain: float = 0.0
    noise: float = 0.0
    corr_noise: float = 0.0
    shear: float = 0.0

    def __post_init__(self):
        for name in ("roll", "gain", "noise", "corr_noise", "shear"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0 (0 = off), got {getattr(self, name)}")
        if not 0 <= self.scale < 1:
            raise ConfigError(f"scale must be in [0, 1) (e.g. 0.1 for 0.9..1.1), got {self.scale}")
        if self.gain >= 1:
            raise ConfigError(f"gain must be below 1 (e.g. 0.2 for 0.8..1.2; 1 would allow silence), got {self.gain}")

    @property
    def active(self) -> bool:
        return any(getattr(self, name) > 0 for name in ("roll", "scale", "gain", "noise", "corr_noise", "shear"))

    def check_length(self, length: int) -> None:
        """Refuse a circular shift of the whole signal or more (a shift of ``length`` is no shift)."""
        if self.roll >= length:
            raise ConfigError(f"roll={self.roll} shifts by the whole signal or more: the signals have {length} "
                              f"samples, so roll must be below {length}")

    def __call__(self, x: Tensor, generator: torch.Generator) -> Tensor:
        """Augment a batch ``(B, C, L)``; the same generator state gives the same result."""
        if x.dim() != 3:
            raise ConfigError(f"SignalAugment takes 1-D signals (B, C, L), got a batch of shape {tuple(x.shape)}")
        x = random_stretch(x, self.scale, generator)
        x = random_gain(x, self.gain, generator)
        x = random_roll(x, self.roll, generator)
        x = correlated_noise(x, self.corr_noise, generator)
        x = gaussian_noise(x, self.noise, generator)
        return random_shear(x, self.shear, generator)
