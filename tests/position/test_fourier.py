import pytest
import torch

from tokennet.position import Fourier2DPosition, fourier_2d, random_fourier_features


def sincos(p, dim, base=10000.0):
    omega = base ** (-torch.arange(dim // 2, dtype=torch.float64) / (dim // 2))
    return torch.cat([torch.sin(p * omega), torch.cos(p * omega)])


def test_shape_and_row_major_layout():
    h, w, dim = 3, 5, 16
    pe = fourier_2d(h, w, dim, dtype=torch.float64)
    assert pe.shape == (h * w, dim)
    for r in range(h):
        for c in range(w):
            row = pe[r * w + c]
            torch.testing.assert_close(row[: dim // 2], sincos(r, dim // 2))  # first half: the row
            torch.testing.assert_close(row[dim // 2:], sincos(c, dim // 2))  # second half: the column
    grid = pe.reshape(h, w, dim)
    assert torch.equal(grid[:, :1, : dim // 2].expand(h, w, dim // 2), grid[..., : dim // 2])  # same row
    assert torch.equal(grid[:1, :, dim // 2:].expand(h, w, dim // 2), grid[..., dim // 2:])  # same column


def test_rows_are_distinct():
    pe = fourier_2d(8, 8, 32)
    dist = torch.cdist(pe, pe) + torch.eye(64)
    assert dist.min() > 1e-2


def test_module_prefix_gets_zeros_and_other_grid_on_the_fly():
    torch.manual_seed(0)
    pos = Fourier2DPosition(8, (2, 3), num_prefix=1)
    assert "pe" not in pos.state_dict()
    x = torch.randn(2, 7, 8)
    y = pos(x)
    torch.testing.assert_close(y[:, 0], x[:, 0])
    torch.testing.assert_close(y[:, 1:], x[:, 1:] + fourier_2d(2, 3, 8))
    x = torch.randn(2, 1 + 20, 8)
    torch.testing.assert_close(pos(x, grid=(4, 5))[:, 1:], x[:, 1:] + fourier_2d(4, 5, 8))


def test_bad_input():
    with pytest.raises(ValueError, match="divisible by 4"):
        fourier_2d(2, 2, 6)
    with pytest.raises(ValueError, match="divisible by 4"):
        Fourier2DPosition(10, (2, 2))
    with pytest.raises(ValueError, match="grid"):
        Fourier2DPosition(8, (2, 3))(torch.zeros(1, 5, 8))


def test_random_fourier_features():
    coords = torch.rand(10, 2)
    f1 = random_fourier_features(coords, 16, sigma=10.0, generator=torch.Generator().manual_seed(0))
    f2 = random_fourier_features(coords, 16, sigma=10.0, generator=torch.Generator().manual_seed(0))
    assert f1.shape == (10, 16)
    torch.testing.assert_close(f1, f2)  # a seeded generator fixes B
    torch.testing.assert_close(f1[:, :8] ** 2 + f1[:, 8:] ** 2, torch.ones(10, 8))
    with pytest.raises(ValueError, match="even"):
        random_fourier_features(coords, 7, 1.0)
