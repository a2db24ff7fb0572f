"""Signals on the sphere → patch tokens ``(B, N, F)`` around a near-uniform grid of centres.

A signal is sampled at M points of a Fibonacci grid (the "pixels"); N coarser Fibonacci points are the
patch centres; patch i is the K samples nearest centre i (a fixed neighbourhood, found once), split by
distance into R rings of K/R samples. Three descriptors of a patch:

- ``"ordered"``: ring by ring, the samples ordered by their azimuth in the centre's local east/north
  tangent frame — a picture of the patch in a fixed frame. Rotating the signal turns the patch in that
  frame, so this descriptor changes (use it with absolute positions).
- ``"rings"``: ring by ring, the sample *values* sorted — invariant to any permutation inside a ring,
  hence (up to resampling) to rotations of the patch about its centre: the descriptor an invariant model
  needs, since a rotation of the sphere moves a patch *and* spins it.
- ``"zonal"``: smooth, rotation-invariant quadrature of the signal against R ring kernels of radius
  ρ_r and the angular harmonics m = 0, 1, 2 around the centre (below) — invariant to rotations about the
  centre *and* smooth in where the signal lies relative to the grid, so a rotated signal gives nearly the
  same tokens (the "rings" descriptor jumps when a sample crosses from one ring to the next).

The zonal descriptor of centre c_i, for rings r = 0..R−1 and orders m = 0, 1, 2, over the samples s_j
within the patch radius a (ψ_ij: the azimuth of s_j about c_i in any tangent frame at c_i, α_ij: the
angle between them):

    w_r(α)  = exp(−(α − ρ_r)² / (2σ²)) · (1 − (α/a)²)²      ρ_r = r·a/R,  σ = a/R,  α < a
    a_irm   = Σ_j w_r(α_ij) e^{−i m ψ_ij} (f(s_j) − a_ir0) / Σ_j w_r(α_ij)   (m ≥ 1; a_ir0: same, m = 0, no −)
    d_i     = ( a_ir0 , |a_ir1| , |a_ir2| )_r                                   (3R values per channel)

(subtracting a_ir0 makes a constant signal give a_irm = 0 exactly, as the integral does; the samples never
sit exactly symmetric about c_i, and would otherwise add a grid-fixed dipole and quadrupole.)

a_ir0 is an isotropic spherical convolution sampled at c_i; the moduli |a_irm| (gradient- and line-like
strength) do not depend on the tangent frame, since a rotation about c_i multiplies a_irm by e^{−imγ}.
A rotation R of the sphere maps the kernels centred at c onto those centred at Rc, so the descriptor is
rotation-equivariant up to quadrature error: d_i(f_R) ≈ d(f)(Rᵀ c_i), smooth in R. The tokens sample
this smooth field at the centres; to keep that sampling from aliasing (a rotation moves the signal by a
fraction of the centre spacing), the patch radius is a = 4·√(4/N), four times the radius of a token's
own share of the sphere (area 4π/N): 0.5 rad for N = 256. Every sample within a is used (the index holds
the largest such count over the centres; farther extra samples get weight 0), so ``patch_size`` does not
apply to this descriptor; R = ``rings``.

**The signal's own frame** (:func:`signal_frame`): ``u``, the direction of the signal's centre of mass
``Σ_j |f(s_j)| s_j``, and ``e1``, the principal axis of the ``|f|``-weighted second moment of the samples
projected onto the tangent plane at u, ``Σ_j |f_j| (P s_j)(P s_j)ᵀ`` with ``P = I − u uᵀ``; ``e2 = u × e1``.
A rotation R of the signal rotates the frame with it (``u → Ru``, ``e1 → ±R e1``, up to quadrature), so
anything expressed in the frame does not change. ``e1`` has no sign (a principal axis), so the frame is
known up to the half-turn about u, ``(e1, e2) → (−e1, −e2)``; a model averages over both (a "frame
average", Puny et al. 2022, https://arxiv.org/abs/2110.03336). The ``"zonal-frame"`` descriptor is the
zonal one with its m = 1, 2 coefficients *kept as complex numbers* in the gauge of the frame: at centre
c_i the reference direction is ``t_i = e1 − (e1·c_i) c_i`` (e1 projected onto the tangent plane at c_i),
at angle γ_i from the local east, and ``a'_irm = a_irm e^{−i m γ_i}`` — the orientation of a stroke
relative to the pattern's axis, which the moduli ``|a_irm|`` discard, still invariant.

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

__all__ = ["fibonacci_sphere", "to_angles", "neighbourhoods", "zonal_kernels", "signal_frame", "SpherePatches",
           "DESCRIPTORS", "FLIP_X"]

DESCRIPTORS = ("ordered", "rings", "zonal", "zonal-frame")
ZONAL_ORDERS = 3  # angular orders m = 0, 1, 2 of the zonal descriptor
ZONAL_SPAN = 4.0  # the zonal patch radius, in units of a token's own disc radius √(4/N)
GOLDEN_ANGLE = math.pi * (3.0 - math.sqrt(5.0))
# The rotation by π about the x-axis: maps the centred Fibonacci grid onto itself (point i → n−1−i).
FLIP_X = torch.tensor([[1.0, 0.0, 0.0], [0.0, -1.0, 0.0], [0.0, 0.0, -1.0]], dtype=torch.float64)


def fibonacci_sphere(n: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """``n`` near-uniform unit vectors ``(n, 3)``: the centred Fibonacci grid (module docstring)."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"a Fibonacci grid needs n >= 1 points, got {n!r}")
    i = torch.arange(n, dtype=torch.float64)
    z = 1.0 - (2.0 * i + 1.0) / n
    radius = torch.sqrt((1.0 - z * z).clamp_min(0.0))
    phi = (i - (n - 1) / 2.0) * GOLDEN_ANGLE
    return torch.stack([radius * torch.cos(phi), radius * torch.sin(phi), z], dim=-1).to(dtype)  # (n, 3)


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


