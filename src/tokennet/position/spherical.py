"""Real spherical harmonics as positions for points on a sphere (e.g. tokens on the globe).

Real, orthonormal harmonics Y_lm, l = 0..L, m = -l..l, so that ∫_{S²} Y_a Y_b dΩ = δ_ab:

    Y_lm(θ, φ) = √2 · P̄_l^|m|(cos θ) · sin(|m| φ)   for m < 0
    Y_l0(θ, φ) =      P̄_l^0(cos θ)
    Y_lm(θ, φ) = √2 · P̄_l^m(cos θ)  · cos(m φ)      for m > 0

with P̄_l^m the associated Legendre functions scaled by √((2l+1)/(4π) · (l−m)!/(l+m)!), without the
Condon–Shortley phase (so Y_11 = √(3/4π) x). Feature index l² + l + m. A linear map of the (L+1)² features
gives a token position that is smooth on the sphere, with no seam at φ = ±π and no pole singularity
(as in Rußwurm et al. 2024, "Geographic location encoding with spherical harmonics",
https://arxiv.org/abs/2310.06743).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["real_spherical_harmonics", "SphericalHarmonicsPosition"]


def _legendre_normalized(x: Tensor, s: Tensor, L: int) -> dict[tuple[int, int], Tensor]:
    """P̄_l^m(x) for 0 <= m <= l <= L, x = cos θ, s = sin θ >= 0, by the stable recurrences

    P̄_0^0 = 1/√(4π),  P̄_m^m = √((2m+1)/(2m)) s P̄_{m-1}^{m-1},  P̄_{m+1}^m = √(2m+3) x P̄_m^m,
    P̄_l^m = a_lm (x P̄_{l-1}^m − b_lm P̄_{l-2}^m),  a_lm = √((4l²−1)/(l²−m²)),
    b_lm = √(((l−1)²−m²)/(4(l−1)²−1)).
    """
    legendre: dict[tuple[int, int], Tensor] = {(0, 0): torch.full_like(x, 1.0 / math.sqrt(4 * math.pi))}
    for m in range(1, L + 1):
        legendre[m, m] = math.sqrt((2 * m + 1) / (2 * m)) * s * legendre[m - 1, m - 1]
    for m in range(0, L):
        legendre[m + 1, m] = math.sqrt(2 * m + 3) * x * legendre[m, m]
        for deg in range(m + 2, L + 1):
            coef_a = math.sqrt((4 * deg * deg - 1) / (deg * deg - m * m))
            coef_b = math.sqrt(((deg - 1) ** 2 - m * m) / (4 * (deg - 1) ** 2 - 1))
            legendre[deg, m] = coef_a * (x * legendre[deg - 1, m] - coef_b * legendre[deg - 2, m])
    return legendre


def real_spherical_harmonics(theta: Tensor, phi: Tensor, L: int) -> Tensor:
    """Real orthonormal spherical harmonics Y_lm(θ, φ) for l = 0..L, m = −l..l.

    Y_lm = √2 P̄_l^|m|(cos θ) sin(|m|φ) (m < 0), P̄_l^0(cos θ) (m = 0), √2 P̄_l^m(cos θ) cos(mφ) (m > 0);
    ∫ Y_a Y_b dΩ = δ_ab over the unit sphere. Column l² + l + m holds Y_lm.

    Args:
        theta: polar angle θ ∈ [0, π] (colatitude), any shape broadcastable with phi.
        phi: azimuth φ (any real; periodic with period 2π).
        L: the largest degree, >= 0.

    Returns:
        Tensor of shape (..., (L+1)²), in the floating dtype of the inputs (float32 for integer inputs).
    """
    if not isinstance(L, int) or L < 0:
        raise ValueError(f"L must be an int >= 0 (the largest degree), got {L!r}")
    theta, phi = torch.as_tensor(theta), torch.as_tensor(phi)
    dtype = torch.promote_types(theta.dtype, phi.dtype)
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    theta, phi = torch.broadcast_tensors(theta.to(dtype), phi.to(dtype))
    x, sin_theta = torch.cos(theta), torch.sin(theta).abs()  # |sin θ| keeps θ slightly outside [0, π] well defined
    legendre = _legendre_normalized(x, sin_theta, L)
    cos_m = [torch.cos(m * phi) for m in range(L + 1)]
    sin_m = [torch.sin(m * phi) for m in range(L + 1)]
    out = []
    for deg in range(L + 1):
        for m in range(-deg, deg + 1):
            if m < 0:
                out.append(math.sqrt(2) * legendre[deg, -m] * sin_m[-m])
            elif m == 0:
                out.append(legendre[deg, 0])
            else:
                out.append(math.sqrt(2) * legendre[deg, m] * cos_m[m])
    return torch.stack(out, dim=-1)  # (..., (L+1)²)


class SphericalHarmonicsPosition(nn.Module):
    """Position of a point on the sphere: W · Y(θ, φ) + b, a linear map of the (L+1)² real harmonics.

    Args:
        L: the largest degree of the harmonics (resolution ~ 180°/L).
        dim: output width D.
    """

    def __init__(self, L: int, dim: int):
        super().__init__()
        if not isinstance(L, int) or L < 0 or dim <= 0:
            raise ValueError(f"need an int L >= 0 and dim > 0, got L={L!r}, dim={dim}")
        self.L, self.dim = L, dim
        self.proj = nn.Linear((L + 1) ** 2, dim)

    def forward(self, theta: Tensor, phi: Tensor) -> Tensor:
        """Return the (..., D) positions of the points (θ, φ).

        Args:
            theta: polar angle θ ∈ [0, π], shape (...).
            phi: azimuth φ, shape broadcastable with theta.
        """
        y = real_spherical_harmonics(theta, phi, self.L)  # (..., (L+1)²)
        return self.proj(y.to(self.proj.weight.dtype))  # (..., D)

    def extra_repr(self) -> str:
        return f"L={self.L}, dim={self.dim}"
