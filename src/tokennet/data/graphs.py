"""A generated graph task where structure decides the answer: how far apart are the two marked nodes?

Each example is a random connected graph (a random tree on 8–16 nodes plus a few extra edges, built with
networkx) with two marked nodes ``s`` and ``t``. Node features say only *which* nodes are marked
(``[is_marked, 1]``), so they are the same for every graph of the same size: the label, the
shortest-path distance ``d(s, t)`` (classes 1, 2, …, ``max_distance`` with the last one meaning "at
least that far"), can only be read from the structure. A pure set model (attention over node tokens
with no positions, mask or bias) cannot do better than guessing from the graph's size; Laplacian
positions, an adjacency mask or a distance bias give the structure back.

Batches are drawn from the seed ``(seed, index)`` alone, so a resumed run sees exactly the batches an
uninterrupted one would, and the test graphs come from a separate seed space.
"""

from __future__ import annotations

import random

import torch
from torch import Tensor

from ..errors import DataError
from ..tokens.graph import GraphBatch, collate_graphs

__all__ = ["marked_distance_graph", "marked_distance_set", "MarkedDistanceGraphs"]


def _networkx():
    try:
        import networkx as nx
    except ImportError:
        raise DataError("the graph recipe generates graphs with networkx: pip install networkx") from None
    return nx


def marked_distance_graph(rng: random.Random, *, min_nodes: int = 8, max_nodes: int = 16, extra_edges: int = 3,
                          max_distance: int = 6) -> tuple[Tensor, list[tuple[int, int]], int]:
    """One example: ``(features (n, 2), edges, label)`` with label ``min(d(s, t), max_distance) − 1``."""
    nx = _networkx()
    n = rng.randint(min_nodes, max_nodes)
    g = nx.random_labeled_tree(n, seed=rng.randrange(2**31)) if hasattr(nx, "random_labeled_tree") \
        else nx.random_tree(n, seed=rng.randrange(2**31))
    for _ in range(rng.randint(0, extra_edges)):
        a, b = rng.sample(range(n), 2)
        g.add_edge(a, b)
    s, t = rng.sample(range(n), 2)
    d = nx.shortest_path_length(g, s, t)
    x = torch.zeros(n, 2)
    x[:, 1] = 1.0
    x[[s, t], 0] = 1.0
    return x, [tuple(e) for e in g.edges()], min(d, max_distance) - 1


def marked_distance_set(count: int, seed: str | int, *, pe_dim: int = 8, max_distance: int = 6,
                        graph_max_distance: int = 8) -> tuple[GraphBatch, Tensor]:
    """``count`` examples from one seed, collated: ``(GraphBatch, labels (count,))``."""
    rng = random.Random(f"graphs-{seed}")
    ex = [marked_distance_graph(rng, max_distance=max_distance) for _ in range(count)]
    batch = collate_graphs([(x, e) for x, e, _ in ex], k=pe_dim, rw_steps=pe_dim, max_distance=graph_max_distance)
    return batch, torch.tensor([y for _, _, y in ex])


class MarkedDistanceGraphs:
    """Batch source for the trainer: ``batch(i)`` is ``batch_size`` fresh graphs drawn from ``(seed, i)``."""

    def __init__(self, batch_size: int, seed: int = 0, *, pe_dim: int = 8, max_distance: int = 6,
                 graph_max_distance: int = 8):
        self.batch_size, self.seed = batch_size, seed
        self.kw = dict(pe_dim=pe_dim, max_distance=max_distance, graph_max_distance=graph_max_distance)

    def batch(self, index: int) -> tuple[GraphBatch, Tensor]:
        return marked_distance_set(self.batch_size, f"train-{self.seed}-{index}", **self.kw)