def _east_north(centres: Tensor) -> tuple[Tensor, Tensor]:
    """Each centre's local east and north unit vectors ``(N, 3)`` (float64)."""
    centre = centres.double()
    pole = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64).expand_as(centre)
    east = torch.linalg.cross(pole, centre)
    east = east / east.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return east, torch.linalg.cross(centre, east)


def _local_azimuth(centres: Tensor, points: Tensor) -> Tensor:
    """Azimuth ``(N, K)`` of points ``(N, K, 3)`` in each centre's east/north tangent frame."""
    centre = centres.double()
    east, north = _east_north(centre)
    offset = points.double() - centre[:, None]
    return torch.atan2((offset * north[:, None]).sum(-1), (offset * east[:, None]).sum(-1))


def zonal_kernels(centres: Tensor, samples: Tensor, rings: int) -> tuple[Tensor, Tensor]:
    """Neighbour indices ``(N, K')`` and quadrature weights ``(R·(2·ORDERS−1), N, K')`` of the zonal
    descriptor (module docstring): per ring r the rows w_r, w_r cos ψ, w_r sin ψ, w_r cos 2ψ, w_r sin 2ψ,
    each divided by Σ_j w_r, the last four with the constant removed. K' is the largest number of samples
    within the patch radius a over the centres; a centre with fewer gets weight 0 on the extra (farther)
    ones."""
    radius = ZONAL_SPAN * math.sqrt(4.0 / centres.shape[0])  # the patch radius (module docstring)
    angle = torch.acos((centres.double() @ samples.double().T).clamp(-1.0, 1.0))  # (N, M)
    k = max(int((angle < radius).sum(dim=1).max()), 1)
    idx = neighbourhoods(centres, samples, k)  # (N, K')
    alpha = angle.gather(1, idx)
    psi = _local_azimuth(centres, samples[idx])  # (N, K')
    rho = torch.arange(rings, dtype=torch.float64) * radius / rings  # (R,)
    sigma = radius / rings
    taper = (1.0 - (alpha / radius) ** 2).clamp_min(0.0) ** 2  # smooth to 0 at the patch radius
    weights = torch.exp(-((alpha[None] - rho[:, None, None]) ** 2) / (2 * sigma**2)) * taper  # (R, N, K')
    weights = weights / weights.sum(-1, keepdim=True).clamp_min(1e-300)
    rows = [weights]
    for m in range(1, ZONAL_ORDERS):
        for trig in (torch.cos, torch.sin):
            v = weights * trig(m * psi)
            rows.append(v - v.sum(-1, keepdim=True) * weights)  # Σ_j (v_j − (Σ_k v_k) w_j) f_j: f − a_ir0
    return idx, torch.stack(rows, dim=1).reshape(-1, *idx.shape)  # (R·(2·ORDERS−1), N, K')


