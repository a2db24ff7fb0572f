import pytest
import torch

from tokennet.position import RotaryEmbedding, apply_rope


def test_score_depends_only_on_offset():
    torch.manual_seed(0)
    E, n = 16, 40
    cos, sin = RotaryEmbedding(E)(n, dtype=torch.float64)
    q, k = torch.randn(E, dtype=torch.float64), torch.randn(E, dtype=torch.float64)
    qs = apply_rope(q.expand(1, 1, n, E), cos, sin)[0, 0]  # (n, E): R_p q at every position p
    ks = apply_rope(k.expand(1, 1, n, E), cos, sin)[0, 0]
    scores = qs @ ks.T  # scores[i, j] = ⟨R_i q, R_j k⟩
    for i, j, s in [(3, 1, 5), (0, 7, 20), (10, 10, 29), (2, 30, 9)]:
        assert scores[i, j].item() == pytest.approx(scores[i + s, j + s].item(), abs=1e-10)
    assert scores[5, 5].item() == pytest.approx((q @ k).item(), abs=1e-10)  # no rotation at offset 0


def test_norm_preserved_and_matches_complex_rotation():
    torch.manual_seed(0)
    B, H, N, E = 2, 3, 7, 8
    x = torch.randn(B, H, N, E, dtype=torch.float64)
    cos, sin = RotaryEmbedding(E, base=100.0)(N, offset=4, dtype=torch.float64)
    y = apply_rope(x, cos, sin)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    # rotate_half pairs channel j with j + E/2: z_j = x_j + i x_(j+E/2) turns by e^(i p θ_j)
    theta = 100.0 ** (-torch.arange(0, E, 2, dtype=torch.float64) / E)
    pos = torch.arange(4, 4 + N, dtype=torch.float64)
    turn = torch.polar(torch.ones(N, E // 2, dtype=torch.float64), pos[:, None] * theta)  # e^(i p θ_j)
    z = torch.complex(x[..., : E // 2], x[..., E // 2:]) * turn
    torch.testing.assert_close(y, torch.cat([z.real, z.imag], dim=-1))


def test_offset_matches_slice_of_longer_table():
    rope = RotaryEmbedding(32)
    cos, sin = rope(50)
    assert cos.shape == sin.shape == (50, 32) and cos.dtype == torch.float32
    c2, s2 = rope(10, offset=35)
    torch.testing.assert_close(c2, cos[35:45])
    torch.testing.assert_close(s2, sin[35:45])
    ch, _ = rope(4, dtype=torch.bfloat16)
    assert ch.dtype == torch.bfloat16
    c64, s64 = rope(50, dtype=torch.float64)  # float64 tables agree with the float32 ones
    torch.testing.assert_close(c64.float(), cos, atol=1e-5, rtol=0)
    torch.testing.assert_close(s64.float(), sin, atol=1e-5, rtol=0)
    assert "inv_freq" not in rope.state_dict()


def test_bad_input():
    with pytest.raises(ValueError, match="even"):
        RotaryEmbedding(7)
    cos, sin = RotaryEmbedding(8)(5)
    with pytest.raises(ValueError, match="do not match"):
        apply_rope(torch.zeros(1, 2, 6, 8), cos, sin)
    with pytest.raises(ValueError, match="do not match"):
        apply_rope(torch.zeros(1, 2, 5, 16), cos, sin)
