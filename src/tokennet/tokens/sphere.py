"""Signals on the sphere → patch tokens ``(B, N, F)`` around a near-uniform grid of centres.

A signal is sampled at M points of a Fibonacci grid (the "pixels"); N coarser Fibonacci points are the
patch centres; patch i is the K samples nearest centre i (a fixed neighbourhood, found once), split by
distance into R rings of K/R samples. Two descriptors of a patch:

- ``"ordered"``: ring by ring, the samples ordered by their azimuth in the centre's local east/north
  tangent frame — a picture of the patch in a fixed frame. Rotating the signal turns the patch in that
  frame, so this descriptor changes (use it with absolute positions).
- ``"rings"``: ring by ring, the sample *values* sorted — invariant to any permutation inside a ring,
  hence (up to resampling) to rotations of the patch about its centre: the descriptor an invariant model
  needs, since a rotation of the sphere moves a patch *and* spins it.

Fibonacci grid (González 2010, https://arxiv.org/abs/0912.4540), centred so that point i and point
n−1−i are mirror images: ``z_i = 1 − (2i+1)/n``, ``φ_i = (i − (n−1)/2)·π(3 − √5)``. The grid is then
mapped onto itself by the rotation by π about the x-axis, ``(x, y, z) → (x, −y, −z)`` — one exact
grid-aligned rotation, used by the tests; a general rotation only maps it approximately.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..errors import DataError

__all__ = ["fibonacci_sphere", "to_angles", "neighbourhoods", "SpherePatches", "DESCRIPTORS", "FLIP_X"]

DESCRIPTORS = ("ordered", "rings")
GOLDEN_ANGLE = math.pi * (3.0 - math.sqrt(5.0))
# The rotation by π about the x-axis: maps the centred Fibonacci grid onto itself (point i → n−1−i).
FLIP_X = torch.tensor([[1.0, 0.0, 0.0], [0.0, -1.0, 0.0], [0.0, 0.0, -1.0]], dtype=torch.float64)


def fibonacci_sphere(n: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """``n`` near-uniform unit vectors ``(n, 3)``: the centred Fibonacci grid (module docstring)."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"a Fibonacci grid needs n >= 1 points, got {n!r}")
    i = torch.arange(n, dtype=torch.float64)
    z = 1.0 - (2.0 * i + 1.0) / n
    r = torch.sqrt((1.0 - z * z).clamp_min(0.0))
    phi = (i - (n - 1) / 2.0) * GOLDEN_ANGLE
    return torch.stack([r * torch.cos(phi), r * torch.sin(phi), z], dim=-1).to(dtype)  # (n, 3)


def to_angles(xyz: Tensor) -> tuple[Tensor, Tensor]:
    """Colatitude θ ∈ [0, π] and azimuth φ ∈ (−π, π] of unit vectors ``(..., 3)``."""
    theta = torch.acos(xyz[..., 2].clamp(-1.0, 1.0))
    phi = torch.atan2(xyz[..., 1], xyz[..., 0])
    return theta, phi


def neighbourhoods(centres: Tensor, samples: Tensor, k: int) -> Tensor:
    """Indices ``(N, k)`` of the ``k`` samples nearest each centre, nearest first (ties: lower index).

    Distances are rounded to 1e-9 before a stable sort, so mirror-image points of the grid, whose
    distances agree only to rounding, order the same way.
    """
    if k > samples.shape[0]:
        raise ValueError(f"patch_size={k} exceeds the {samples.shape[0]} samples of the grid")
    cos = (centres.double() @ samples.double().T).clamp(-1.0, 1.0)  # (N, M)
    angle = torch.round(torch.acos(cos) * 1e9)
    return torch.sort(angle, dim=-1, stable=True).indices[:, :k]


