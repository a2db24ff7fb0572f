"""Sphere transformer: the addition theorem behind the angle bias, and rotation invariance.

Which invariance holds how exactly:
- the angle bias depends on centre dot products only: exactly invariant under *any* rotation of the
  centres (tested to float tolerance);
- the whole invariant model (angle bias + ring descriptors + mean pooling) is exactly invariant under
  the rotation by π about x, which maps both Fibonacci grids onto themselves (float tolerance);
- under a general rotation the grids do not map onto themselves: the rotated *continuous* signal is
  re-sampled, and the invariance is approximate. Tested statistically: over random rotations the
  invariant model's features move far less than the absolute-position model's.
"""

import math

import pytest
import torch

from tokennet.data.sphere import project_images, random_rotations
from tokennet.errors import ConfigError, DataError
from tokennet.models import create_model
from tokennet.models.sphere import AngleBias, legendre
from tokennet.position.spherical import real_spherical_harmonics
from tokennet.tokens.sphere import FLIP_X, fibonacci_sphere, to_angles


def test_legendre_matches_closed_forms():
    t = torch.linspace(-1, 1, 101, dtype=torch.float64)
    p = legendre(t, 4)
    torch.testing.assert_close(p[:, 2], (3 * t**2 - 1) / 2)
    torch.testing.assert_close(p[:, 3], (5 * t**3 - 3 * t) / 2)
    torch.testing.assert_close(p[:, 4], (35 * t**4 - 30 * t**2 + 3) / 8)


@pytest.mark.parametrize("L", [0, 1, 3, 8])
def test_addition_theorem_against_real_spherical_harmonics(L):
    """Σ_m Y_lm(x) Y_lm(y) = (2l+1)/(4π) P_l(x·y), for every degree l <= L, at random point pairs."""
    g = torch.Generator().manual_seed(0)
    x = torch.nn.functional.normalize(torch.randn(200, 3, generator=g, dtype=torch.float64), dim=-1)
    y = torch.nn.functional.normalize(torch.randn(200, 3, generator=g, dtype=torch.float64), dim=-1)
    yx, yy = real_spherical_harmonics(*to_angles(x), L), real_spherical_harmonics(*to_angles(y), L)
    p = legendre((x * y).sum(-1), L)  # (200, L+1)
    for l in range(L + 1):
        lhs = (yx[:, l * l:(l + 1) ** 2] * yy[:, l * l:(l + 1) ** 2]).sum(-1)
        torch.testing.assert_close(lhs, (2 * l + 1) / (4 * math.pi) * p[:, l], rtol=1e-9, atol=1e-12)


def test_angle_bias_is_the_kernel_of_the_harmonics_and_invariant_under_any_rotation():
    L, H = 5, 3
    bias = AngleBias(L, H).double()
    with torch.no_grad():
        bias.weight.copy_(torch.randn(H, L + 1, dtype=torch.float64))
    c = fibonacci_sphere(40)
    b = bias(c)  # (1, H, N, N)
    assert b.shape == (1, H, 40, 40)
    # Equal to G Σ_l w_hl Σ_m Y_lm(c_i) Y_lm(c_j), computed from the harmonics themselves.
    Y = real_spherical_harmonics(*to_angles(c), L)  # (N, (L+1)²)
    ref = bias.GAIN * torch.stack([sum(bias.weight[h, l] * Y[:, l * l:(l + 1) ** 2] @ Y[:, l * l:(l + 1) ** 2].T
                           for l in range(L + 1)) for h in range(H)])[None]
    torch.testing.assert_close(b, ref.detach(), rtol=1e-9, atol=1e-12)
    for R in random_rotations(5, 1):
        torch.testing.assert_close(bias(c @ R.T), b, rtol=1e-9, atol=1e-12)


def _invariant(position="angle-bias", descriptor="rings", **kw):
    torch.manual_seed(0)
    m = create_model("sphere-micro", position=position, descriptor=descriptor, **kw).eval()
    with torch.no_grad():
        m.angle_bias.weight.normal_()  # a non-trivial bias (it starts at zero)
    return m


INVARIANT = [("angle-bias", "rings"), ("angle-bias+centroid", "zonal")]