def signal_frame(signal: Tensor, samples: Tensor) -> Tensor:
    """The signal's own frame (module docstring): ``(B, 3, 3)``, rows ``e1, e2, u``, a rotation matrix.

    Args:
        signal: ``(B, C, M)`` on the grid ``samples`` ``(M, 3)`` (channels' magnitudes summed as weights).

    ``e1`` is defined up to sign (eigh's choice); a zero signal has u = 0 and an arbitrary frame.
    """
    mass = signal.abs().sum(1).double()  # (B, M)
    grid = samples.double()
    axis_u = torch.nn.functional.normalize(mass @ grid, dim=-1)  # (B, 3)
    # (B, M, 3): the grid projected onto the tangent plane at u
    tangent = grid[None] - (grid[None] * axis_u[:, None]).sum(-1, keepdim=True) * axis_u[:, None]
    moment = torch.einsum("bm,bmi,bmj->bij", mass, tangent, tangent)  # (B, 3, 3), u is in its null space
    axis_e1 = torch.linalg.eigh(moment).eigenvectors[..., 2]  # (B, 3): the largest eigenvalue's axis
    axis_e2 = torch.linalg.cross(axis_u, axis_e1)
    dtype = signal.dtype if signal.is_floating_point() else torch.float32
    return torch.stack([axis_e1, axis_e2, axis_u], dim=1).to(dtype)


