"""Graph transformer: a permutation of the nodes permutes node outputs and leaves the readout unchanged;
structure reaches attention through positions, the adjacency mask or the distance bias."""

import pytest
import torch

from tokennet.models import create_model
from tokennet.tokens.graph import GraphBatch, collate_graphs

pytestmark = pytest.mark.usefixtures("one_thread")

GRAPHS = [(torch.randn(7, 3, generator=torch.Generator().manual_seed(1)), [(0, 1), (1, 2), (2, 3), (3, 4), (4, 0),
                                                                          (2, 5), (5, 6)]),
          (torch.randn(5, 3, generator=torch.Generator().manual_seed(2)), [(0, 1), (1, 2), (3, 4)])]  # disconnected


def _relabel(graphs, perms):
    out = []
    for (x, edges), p in zip(graphs, perms, strict=True):
        inv = torch.empty_like(p)
        inv[p] = torch.arange(len(p))  # old node i is new node inv[i]
        out.append((x[p], [(int(inv[i]), int(inv[j])) for i, j in edges]))
    return out


@pytest.mark.parametrize("attention, position", [("full", "none"), ("full", "random-walk"), ("adjacency", "none"),
                                                 ("distance-bias", "none"), ("distance-bias", "random-walk")])
def test_relabelling_the_nodes_permutes_outputs_and_keeps_the_readout(attention, position):
    torch.manual_seed(0)
    m = create_model("graph-micro", node_features=3, attention=attention, position=position).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.3)  # the distance bias starts at zero: make every part count
    perms = [torch.randperm(7), torch.randperm(5)]
    a = collate_graphs(GRAPHS, k=4, rw_steps=4, max_distance=4)
    b = collate_graphs(_relabel(GRAPHS, perms), k=4, rw_steps=4, max_distance=4)
    with torch.no_grad():
        ha, hb = m.forward_features(a), m.forward_features(b)
        for g, p in enumerate(perms):
            n = len(p)
            torch.testing.assert_close(hb[g, :n], ha[g, p], atol=1e-5, rtol=1e-5)  # equivariant
        torch.testing.assert_close(m(b).logits, m(a).logits, atol=1e-5, rtol=1e-5)  # invariant readout


def test_laplacian_variant_is_equivariant_given_the_permuted_eigenvectors():
    """Eigenvectors are defined up to sign: relabelling recomputes them, so the property holds for the
    same eigenvectors permuted (what the sign flips in training teach the model to ignore)."""
    m = create_model("graph-micro", node_features=3, position="laplacian").eval()
    a = collate_graphs(GRAPHS, k=4, rw_steps=4, max_distance=4)
    p = torch.randperm(a.x.shape[1])
    b = GraphBatch(a.x[:, p], a.node_mask[:, p], a.adj[:, p][:, :, p], a.dist[:, p][:, :, p], a.lap[:, p], a.rw[:, p])
    with torch.no_grad():
        torch.testing.assert_close(m(b).logits, m(a).logits, atol=1e-5, rtol=1e-5)


def test_structure_reaches_attention():
    m = create_model("graph-micro", node_features=3, attention="adjacency", position="none").eval()
    g = collate_graphs(GRAPHS, k=4, rw_steps=4, max_distance=4)
    a = m.attention_maps(g)["self"][0]  # (B, H, N, N)
    allowed = g.adj | torch.eye(7, dtype=torch.bool)
    assert (a[1, :, :5, :5][:, ~allowed[1, :5, :5]] == 0).all()  # only neighbours (and itself)
    assert (a[1, :, :, 5:] == 0).all()  # never the padding nodes
    torch.testing.assert_close(a[0].sum(-1), torch.ones(2, 7))
    full = create_model("graph-micro", node_features=3, attention="full", position="none").eval()
    f = full.attention_maps(g)["self"][0]
    assert (f[0, :, :, :7] > 0).all()  # a set model spreads over every node


def test_regression_head_uses_l1():
    m = create_model("graph-micro", node_features=3, task="regress", num_outputs=1)
    g = collate_graphs(GRAPHS, k=4, rw_steps=4, max_distance=4)
    y = torch.tensor([[1.0], [-2.0]])
    out = m(g, y)
    torch.testing.assert_close(out.loss, (out.logits - y).abs().mean())


@pytest.mark.parametrize("attention", ["full", "adjacency"])
def test_spectral_kernel_positions_are_exactly_permutation_equivariant(attention):
    """The kernel V φ(Λ) Vᵀ does not depend on the eigenvectors' signs or bases, so relabelling the nodes
    (which recomputes them) permutes the outputs exactly — with every eigenvector kept (pe_dim ≥ n − 1)."""
    torch.manual_seed(0)
    m = create_model("graph-micro", node_features=3, attention=attention, position="spectral-kernel",
                     pe_dim=8).eval()
    perms = [torch.randperm(7), torch.randperm(5)]
    a = collate_graphs(GRAPHS, k=8, rw_steps=8, max_distance=4)
    b = collate_graphs(_relabel(GRAPHS, perms), k=8, rw_steps=8, max_distance=4)
    with torch.no_grad():
        ha, hb = m.forward_features(a), m.forward_features(b)
        for g, p in enumerate(perms):
            torch.testing.assert_close(hb[g, :len(p)], ha[g, p], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(m(b).logits, m(a).logits, atol=1e-4, rtol=1e-4)


def test_spectral_positions_need_no_eigenvectors_in_the_batch():
    """commute-time and spectral-kernel compute the eigenpairs from the adjacency: a batch collated with
    any k works, and the result does not depend on it."""
    for position in ("commute-time", "spectral-kernel"):
        torch.manual_seed(0)
        m = create_model("graph-micro", node_features=3, position=position, pe_dim=6).eval()
        with torch.no_grad():
            a = m(collate_graphs(GRAPHS, k=2, rw_steps=2, max_distance=4)).logits
            b = m(collate_graphs(GRAPHS, k=5, rw_steps=5, max_distance=4)).logits
        torch.testing.assert_close(a, b)