def _local_azimuth(centres: Tensor, points: Tensor) -> Tensor:
    """Azimuth ``(N, K)`` of points ``(N, K, 3)`` in each centre's east/north tangent frame."""
    c = centres.double()
    up = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64).expand_as(c)
    east = torch.linalg.cross(up, c)
    east = east / east.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    north = torch.linalg.cross(c, east)
    d = points.double() - c[:, None]
    return torch.atan2((d * north[:, None]).sum(-1), (d * east[:, None]).sum(-1))


class SpherePatches(nn.Module):
    """Patch descriptors of signals on the Fibonacci sample grid: ``(B, C, M) → (B, N, C·K)``.

    Args:
        num_centres: N patch centres (a Fibonacci grid).
        num_samples: M sample points of the signal (a finer Fibonacci grid).
        patch_size: K samples per patch, the K nearest the centre.
        rings: R rings of K/R samples, by distance.
        descriptor: ``"ordered"`` (a fixed local frame) or ``"rings"`` (sorted values per ring: invariant
            to rotations about the centre).
    """

    def __init__(self, num_centres: int, num_samples: int, patch_size: int, rings: int, descriptor: str):
        super().__init__()
        if descriptor not in DESCRIPTORS:
            raise ValueError(f"descriptor must be one of {list(DESCRIPTORS)}, got {descriptor!r}")
        if patch_size % rings:
            raise ValueError(f"rings={rings} must divide patch_size={patch_size}")
        self.num_centres, self.num_samples, self.patch_size, self.rings = num_centres, num_samples, patch_size, rings
        self.descriptor = descriptor
        centres, samples = fibonacci_sphere(num_centres), fibonacci_sphere(num_samples)
        idx = neighbourhoods(centres, samples, patch_size)  # (N, K), nearest first
        if descriptor == "ordered":  # inside each ring, order by azimuth in the local frame
            az = _local_azimuth(centres, samples[idx]).view(num_centres, rings, -1)  # (N, R, K/R)
            order = az.argsort(dim=-1) + torch.arange(rings)[:, None] * (patch_size // rings)
            idx = idx.gather(1, order.view(num_centres, patch_size))
        # Geometry derived from the config alone (never from parameters): buffers, not saved.
        self.register_buffer("centres", centres.float(), persistent=False)  # (N, 3)
        self.register_buffer("samples", samples.float(), persistent=False)  # (M, 3)
        self.register_buffer("index", idx, persistent=False)  # (N, K)

    def check(self, signal: Tensor, channels: int) -> Tensor:
        """``(B, M)`` or ``(B, C, M)`` finite floats → ``(B, C, M)``; a clear error otherwise."""
        if not torch.is_tensor(signal):
            raise DataError(f"a sphere model takes a tensor signal (B, C, M), got {type(signal).__name__}")
        if signal.dim() == 2 and channels == 1:
            signal = signal[:, None]
        if signal.dim() != 3 or signal.shape[1] != channels or signal.shape[2] != self.num_samples:
            raise DataError(f"expected a signal of shape (B, {channels}, {self.num_samples}) on the model's "
                            f"{self.num_samples}-point Fibonacci grid, got {tuple(signal.shape)}")
        if not signal.is_floating_point():
            signal = signal.float()
        if not torch.isfinite(signal).all():
            raise DataError("the signal has NaN or infinite values")
        return signal

    def forward(self, signal: Tensor) -> Tensor:
        """``(B, C, M) → (B, N, C·K)`` patch descriptors."""
        B, C, _ = signal.shape
        v = signal[:, :, self.index]  # (B, C, N, K)
        if self.descriptor == "rings":
            v = v.view(B, C, self.num_centres, self.rings, -1).sort(dim=-1).values  # (B, C, N, R, K/R)
        return v.reshape(B, C, self.num_centres, self.patch_size).permute(0, 2, 1, 3).reshape(B, self.num_centres, -1)

    def extra_repr(self) -> str:
        return (f"num_centres={self.num_centres}, num_samples={self.num_samples}, patch_size={self.patch_size}, "
                f"rings={self.rings}, descriptor={self.descriptor!r}")
