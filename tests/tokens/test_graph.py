"""Graph tokens: hygiene, shortest paths and random walks against networkx, per-graph Laplacian positions."""

import networkx as nx
import pytest
import torch

from tokennet.errors import DataError
from tokennet.position.laplacian import laplacian_eigenvectors
from tokennet.tokens.graph import check_graph, collate_graphs, random_walk_encoding, shortest_path_lengths

pytestmark = pytest.mark.usefixtures("one_thread")


def test_bad_graphs_are_one_clear_error():
    with pytest.raises(DataError, match="n >= 1"):
        check_graph(torch.zeros(0, 3), [])
    with pytest.raises(DataError, match=r"edge \(0, 5\) points at a node that does not exist"):
        check_graph(torch.zeros(3, 1), [(0, 1), (0, 5)])
    with pytest.raises(DataError, match="NaN"):
        check_graph(torch.tensor([[0.0], [float("nan")]]), [(0, 1)])
    with pytest.raises(DataError, match="different node-feature widths"):
        collate_graphs([(torch.zeros(2, 1), [(0, 1)]), (torch.zeros(2, 3), [(0, 1)])])
    with pytest.raises(DataError, match="no graphs"):
        collate_graphs([])


def test_self_loops_dropped_edges_undirected_and_once():
    x, e = check_graph(torch.zeros(3, 1), [(0, 0), (1, 0), (0, 1), (2, 1)])
    assert e.tolist() == [[0, 1], [1, 2]]
    g = collate_graphs([(x, [(0, 0), (1, 0), (2, 1)])], k=2)
    assert torch.equal(g.adj[0], g.adj[0].T) and not g.adj[0].diagonal().any()


def test_shortest_paths_equal_networkx_with_unreachable_and_padding_capped():
    rnd = torch.Generator().manual_seed(0)
    graphs = []
    for n in (7, 12, 5):
        g = nx.gnp_random_graph(n, 0.25, seed=n)  # may be disconnected
        graphs.append((torch.randn(n, 2, generator=rnd), list(g.edges()), g))
    batch = collate_graphs([(x, e) for x, e, _ in graphs], k=3, max_distance=4)
    for b, (_, _, g) in enumerate(graphs):
        n = g.number_of_nodes()
        lengths = dict(nx.all_pairs_shortest_path_length(g))
        want = torch.tensor([[min(lengths[i].get(j, 99), 5) for j in range(n)] for i in range(n)])
        assert torch.equal(batch.dist[b, :n, :n], want)
        assert (batch.dist[b, n:] == 5).all() and (batch.dist[b, :, n:] == 5).all()  # padding: the far bucket
    assert batch.node_mask.sum(1).tolist() == [7, 12, 5] and batch.x.shape == (3, 12, 2)


def test_laplacian_positions_are_each_graphs_own():
    """Padding must not change a graph's eigenvectors: they equal the graph's alone (up to sign)."""
    cycle = [(i, (i + 1) % 6) for i in range(6)]
    big = [(i, i + 1) for i in range(9)]
    batch = collate_graphs([(torch.ones(6, 1), cycle), (torch.ones(10, 1), big)], k=3)
    adj = torch.zeros(6, 6)
    for i, j in cycle:
        adj[i, j] = adj[j, i] = 1
    alone = laplacian_eigenvectors(adj, 3)
    got = batch.lap[0, :6]
    # eigenvectors are defined up to sign (and rotation within a repeated eigenvalue): compare projectors
    torch.testing.assert_close(got @ got.T, alone @ alone.T, atol=1e-5, rtol=0)
    assert (batch.lap[0, 6:] == 0).all()


def test_random_walk_encoding_is_the_return_probability():
    # A path 0-1-2: from the middle a 2-step walk always returns; from an end only if the middle steps back (1/2).
    adj = torch.tensor([[[0, 1, 0], [1, 0, 1], [0, 1, 0]]], dtype=torch.bool)
    rw = random_walk_encoding(adj, 3)[0]  # (3, 3)
    torch.testing.assert_close(rw[:, 0], torch.zeros(3))  # no self-loops: 1 step never returns
    torch.testing.assert_close(rw[:, 1], torch.tensor([0.5, 1.0, 0.5]))
    torch.testing.assert_close(rw[:, 2], torch.zeros(3))  # bipartite: odd walks never return
    assert shortest_path_lengths(adj, 3)[0].tolist() == [[0, 1, 2], [1, 0, 1], [2, 1, 0]]
