"""Sphere tokens: the Fibonacci grid and its exact symmetry, patches, descriptors, projection, rotations."""

import math

import pytest
import torch

from tokennet.data.sphere import equirectangular_points, project_images, random_rotations
from tokennet.errors import DataError
from tokennet.tokens.sphere import FLIP_X, SpherePatches, fibonacci_sphere, neighbourhoods, to_angles


def test_fibonacci_grid_is_unit_near_uniform_and_maps_onto_itself_under_flip_x():
    for n in (48, 256, 1280):
        p = fibonacci_sphere(n)
        assert p.shape == (n, 3)
        torch.testing.assert_close(p.norm(dim=-1), torch.ones(n, dtype=torch.float64))
        torch.testing.assert_close(p @ FLIP_X.T, p.flip(0))  # point i → n−1−i: an exact grid rotation
        # Near-uniform: nearest-neighbour angles within a factor ~2 of the ideal spacing √(4π/n).
        cos = (p @ p.T).fill_diagonal_(-1.0)
        nn_angle = torch.acos(cos.max(dim=1).values.clamp(-1, 1))
        ideal = math.sqrt(4 * math.pi / n)
        assert 0.5 * ideal < nn_angle.min() and nn_angle.max() < 1.5 * ideal
    assert torch.det(FLIP_X) == 1.0


def test_neighbourhoods_are_the_nearest_samples_nearest_first():
    c, s = fibonacci_sphere(12), fibonacci_sphere(200)
    idx = neighbourhoods(c, s, 9)
    ang = torch.acos((c[:, None] * s[idx]).sum(-1).clamp(-1, 1))  # (12, 9)
    assert (ang.diff(dim=1) >= -1e-12).all()
    far = torch.acos((c @ s.T).clamp(-1, 1)).sort(dim=1).values[:, 9]
    assert (ang[:, -1] <= far + 1e-12).all()


@pytest.mark.parametrize("descriptor", ["ordered", "rings"])
def test_patch_tokens_shape_and_content(descriptor):
    p = SpherePatches(20, 160, 8, 2, descriptor)
    x = torch.randn(3, 2, 160)
    t = p(x)
    assert t.shape == (3, 20, 2 * 8)
    # Every token holds exactly its patch's samples (channel by channel), in some order.
    for ch in range(2):
        got = t[:, :, ch * 8:(ch + 1) * 8].sort(-1).values
        torch.testing.assert_close(got, x[:, ch][:, p.index].sort(-1).values)
    if descriptor == "rings":  # each ring sorted: invariant to permutations inside a ring
        r = t[..., :8].view(3, 20, 2, 4)
        assert (r.diff(dim=-1) >= 0).all()


def test_rings_descriptor_permutes_with_the_exact_grid_rotation():
    """Under the grid-aligned rotation the signal is a permutation of samples; tokens permute (i → N−1−i)."""
    p = SpherePatches(48, 400, 12, 3, "rings")
    x = torch.randn(2, 1, 400, dtype=torch.float64)
    rotated = x.flip(-1)  # f(Rᵀ s_j) = f(s_{M−1−j})
    torch.testing.assert_close(p(rotated), p(x).flip(1), rtol=0, atol=0)


def test_check_rejects_wrong_shapes_and_nan():
    p = SpherePatches(8, 64, 4, 2, "rings")
    with pytest.raises(DataError, match="shape"):
        p.check(torch.zeros(2, 1, 63), 1)
    with pytest.raises(DataError, match="NaN"):
        p.check(torch.full((2, 1, 64), float("nan")), 1)
    assert p.check(torch.zeros(2, 64), 1).shape == (2, 1, 64)


def test_random_rotations_are_seeded_rotations_and_look_uniform():
    r = random_rotations(4000, 3)
    torch.testing.assert_close(r @ r.transpose(1, 2), torch.eye(3, dtype=torch.float64).expand(4000, 3, 3))
    torch.testing.assert_close(torch.det(r), torch.ones(4000, dtype=torch.float64))
    torch.testing.assert_close(r, random_rotations(4000, 3), rtol=0, atol=0)
    # Uniform on SO(3): the image of the north pole is uniform on the sphere (mean 0, E[z²] = 1/3),
    # and the trace has mean 0.
    z = r[:, :, 2]
    assert z.mean(0).abs().max() < 0.05 and abs((z[:, 2] ** 2).mean() - 1 / 3) < 0.03
    assert abs(r.diagonal(dim1=1, dim2=2).sum(-1).mean()) < 0.06