class SpherePatches(nn.Module):
    """Patch descriptors of signals on the Fibonacci sample grid: ``(B, C, M) → (B, N, F)``.

    Args:
        num_centres: N patch centres (a Fibonacci grid).
        num_samples: M sample points of the signal (a finer Fibonacci grid).
        patch_size: K samples per patch, the K nearest the centre.
        rings: R rings of K/R samples, by distance.
        descriptor: ``"ordered"`` (a fixed local frame), ``"rings"`` (sorted values per ring: invariant
            to rotations about the centre), ``"zonal"`` (smooth ring-kernel quadrature, invariant; it
            uses every sample within 4·√(4/N) rad of the centre, not patch_size, see the module docstring)
            or ``"zonal-frame"`` (the same quadrature, its m = 1, 2 coefficients in the gauge of the signal's
            frame: pass ``frame`` to :meth:`forward`).

    ``out_features`` is the descriptor's width per token: C·K, C·3R for ``"zonal"``, C·5R for ``"zonal-frame"``.
    """

    def __init__(self, num_centres: int, num_samples: int, patch_size: int, rings: int, descriptor: str):
        super().__init__()
        if descriptor not in DESCRIPTORS:
            raise ValueError(f"descriptor must be one of {list(DESCRIPTORS)}, got {descriptor!r}")
        zonal = descriptor.startswith("zonal")
        if not zonal and patch_size % rings:
            raise ValueError(f"rings={rings} must divide patch_size={patch_size}")
        self.num_centres, self.num_samples, self.patch_size, self.rings = num_centres, num_samples, patch_size, rings
        self.descriptor = descriptor
        centres, samples = fibonacci_sphere(num_centres), fibonacci_sphere(num_samples)
        if zonal:
            idx, weight = zonal_kernels(centres, samples, rings)
            self.register_buffer("weight", weight.float(), persistent=False)  # (R·(2·ORDERS−1), N, K')
            east, north = _east_north(centres)
            self.register_buffer("east", east.float(), persistent=False)  # (N, 3)
            self.register_buffer("north", north.float(), persistent=False)  # (N, 3)
        else:
            idx = neighbourhoods(centres, samples, patch_size)  # (N, K), nearest first
        if descriptor == "ordered":  # inside each ring, order by azimuth in the local frame
            azimuth = _local_azimuth(centres, samples[idx]).view(num_centres, rings, -1)  # (N, R, K/R)
            order = azimuth.argsort(dim=-1) + torch.arange(rings)[:, None] * (patch_size // rings)
            idx = idx.gather(1, order.view(num_centres, patch_size))
        # Geometry derived from the config alone (never from parameters): buffers, not saved.
        self.register_buffer("centres", centres.float(), persistent=False)  # (N, 3)
        self.register_buffer("samples", samples.float(), persistent=False)  # (M, 3)
        self.register_buffer("index", idx, persistent=False)  # (N, K)

    def out_features(self, channels: int) -> int:
        """Width of a token's descriptor for a ``channels``-channel signal."""
        if self.descriptor == "zonal":
            return channels * self.rings * ZONAL_ORDERS
        if self.descriptor == "zonal-frame":
            return channels * self.rings * (2 * ZONAL_ORDERS - 1)
        return channels * self.patch_size

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

    def gauge(self, frame: Tensor) -> Tensor:
        """γ ``(B, N)``: the angle from each centre's east to the frame's e1 projected onto its tangent plane."""
        axis_e1 = frame[:, 0].to(self.centres.dtype)  # (B, 3)
        along = (self.centres[None] * axis_e1[:, None]).sum(-1, keepdim=True)  # (B, N, 1)
        t = axis_e1[:, None] - along * self.centres[None]  # (B, N, 3)
        return torch.atan2((t * self.north).sum(-1), (t * self.east).sum(-1))

    def forward(self, signal: Tensor, frame: Tensor | None = None) -> Tensor:
        """``(B, C, M) → (B, N, F)`` patch descriptors, F = :meth:`out_features` (``frame`` ``(B, 3, 3)``:
        :func:`signal_frame`, for ``"zonal-frame"``)."""
        B, C, _ = signal.shape
        v = signal[:, :, self.index]  # (B, C, N, K)
        if self.descriptor.startswith("zonal"):
            coeffs = torch.einsum("bcnk,fnk->bcnf", v, self.weight.to(v.dtype))  # (B, C, N, R·(2·ORDERS−1))
            coeffs = coeffs.view(B, C, self.num_centres, self.rings, 2 * ZONAL_ORDERS - 1)
            if self.descriptor == "zonal-frame":
                if frame is None:
                    raise ValueError("the zonal-frame descriptor needs the signal's frame (signal_frame)")
                gamma = self.gauge(frame).to(coeffs.dtype)[:, None, :, None]  # (B, 1, N, 1)
                parts = [coeffs[..., 0]]
                for m in range(1, ZONAL_ORDERS):  # a' = a e^{−imγ}: (c + i s)(cos mγ − i sin mγ)
                    cos_coeff, sin_coeff = coeffs[..., 2 * m - 1], coeffs[..., 2 * m]
                    cos, sin = torch.cos(m * gamma), torch.sin(m * gamma)
                    parts += [cos_coeff * cos + sin_coeff * sin, sin_coeff * cos - cos_coeff * sin]
                features = torch.stack(parts, dim=-1)  # (B, C, N, R, 2·ORDERS−1)
                return features.permute(0, 2, 1, 3, 4).reshape(B, self.num_centres, -1)
            # |a_irm|, with a tiny floor under the root so that gradients at a = 0 (an empty patch) are finite.
            mods = [coeffs[..., 0]] + [(coeffs[..., 2 * m - 1] ** 2 + coeffs[..., 2 * m] ** 2 + 1e-12).sqrt()
                                  for m in range(1, ZONAL_ORDERS)]
            features = torch.stack(mods, dim=-1)  # (B, C, N, R, ORDERS)
            return features.permute(0, 2, 1, 3, 4).reshape(B, self.num_centres, -1)
        if self.descriptor == "rings":
            v = v.view(B, C, self.num_centres, self.rings, -1).sort(dim=-1).values  # (B, C, N, R, K/R)
        return v.reshape(B, C, self.num_centres, self.patch_size).permute(0, 2, 1, 3).reshape(B, self.num_centres, -1)

    def extra_repr(self) -> str:
        return (f"num_centres={self.num_centres}, num_samples={self.num_samples}, patch_size={self.patch_size}, "
                f"rings={self.rings}, descriptor={self.descriptor!r}")