@pytest.mark.parametrize("position,descriptor", INVARIANT)
def test_invariant_model_is_exactly_invariant_under_a_grid_aligned_rotation(position, descriptor):
    m = _invariant(position, descriptor)
    torch.testing.assert_close(m.samples.double() @ FLIP_X.T, m.samples.double().flip(0), rtol=0, atol=1e-6)
    x = torch.rand(3, 1, m.config.num_samples)
    with torch.no_grad():
        out, out_rot = m(x).logits, m(x.flip(-1)).logits  # f(Rᵀ s_j) = f(s_{M−1−j})
        h, h_rot = m.forward_features(x), m.forward_features(x.flip(-1))
    torch.testing.assert_close(out_rot, out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h_rot, h.flip(1), rtol=1e-4, atol=1e-4)  # tokens permute i → N−1−i


def test_absolute_model_is_not_invariant_under_the_same_rotation():
    torch.manual_seed(0)
    m = create_model("sphere-micro", position="sh", descriptor="ordered").eval()
    x = torch.rand(3, 1, m.config.num_samples)
    with torch.no_grad():
        assert not torch.allclose(m(x).logits, m(x.flip(-1)).logits, atol=1e-3)


@pytest.mark.parametrize("position,descriptor,bound", [("angle-bias", "rings", 0.35),
                                                      ("angle-bias+centroid", "zonal", 0.06)])
def test_invariance_under_random_rotations_holds_statistically(position, descriptor, bound):
    """Re-sampling the rotated continuous signal: the invariant model's pooled features change little,
    several times less than the absolute-position model's (the grids map onto themselves only approximately);
    the smooth zonal descriptor far less than the sorted rings."""
    torch.manual_seed(0)
    over = dict(num_centres=256, num_samples=2048, patch_size=16, rings=4, dim=32)
    inv = _invariant(position, descriptor, **over)
    torch.manual_seed(0)
    ab = create_model("sphere-micro", position="sh", descriptor="ordered", **over).eval()
    from tokennet.data.vision_data import load_digits

    img = load_digits().x_test[:8]  # eight different digits
    rots = random_rotations(8, 11)

    def change(m):
        """How far rotating an image moves its pooled features, relative to how far apart different
        images' features lie (1: a rotation changes as much as a different image)."""
        with torch.no_grad():
            a = m.forward_features(project_images(img, m.samples, extent=0.7)).mean(1)
            b = m.forward_features(project_images(img, m.samples, rots, extent=0.7)).mean(1)
        between = torch.pdist(a).mean()
        return float((a - b).norm(dim=-1).mean() / between)

    ci, ca = change(inv), change(ab)
    assert ci < bound, ci  # measured: rings 0.23, zonal + centroid 0.019 (absolute model: 1.03)
    assert ci < ca / 3, (ci, ca)


def test_centroid_position_turns_with_the_signal():
    """u(f_R) ≈ R u(f): the centroid angle c·u of the rotated signal is that of the original at Rᵀc."""
    from tokennet.data.vision_data import load_digits
    from tokennet.models.sphere import CentroidPosition

    pts = fibonacci_sphere(2048).float()
    img = load_digits().x_test[:6]
    rots = random_rotations(6, 3)
    f, g = project_images(img, pts, extent=0.7), project_images(img, pts, rots, extent=0.7)
    u = torch.nn.functional.normalize(f.sum(1) @ pts, dim=-1).double()
    v = torch.nn.functional.normalize(g.sum(1) @ pts, dim=-1).double()
    assert (torch.einsum("bij,bj->bi", rots, u) * v).sum(-1).min() > 0.999
    pos = CentroidPosition(3, 8)
    c = fibonacci_sphere(40).float()
    with torch.no_grad():
        for b in range(6):  # c_i·(R u) = (Rᵀ c_i)·u; the rows of c @ R are the Rᵀ c_i
            moved = pos(f[b:b + 1], pts, c @ rots[b].float())
            torch.testing.assert_close(pos(g[b:b + 1], pts, c), moved, rtol=0, atol=0.02)
    with torch.no_grad():  # a zero signal has no direction: finite, every token the same
        z = pos(torch.zeros(1, 1, 2048), pts, c)
    assert torch.isfinite(z).all() and (z == z[:, :1]).all()


