import math

import pytest
import torch

from tokennet.position import LaplacianPosition, laplacian_eigenvectors


def cycle(n):
    a = torch.zeros(n, n, dtype=torch.float64)
    idx = torch.arange(n)
    a[idx, (idx + 1) % n] = 1
    a[(idx + 1) % n, idx] = 1
    return a


def random_graph(n, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(n, n, generator=g, dtype=torch.float64)
    a = torch.triu(w * (torch.rand(n, n, generator=g, dtype=torch.float64) < 0.5), 1)
    a = a + a.T
    idx = torch.arange(n - 1)
    a[idx, idx + 1] = a[idx + 1, idx] = 1.0  # a path keeps it connected
    return a


def laplacian(a, normalized):
    d = a.sum(-1)
    if normalized:
        s = d.rsqrt()
        return torch.eye(len(a), dtype=a.dtype) - s[:, None] * a * s[None, :]
    return torch.diag(d) - a


@pytest.mark.parametrize("normalized", [True, False])
def test_cycle_eigenvectors_are_fourier_modes(normalized):
    n, k = 12, 7
    vecs, vals = laplacian_eigenvectors(cycle(n), k, normalized, return_eigenvalues=True)
    assert vecs.shape == (n, k) and vals.shape == (k,)
    scale = 0.5 if normalized else 1.0  # the cycle is 2-regular: L_norm = (D − A) / 2
    j = torch.arange(n, dtype=torch.float64)
    for col in range(k):
        lam = vals[col].item()
        q = round(math.acos(1 - lam / (2 * scale)) * n / (2 * math.pi))  # λ = s(2 − 2cos(2πq/n))
        assert lam == pytest.approx(scale * (2 - 2 * math.cos(2 * math.pi * q / n)), abs=1e-10)
        basis = torch.stack([torch.cos(2 * math.pi * q * j / n), torch.sin(2 * math.pi * q * j / n)], dim=1)
        coef = torch.linalg.lstsq(basis, vecs[:, col:col + 1]).solution
        residual = vecs[:, col:col + 1] - basis @ coef
        assert residual.abs().max() < 1e-10
    # the first eigenvalues of C_12 are 0 (skipped), then pairs for q = 1, 2, 3, then q = 4
    assert [round(math.acos(1 - v / (2 * scale)) * n / (2 * math.pi)) for v in vals.tolist()] == [1, 1, 2, 2,
                                                                                                   3, 3, 4]


@pytest.mark.parametrize("normalized", [True, False])
def test_ordered_orthonormal_and_trivial_skipped(normalized):
    a = random_graph(10, seed=1)
    vecs, vals = laplacian_eigenvectors(a, 4, normalized, return_eigenvalues=True)
    lap = laplacian(a, normalized)
    torch.testing.assert_close(lap @ vecs, vecs * vals)  # eigenpairs
    assert (vals[1:] >= vals[:-1]).all() and vals[0] > 1e-6  # ascending, λ = 0 skipped
    torch.testing.assert_close(vecs.T @ vecs, torch.eye(4, dtype=torch.float64))
    trivial = a.sum(-1).sqrt() if normalized else torch.ones(10, dtype=torch.float64)
    assert (trivial @ vecs).abs().max() < 1e-10  # orthogonal to the trivial eigenvector
    all_vals = torch.linalg.eigvalsh(lap)
    torch.testing.assert_close(vals, all_vals[1:5])


def test_batched_matches_single_up_to_sign_and_pads():
    a = torch.stack([random_graph(8, seed=s) for s in range(3)])
    batched = laplacian_eigenvectors(a, 3)
    assert batched.shape == (3, 8, 3)
    for b in range(3):
        single = laplacian_eigenvectors(a[b], 3)
        sign = torch.sign((single * batched[b]).sum(0))
        torch.testing.assert_close(batched[b] * sign, single)
    small = laplacian_eigenvectors(cycle(3).float(), 5)  # 3 nodes: only 2 non-trivial eigenvectors
    assert small.shape == (3, 5) and small.dtype == torch.float32
    assert torch.equal(small[:, 2:], torch.zeros(3, 3)) and small[:, :2].abs().sum() > 0


def test_bool_adjacency_and_isolated_node():
    a = cycle(5) > 0
    a = torch.block_diag(a, torch.zeros(1, 1, dtype=torch.bool))  # node 5 is isolated
    vecs = laplacian_eigenvectors(a, 3)
    assert vecs.dtype == torch.float32 and torch.isfinite(vecs).all()


def test_bad_input():
    with pytest.raises(ValueError, match="square"):
        laplacian_eigenvectors(torch.zeros(3, 4), 2)
    with pytest.raises(ValueError, match="symmetric"):
        laplacian_eigenvectors(torch.triu(torch.ones(4, 4), 1), 2)
    with pytest.raises(ValueError, match="k must"):
        laplacian_eigenvectors(cycle(4), 0)
    with pytest.raises(ValueError, match=r"\(\.\.\., n, 4\)"):
        LaplacianPosition(4, 8)(torch.zeros(5, 3))


def test_random_sign_flip_in_training_only():
    torch.manual_seed(0)
    pos = LaplacianPosition(4, 4)
    with torch.no_grad():  # identity map, so the output shows the flipped eigenvectors
        pos.proj.weight.copy_(torch.eye(4))
        pos.proj.bias.zero_()
    vecs = torch.stack([laplacian_eigenvectors(cycle(9).float(), 4)] * 16)  # (16 graphs, n, k)
    pos.eval()
    torch.testing.assert_close(pos(vecs), vecs)
    pos.train()
    out = pos(vecs)
    assert out.shape == (16, 9, 4)
    sign = (out * vecs).sum(-2)  # (16, k): ±1 per graph and eigenvector
    torch.testing.assert_close(sign.abs(), torch.ones(16, 4))
    torch.testing.assert_close(out, vecs * sign[:, None, :])  # one sign for the whole eigenvector
    assert (sign > 0).any() and (sign < 0).any()
    assert not torch.equal(sign[0], sign[1]) or not torch.equal(sign[0], sign[2])  # drawn per graph