def test_projection_puts_the_image_on_the_northern_hemisphere_and_rotates_as_f_of_rt_p():
    img = torch.zeros(1, 1, 8, 8)
    img[0, 0, 3:5, 3:5] = 1.0  # a bright centre
    pts = fibonacci_sphere(2000)
    f = project_images(img, pts)
    assert f.shape == (1, 1, 2000)
    assert (f[0, 0, pts[:, 2] <= 0] == 0).all()
    assert f[0, 0, pts[:, 2] > 0.99].min() > 0.5  # the image's centre sits at the pole
    # A rotation moves the bright spot to R·north.
    rot = random_rotations(1, 5)
    g = project_images(img, pts, rot)
    centroid = (g[0, 0, :, None].double() * pts).sum(0)
    assert torch.dot(centroid / centroid.norm(), rot[0][:, 2]) > 0.999


def test_equirectangular_points_are_row_major_from_the_north():
    p = equirectangular_points(4, 8)
    assert p.shape == (32, 3)
    theta, _ = to_angles(p)
    assert (theta.view(4, 8).diff(dim=0) > 0).all()


def test_zonal_descriptor_shape_constants_and_kernels():
    p = SpherePatches(20, 400, 9, 3, "zonal")
    assert p.out_features(2) == 2 * 3 * 3
    t = p(torch.randn(4, 2, 400))
    assert t.shape == (4, 20, 18)
    # A constant signal: every ring mean is the constant, every |a_rm| (m = 1, 2) is 0 exactly.
    d = p(torch.full((1, 1, 400), 2.5, dtype=torch.float64)).view(20, 3, 3)  # (N, R, orders)
    torch.testing.assert_close(d[..., 0], torch.full((20, 3), 2.5, dtype=torch.float64), rtol=0, atol=1e-5)
    assert d[..., 1:].abs().max() < 1e-5
    # The ring kernels: non-negative, normalized, zero beyond the patch radius a = 4·√(4/N).
    from tokennet.tokens.sphere import zonal_kernels

    c, s = fibonacci_sphere(20), fibonacci_sphere(400)
    idx, w = zonal_kernels(c, s, 3)
    w0 = w.view(3, 5, 20, -1)[:, 0]  # (R, N, K')
    assert (w0 >= 0).all()
    torch.testing.assert_close(w0.sum(-1), torch.ones(3, 20, dtype=torch.float64))
    angle = torch.acos((c[:, None] * s[idx]).sum(-1).clamp(-1, 1))
    assert (w0[:, angle >= 4 * math.sqrt(4 / 20)] == 0).all()
    assert (w0[:, angle < 3 * math.sqrt(4 / 20)] > 0).all()


def test_zonal_descriptor_permutes_with_the_exact_grid_rotation():
    """The moduli |a_rm| do not depend on the tangent frame, so under FLIP_X tokens permute i → N−1−i."""
    p = SpherePatches(48, 400, 12, 3, "zonal")
    x = torch.randn(2, 1, 400, dtype=torch.float64)
    torch.testing.assert_close(p(x.flip(-1)), p(x).flip(1), rtol=0, atol=1e-6)
    o = SpherePatches(48, 400, 12, 3, "ordered")  # a fixed frame: no such symmetry
    assert not torch.allclose(o(x.flip(-1)), o(x).flip(1), atol=1e-3)


def test_zonal_descriptor_moves_far_less_than_rings_under_random_rotations():
    """Rotating a digit re-samples it on the grid. Pooled over the tokens, the smooth zonal descriptor moves
    several times less than the sorted rings (which jump when samples cross between rings)."""
    from tokennet.data.vision_data import load_digits

    img = load_digits().x_test[:16]
    rots = random_rotations(16, 11)

    def change(p):
        a = p(project_images(img, p.samples, extent=0.7)).mean(1)
        b = p(project_images(img, p.samples, rots, extent=0.7)).mean(1)
        return float((a - b).norm(dim=-1).mean() / torch.pdist(a).mean())

    cz, cr = change(SpherePatches(256, 2048, 16, 4, "zonal")), change(SpherePatches(256, 2048, 16, 4, "rings"))
    assert cz < 0.05 and cz < cr / 3, (cz, cr)


def test_zonal_takes_any_patch_size_others_need_rings_to_divide_it():
    from tokennet.tokens.sphere import SpherePatches

    assert SpherePatches(48, 256, 10, 4, "zonal").out_features(1) == 12  # 4 rings × 3 orders; patch_size unused
    with pytest.raises(ValueError, match="rings=4 must divide patch_size=10"):
        SpherePatches(48, 256, 10, 4, "rings")
