import math

import numpy as np
import pytest
import torch

from tokennet.position import SinusoidalPosition, sinusoidal_table


def numpy_reference(n, dim, base=10000.0):
    pe = np.zeros((n, dim))
    for i in range(n):
        for j in range(dim // 2):
            pe[i, 2 * j] = math.sin(i / base ** (2 * j / dim))
            pe[i, 2 * j + 1] = math.cos(i / base ** (2 * j / dim))
    return pe


def rotation(delta, dim, base=10000.0):
    """M_δ: block-diagonal 2×2 rotations with PE(i + δ) = M_δ PE(i)."""
    m = np.zeros((dim, dim))
    for j in range(dim // 2):
        a = delta / base ** (2 * j / dim)
        # (sin, cos)(ω(i+δ)) = [[cos ωδ, sin ωδ], [−sin ωδ, cos ωδ]] (sin, cos)(ωi)
        m[2 * j: 2 * j + 2, 2 * j: 2 * j + 2] = [[math.cos(a), math.sin(a)], [-math.sin(a), math.cos(a)]]
    return m


def test_matches_numpy_reference():
    pe = sinusoidal_table(50, 16, dtype=torch.float64)
    assert pe.shape == (50, 16) and pe.dtype == torch.float64
    np.testing.assert_allclose(pe.numpy(), numpy_reference(50, 16), atol=1e-12)
    small = sinusoidal_table(7, 6, base=100.0)
    np.testing.assert_allclose(small.numpy(), numpy_reference(7, 6, 100.0), atol=1e-6)


@pytest.mark.parametrize("delta", [1, 5, 17])
def test_shift_is_one_fixed_rotation(delta):
    dim, n = 16, 200
    pe = sinusoidal_table(n + delta, dim, dtype=torch.float64).numpy()
    m = rotation(delta, dim)
    # the same M maps every position i to i + δ
    np.testing.assert_allclose(pe[:-delta] @ m.T, pe[delta:], atol=1e-10)
    # M is orthogonal: a rotation, so it preserves ‖PE(i)‖ = √(D/2)
    np.testing.assert_allclose(m @ m.T, np.eye(dim), atol=1e-12)


@pytest.mark.parametrize("delta", [1, 3])
def test_least_squares_finds_one_linear_map(delta):
    # a small base keeps every frequency well resolved over n positions, so the fit is unique
    dim, n, base = 8, 64, 100.0
    pe = sinusoidal_table(n + delta, dim, base=base, dtype=torch.float64).numpy()
    x, y = pe[:-delta], pe[delta:]
    mt, *_ = np.linalg.lstsq(x, y, rcond=None)  # y ≈ x Mᵀ for all i at once
    np.testing.assert_allclose(x @ mt, y, atol=1e-9)
    np.testing.assert_allclose(mt.T, rotation(delta, dim, base), atol=1e-6)


def test_module_adds_with_offset_and_extends_past_max_len():
    torch.manual_seed(0)
    pos = SinusoidalPosition(8, max_len=32)
    x = torch.randn(2, 5, 8)
    table = sinusoidal_table(64, 8)
    torch.testing.assert_close(pos(x), x + table[:5])
    torch.testing.assert_close(pos(x, offset=10), x + table[10:15])
    torch.testing.assert_close(pos(x, offset=30), x + table[30:35])  # past max_len: computed on the fly
    torch.testing.assert_close(pos(x, offset=3)[:, 1:], pos(x[:, 1:], offset=4))


def test_buffer_is_not_saved():
    pos = SinusoidalPosition(8, max_len=16)
    assert "pe" not in pos.state_dict()
    assert pos.pe.shape == (16, 8)


def test_bad_input():
    with pytest.raises(ValueError, match="even"):
        sinusoidal_table(4, 7)
    with pytest.raises(ValueError, match="even"):
        SinusoidalPosition(5)
    with pytest.raises(ValueError, match=r"\(B, N, 8\)"):
        SinusoidalPosition(8)(torch.zeros(2, 3, 6))
    with pytest.raises(ValueError, match="offset"):
        SinusoidalPosition(8)(torch.zeros(2, 3, 8), offset=-1)