def test_config_errors_and_bad_inputs():
    with pytest.raises(ConfigError, match="rings"):
        create_model("sphere-micro", descriptor="rings", patch_size=8, rings=3)
    with pytest.raises(ConfigError, match="position"):
        create_model("sphere-micro", position="rope")
    m = create_model("sphere-micro")
    with pytest.raises(DataError, match="shape"):
        m(torch.zeros(2, 1, 10))
    with pytest.raises(DataError, match="NaN"):
        m(torch.full((2, 1, m.config.num_samples), float("nan")))
    assert m.num_parameters() == sum(p.numel() for p in m.state_dict().values())  # geometry is not saved


def test_signal_frame_turns_with_the_signal():
    """F(f_R) ≈ F(f) Rᵀ: u → R u and e1 → ±R e1 (a principal axis has no sign), for real projected digits."""
    from tokennet.data.vision_data import load_digits
    from tokennet.tokens.sphere import signal_frame

    pts = fibonacci_sphere(2048).float()
    img = load_digits().x_test[:8]
    rots = random_rotations(8, 5)
    fa = signal_frame(project_images(img, pts, extent=0.7), pts).double()  # (B, 3, 3) rows e1, e2, u
    fb = signal_frame(project_images(img, pts, rots, extent=0.7), pts).double()
    moved = fa @ rots.transpose(1, 2)  # rows R e1, R e2, R u
    assert (moved[:, 2] * fb[:, 2]).sum(-1).min() > 0.999
    assert (moved[:, 0] * fb[:, 0]).sum(-1).abs().min() > 0.99
    torch.testing.assert_close(fb @ fb.transpose(1, 2), torch.eye(3, dtype=torch.float64).expand(8, 3, 3), atol=1e-5,
                               rtol=0)
    assert torch.linalg.det(fb).min() > 0.999  # a rotation (right-handed), not a reflection


@pytest.mark.parametrize("descriptor", ["zonal-frame", "zonal"])
def test_frame_model_is_exactly_invariant_under_a_grid_aligned_rotation_and_averages_the_half_turn(descriptor):
    torch.manual_seed(0)
    m = create_model("sphere-micro", position="frame", descriptor=descriptor).eval()
    x = torch.rand(3, 1, m.config.num_samples)
    with torch.no_grad():
        out, out_rot = m(x).logits, m(x.flip(-1)).logits
        one = [m.forward_head(m.forward_features(x, half_turn=torch.full((3,), t))) for t in (False, True)]
    torch.testing.assert_close(out_rot, out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.exp().sum(-1), torch.ones(3))  # log-probabilities
    mean = torch.stack([o.softmax(-1) for o in one]).mean(0).log()
    torch.testing.assert_close(out, mean, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(one[0], one[1], atol=1e-4)  # the two frames do differ: the average is needed


def test_frame_model_changes_little_under_random_rotations():
    """Under rotations that do not map the grid onto itself, the frame model's class probabilities move far
    less than the absolute-position model's (resampling and quadrature error only)."""
    from tokennet.data.vision_data import load_digits

    over = dict(num_centres=256, num_samples=2048, patch_size=16, rings=4, dim=32)
    img = load_digits().x_test[:8]
    rots = random_rotations(8, 11)

    def change(m):
        with torch.no_grad():
            a = m(project_images(img, m.samples, extent=0.7)).logits.softmax(-1)
            b = m(project_images(img, m.samples, rots, extent=0.7)).logits.softmax(-1)
        return float((a - b).abs().sum(-1).mean() / torch.pdist(a, p=1).mean())

    torch.manual_seed(0)
    inv = create_model("sphere-micro", position="frame", descriptor="zonal-frame", **over).eval()
    torch.manual_seed(0)
    ab = create_model("sphere-micro", position="sh", descriptor="ordered", **over).eval()
    for m in (inv, ab):
        with torch.no_grad():
            for p in m.parameters():
                p.mul_(3.0)  # a random model whose outputs vary from image to image
    ci, ca = change(inv), change(ab)
    assert ci < ca / 3, (ci, ca)  # measured: frame 0.25, absolute 1.91


def test_zonal_frame_needs_the_frame_position():
    with pytest.raises(ConfigError, match="needs position='frame'"):
        create_model("sphere-micro", position="angle-bias", descriptor="zonal-frame")
