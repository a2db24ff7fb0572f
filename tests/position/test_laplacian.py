import math

import pytest
import torch

from tokennet.position import (
    CommuteTimePosition,
    LaplacianPosition,
    SpectralKernelBias,
    laplacian_eigenvectors,
    laplacian_spectrum,
)


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


# -- the padded batch spectrum, commute-time positions, the spectral kernel ---------------------------

def _tree_adj(n, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.zeros(n, n)
    for i in range(1, n):
        j = int(torch.randint(i, (1,), generator=g))
        a[i, j] = a[j, i] = 1
    return a


def _padded(adjs):
    N = max(len(a) for a in adjs)
    out, mask = torch.zeros(len(adjs), N, N), torch.zeros(len(adjs), N, dtype=torch.bool)
    for b, a in enumerate(adjs):
        out[b, :len(a), :len(a)], mask[b, :len(a)] = a, True
    return out, mask


@pytest.mark.parametrize("normalized", [True, False])
def test_padded_spectrum_is_each_graphs_own(normalized):
    adjs = [_tree_adj(5, 0), _tree_adj(9, 1), cycle(7).float()]
    adj, mask = _padded(adjs)
    vecs, vals = laplacian_spectrum(adj, mask, 6, normalized)
    assert vecs.shape == (3, 9, 6) and vals.shape == (3, 6)
    for b, a in enumerate(adjs):
        n = len(a)
        want_v, want_l = laplacian_eigenvectors(a.double(), 6, normalized, return_eigenvalues=True)
        m = min(6, n - 1)
        torch.testing.assert_close(vals[b, :m].double(), want_l[:m], atol=1e-5, rtol=0)
        # up to sign and rotation within repeated eigenvalues: the projectors onto the whole first m agree
        # when λ_m < λ_{m+1}; compare eigenpairs instead (L u = λ u on the graph's own block)
        lap = laplacian(a.double(), normalized)
        u = vecs[b, :n, :m].double()
        torch.testing.assert_close(lap @ u, u * vals[b, :m].double(), atol=1e-5, rtol=0)
        assert (vecs[b, n:] == 0).all() and (vecs[b, :, m:] == 0).all() and (vals[b, m:] == 0).all()


def test_commute_time_distances_are_tree_distances():
    """‖p_i − p_j‖² with every eigenvector is the effective resistance: on a tree, the hop distance."""
    import networkx as nx

    a = _tree_adj(10, 3)
    vecs, vals = laplacian_spectrum(a[None], torch.ones(1, 10, dtype=torch.bool), 9, normalized=False)
    p = CommuteTimePosition.embedding(vecs[0].double(), vals[0].double())  # (n, k)
    d2 = torch.cdist(p, p) ** 2
    g = nx.from_numpy_array(a.numpy())
    hops = torch.tensor([[nx.shortest_path_length(g, i, j) for j in range(10)] for i in range(10)],
                        dtype=torch.float64)
    torch.testing.assert_close(d2, hops, atol=1e-4, rtol=0)
    pos = CommuteTimePosition(9, 16)
    assert pos(vecs, vals).shape == (1, 10, 16)
    with pytest.raises(ValueError, match="expected eigvecs"):
        pos(vecs[..., :4], vals)


def test_spectral_kernel_is_the_plain_sum_and_sign_and_basis_invariant():
    torch.manual_seed(0)
    kern = SpectralKernelBias(num_heads=3, dim=8, channels=4, hidden=16)
    a = cycle(8).float()  # repeated eigenvalues: a basis rotation inside each pair is allowed
    vecs, vals = laplacian_spectrum(a[None], torch.ones(1, 8, dtype=torch.bool), 7, normalized=False)
    K = kern.kernels(vecs, vals)  # (1, N, N, M)
    w = kern.phi(vals[0, :, None])  # (k, M)
    plain = sum(w[k, None, None, :] * vecs[0, :, k, None, None] * vecs[0, None, :, k, None] for k in range(7))
    torch.testing.assert_close(K[0], plain, atol=1e-5, rtol=1e-5)
    sign = torch.tensor([1.0, -1, -1, 1, -1, 1, -1])
    node, bias = kern(vecs, vals)
    node_f, bias_f = kern(vecs * sign, vals)
    torch.testing.assert_close(bias_f, bias, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(node_f, node, atol=1e-5, rtol=1e-5)
    # rotate the basis of the first eigenvalue pair (λ_1 = λ_2 on the cycle)
    assert vals[0, 0] == pytest.approx(float(vals[0, 1]), abs=1e-5)
    c, s = math.cos(0.7), math.sin(0.7)
    rot = vecs.clone()
    rot[0, :, 0], rot[0, :, 1] = c * vecs[0, :, 0] - s * vecs[0, :, 1], s * vecs[0, :, 0] + c * vecs[0, :, 1]
    torch.testing.assert_close(kern(rot, vals)[1], bias, atol=1e-5, rtol=1e-5)
    assert bias.shape == (1, 3, 8, 8) and node.shape == (1, 8, 8)
