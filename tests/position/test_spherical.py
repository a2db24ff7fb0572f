import math

import numpy as np
import pytest
import scipy.special
import torch

from tokennet.position import SphericalHarmonicsPosition, real_spherical_harmonics


def sphere_quadrature(L):
    """Gauss–Legendre in cos θ × uniform φ: exact for the products of harmonics of degree <= L."""
    x, w = np.polynomial.legendre.leggauss(L + 2)
    m = 2 * L + 3
    phi = 2 * np.pi * np.arange(m) / m
    theta = np.arccos(x)
    tt, pp = np.meshgrid(theta, phi, indexing="ij")
    ww = np.repeat(w[:, None], m, axis=1) * (2 * np.pi / m)
    return torch.from_numpy(tt.ravel()), torch.from_numpy(pp.ravel()), torch.from_numpy(ww.ravel())


@pytest.mark.parametrize("L", [0, 2, 5])
def test_orthonormal_on_the_sphere(L):
    theta, phi, w = sphere_quadrature(L)
    y = real_spherical_harmonics(theta, phi, L)  # (P, (L+1)²)
    assert y.shape == (len(theta), (L + 1) ** 2) and y.dtype == torch.float64
    gram = y.T @ (w[:, None] * y)
    torch.testing.assert_close(gram, torch.eye((L + 1) ** 2, dtype=torch.float64), atol=1e-12, rtol=0)
    y32 = real_spherical_harmonics(theta.float(), phi.float(), L)
    gram32 = (y32.T @ (w.float()[:, None] * y32)).double()
    torch.testing.assert_close(gram32, torch.eye((L + 1) ** 2, dtype=torch.float64), atol=1e-5, rtol=0)


def complex_sh(l, m, theta, phi):
    if hasattr(scipy.special, "sph_harm_y"):
        return scipy.special.sph_harm_y(l, m, theta, phi)
    return scipy.special.sph_harm(m, l, phi, theta)  # older scipy: (order, degree, azimuth, polar)


def test_matches_scipy_converted_to_real():
    rng = np.random.default_rng(0)
    theta, phi = rng.uniform(0, np.pi, 40), rng.uniform(0, 2 * np.pi, 40)
    L = 5
    ref = []
    for l in range(L + 1):
        for m in range(-l, l + 1):
            c = complex_sh(l, abs(m), theta, phi)  # includes the Condon–Shortley phase (−1)^m
            if m < 0:
                ref.append(math.sqrt(2) * (-1) ** m * c.imag)
            elif m == 0:
                ref.append(c.real)
            else:
                ref.append(math.sqrt(2) * (-1) ** m * c.real)
    y = real_spherical_harmonics(torch.from_numpy(theta), torch.from_numpy(phi), L)
    np.testing.assert_allclose(y.numpy(), np.stack(ref, axis=-1), atol=1e-12)


def test_low_degrees_and_addition_theorem():
    theta, phi = torch.rand(20, dtype=torch.float64) * math.pi, torch.rand(20, dtype=torch.float64) * 6.0
    y = real_spherical_harmonics(theta, phi, 3)
    c = math.sqrt(3 / (4 * math.pi))
    xyz = torch.stack([theta.sin() * phi.cos(), theta.sin() * phi.sin(), theta.cos()], dim=-1)
    torch.testing.assert_close(y[:, 0], torch.full((20,), 0.5 / math.sqrt(math.pi), dtype=torch.float64))
    torch.testing.assert_close(y[:, 1:4], c * xyz[:, [1, 2, 0]])  # Y_1,-1 ∝ y, Y_10 ∝ z, Y_11 ∝ x
    for l in range(4):  # Σ_m Y_lm² = (2l + 1) / 4π at every point
        block = y[:, l * l:(l + 1) ** 2]
        torch.testing.assert_close((block**2).sum(-1), torch.full((20,), (2 * l + 1) / (4 * math.pi),
                                                                  dtype=torch.float64))


def test_poles_and_broadcasting():
    y = real_spherical_harmonics(torch.tensor([0.0, math.pi]), torch.tensor(1.0), 4)
    assert y.shape == (2, 25) and torch.isfinite(y).all()
    assert real_spherical_harmonics(torch.zeros(2, 3, 1), torch.zeros(4), 2).shape == (2, 3, 4, 9)


def test_module_shape_and_errors():
    pos = SphericalHarmonicsPosition(3, 12)
    out = pos(torch.rand(2, 5) * math.pi, torch.rand(2, 5) * 2 * math.pi)
    assert out.shape == (2, 5, 12)
    out.sum().backward()
    with pytest.raises(ValueError, match="L must"):
        real_spherical_harmonics(torch.zeros(1), torch.zeros(1), -1)
    with pytest.raises(ValueError, match="L >= 0"):
        SphericalHarmonicsPosition(-2, 4)
