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

import dataclasses
import random
from typing import ClassVar

import torch
from torch import Tensor

from ..errors import DataError
from ..tokens.graph import GraphBatch, collate_graphs
from .spec import DataSpec, register_data

__all__ = ["marked_distance_graph", "marked_distance_set", "MarkedDistanceGraphs", "MarkedDistance"]


def _networkx():
    try:
        import networkx as nx
    except ImportError:
        raise DataError("the graph recipe generates graphs with networkx: pip install networkx") from None
    return nx


def marked_distance_graph(rng: random.Random, *, min_nodes: int = 8, max_nodes: int = 16, extra_edges: int = 3,
                          max_distance: int = 6) -> tuple[Tensor, list[tuple[int, int]], int]:
    """One example: ``(features (n, 2), edges, label)`` with label ``min(d(s, t), max_distance) − 1``."""
    networkx = _networkx()
    n = rng.randint(min_nodes, max_nodes)
    graph = networkx.random_labeled_tree(n, seed=rng.randrange(2**31)) if hasattr(networkx, "random_labeled_tree") \
        else networkx.random_tree(n, seed=rng.randrange(2**31))
    for _ in range(rng.randint(0, extra_edges)):
        node_a, node_b = rng.sample(range(n), 2)
        graph.add_edge(node_a, node_b)
    source, target = rng.sample(range(n), 2)
    distance = networkx.shortest_path_length(graph, source, target)
    x = torch.zeros(n, 2)
    x[:, 1] = 1.0
    x[[source, target], 0] = 1.0
    return x, [tuple(edge) for edge in graph.edges()], min(distance, max_distance) - 1


def marked_distance_set(count: int, seed: str | int, *, pe_dim: int = 8, max_distance: int = 6,
                        graph_max_distance: int = 8) -> tuple[GraphBatch, Tensor]:
    """``count`` examples from one seed, collated: ``(GraphBatch, labels (count,))``."""
    rng = random.Random(f"graphs-{seed}")
    examples = [marked_distance_graph(rng, max_distance=max_distance) for _ in range(count)]
    batch = collate_graphs([(x, edges) for x, edges, _ in examples], k=pe_dim, rw_steps=pe_dim,
                           max_distance=graph_max_distance)
    return batch, torch.tensor([y for _, _, y in examples])


class MarkedDistanceGraphs:
    """Batch source for the trainer: ``batch(i)`` is ``batch_size`` fresh graphs drawn from ``(seed, i)``."""

    def __init__(self, batch_size: int, seed: int = 0, *, pe_dim: int = 8, max_distance: int = 6,
                 graph_max_distance: int = 8):
        self.batch_size, self.seed = batch_size, seed
        self.kw = dict(pe_dim=pe_dim, max_distance=max_distance, graph_max_distance=graph_max_distance)

    def batch(self, index: int) -> tuple[GraphBatch, Tensor]:
        return marked_distance_set(self.batch_size, f"train-{self.seed}-{index}", **self.kw)


@register_data
@dataclasses.dataclass
class MarkedDistance(DataSpec):
    """The generated marked-distance task: graphs drawn from ``seed``; ``num_outputs`` distance classes
    (the last: at least that far); collated with ``pe_dim`` Laplacian / random-walk positions and hop
    distances capped at ``max_distance`` (the model's settings of the same names).

    Args:
        seed: draws the graphs (the training batches, the validation and the test graphs).
        pe_dim: Laplacian / random-walk position features per node.
        num_outputs: distance classes; the last means at least that many hops.
        max_distance: hop distances the attention bias tells apart (farther ones share the last).
        val_size: graphs in the validation set.
        test_size: graphs in the test set.
    """

    kind: ClassVar[str] = "marked-distance"
    legacy_recipes: ClassVar[tuple[str, ...]] = ("graph",)
    seed: int = 0
    pe_dim: int = 8
    num_outputs: int = 6
    max_distance: int = 8
    val_size: int = 500
    test_size: int = 2000

    def __post_init__(self):
        if self.test_size < 1 or self.val_size < 1:
            raise DataError(f"test_size and val_size must be >= 1, got {self.test_size} and {self.val_size}")

    @classmethod
    def from_legacy(cls, data, settings):
        return cls.from_settings(None, settings) if data in (None, "", "embedded") else None

    def _kw(self) -> dict:
        return dict(pe_dim=self.pe_dim, max_distance=self.num_outputs, graph_max_distance=self.max_distance)

    def train_source(self, batch_size: int) -> MarkedDistanceGraphs:
        return MarkedDistanceGraphs(batch_size, seed=self.seed, **self._kw())

    def val(self) -> tuple[GraphBatch, Tensor]:
        return marked_distance_set(self.val_size, f"val-{self.seed}", **self._kw())

    def held_out(self) -> tuple[GraphBatch, Tensor]:
        """The test graphs, collated, and their labels."""
        return marked_distance_set(self.test_size, f"test-{self.seed}", **self._kw())
