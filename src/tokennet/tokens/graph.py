"""Graphs as tokens: each node is a token, the graph's structure comes in as positions, masks or biases.

A graph ``G = (V, E)`` with node features ``x_i`` becomes a token matrix ``T = [x_1 W; …; x_n W]``:
attention over it is a *set* model (permuting the nodes permutes the outputs), blind to which nodes are
connected. Structure enters in one of three ways, each a module elsewhere in tokennet:

- **positions**: the k smallest non-trivial Laplacian eigenvectors of each graph
  (:func:`~tokennet.position.laplacian.laplacian_eigenvectors`, Dwivedi et al. 2020), or random-walk
  return probabilities ``[(D⁻¹A)^t]_ii`` for t = 1..K (Dwivedi et al. 2022,
  https://arxiv.org/abs/2110.07875), added to the node tokens;
- **a mask**: node i attends only to its neighbours and itself (:func:`~tokennet.attention.masks.adjacency`);
- **a bias**: a learned scalar per head and shortest-path distance added to the scores,
  ``A = softmax(Q Kᵀ/√E + b[φ(i, j)])`` (Graphormer, Ying et al. 2021, https://arxiv.org/abs/2106.05234).

:func:`collate_graphs` pads many small graphs into one batch ``(B, N, ·)`` with a node mask, so the
model's forward pass has no Python loop over graphs or nodes; the per-graph work (eigenvectors,
shortest paths) happens once, here, when the batch is made.

Graph hygiene (stated, tested): edges are undirected (``(i, j)`` also gives ``(j, i)``); self-loops are
dropped (a node always attends to itself anyway); duplicate edges count once; disconnected graphs are
fine (unreachable pairs get the distance bucket ``max_distance + 1``); a graph with no nodes, an edge to
a missing node, a NaN feature, or more than :data:`MAX_GRAPH_NODES` nodes or :data:`MAX_GRAPH_EDGES` edges is a
:class:`~tokennet.errors.DataError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..errors import DataError
from ..position.laplacian import laplacian_eigenvectors

__all__ = ["Graph", "GraphBatch", "check_graph", "collate_graphs", "shortest_path_lengths", "random_walk_encoding",
           "MAX_GRAPH_NODES", "MAX_GRAPH_EDGES", "MAX_NODE_PAIRS", "graph_size_problem",
           "length"]

# The graph models have no table of positions to outgrow (a node's position is k Laplacian eigenvector entries or K
# random-walk probabilities, distances share max_distance + 2 buckets), so what bounds a graph is the dense work per
# graph: collating computes an n × n eigendecomposition and max_distance + K products of n × n matrices (O(n³)), and
# attention holds an n × n score matrix per head and layer. At 512 nodes that is a fraction of a second on one core
# and a few MB; at 2,000 nodes 12 s, at 20,000 hours and gigabytes. The models are trained on graphs of 8-16 nodes
# (marked distance) and molecules of at most 29 atoms (QM9), so 512 leaves a wide margin for real inputs.
MAX_GRAPH_NODES = 512
MAX_GRAPH_EDGES = MAX_GRAPH_NODES * (MAX_GRAPH_NODES - 1)  # every pair of a complete graph, listed both ways
# One request (a file of graphs, a list given to run.predict): at most this many node pairs Σ n² over its graphs — 64
# graphs of 512 nodes (seconds), or some 20,000 molecules of 29 atoms.
MAX_NODE_PAIRS = 2**24


@dataclass
class Graph:
    """One graph: node features ``x`` ``(n, F)`` and edges ``(E, 2)`` (node indices, undirected)."""

    x: Tensor
    edges: Tensor


@dataclass
class GraphBatch:
    """Padded graphs, ready for a transformer over nodes.

    Attributes:
        x: node features ``(B, N, F)``, zeros at padding.
        node_mask: ``(B, N)``, True at real nodes.
        adj: adjacency ``(B, N, N)`` bool, symmetric, no self-loops.
        dist: shortest-path lengths ``(B, N, N)`` long; ``max_distance + 1`` for farther or unreachable
            pairs and for padding.
        lap: Laplacian eigenvectors ``(B, N, k)`` (zeros at padding and beyond a small graph's n − 1).
        rw: random-walk encoding ``(B, N, K)``.
        pos: 3-D coordinates ``(B, N, 3)`` where the graph has a geometry (molecules), else None.
    """

    x: Tensor
    node_mask: Tensor
    adj: Tensor
    dist: Tensor
    lap: Tensor
    rw: Tensor
    pos: Tensor | None = None

    _FIELDS = ("x", "node_mask", "adj", "dist", "lap", "rw", "pos")

    def _map(self, fn) -> GraphBatch:
        return GraphBatch(*(None if getattr(self, name) is None else fn(getattr(self, name)) for name in self._FIELDS))

    def to(self, device) -> GraphBatch:
        return self._map(lambda t: t.to(device))

    @property
    def batch_size(self) -> int:
        return self.x.shape[0]

    def __len__(self) -> int:
        return self.batch_size

    def select(self, index: Tensor) -> GraphBatch:
        """The graphs at ``index`` (a permutation of the batch, a subset, a repeat)."""
        return self._map(lambda t: t[index])


def length(value) -> int:
    """``len(value)`` of a graph's nodes or edges; 0 where it has none (a scalar: :func:`check_graph` refuses it)."""
    try:
        return len(value)
    except TypeError:
        return 0


def graph_size_problem(num_nodes: int, num_edges: int) -> str | None:
    """Why a graph of this size is refused (past :data:`MAX_GRAPH_NODES` or :data:`MAX_GRAPH_EDGES`), or None;
    asked before its features and edges become tensors."""
    if num_nodes > MAX_GRAPH_NODES:
        return f"it has {num_nodes:,} nodes; a graph may have at most {MAX_GRAPH_NODES} (MAX_GRAPH_NODES)"
    if num_edges > MAX_GRAPH_EDGES:
        return f"it has {num_edges:,} edges; a graph may have at most {MAX_GRAPH_EDGES:,} (MAX_GRAPH_EDGES)"
    return None


def check_graph(x, edges) -> tuple[Tensor, Tensor]:
    """Validate one graph; return float features ``(n, F)`` and clean undirected edges ``(E', 2)`` (i < j)."""
    too_big = graph_size_problem(length(x), length(edges))
    if too_big:
        raise DataError(f"a graph is too large: {too_big}")
    x = torch.as_tensor(x, dtype=torch.float32)
    if x.dim() == 1:
        x = x[:, None]
    if x.dim() != 2 or x.shape[0] == 0:
        raise DataError(f"a graph needs node features of shape (n >= 1, F), got {tuple(x.shape)}")
    if not torch.isfinite(x).all():
        raise DataError("node features contain NaN or infinity")
    n = x.shape[0]
    pairs = (torch.as_tensor(edges, dtype=torch.long).reshape(-1, 2) if len(edges)
             else torch.zeros(0, 2, dtype=torch.long))
    if pairs.numel() and (pairs.min() < 0 or pairs.max() >= n):
        bad = pairs[(pairs < 0).any(1) | (pairs >= n).any(1)][0].tolist()
        raise DataError(f"edge {tuple(bad)} points at a node that does not exist (the graph has nodes 0..{n - 1})")
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]  # self-loops dropped: every node attends to itself anyway
    pairs = torch.unique(torch.sort(pairs, dim=1).values, dim=0)  # undirected, each edge once
    return x, pairs


def shortest_path_lengths(adj: Tensor, max_distance: int) -> Tensor:
    """Hop distances ``(B, N, N)`` by breadth-first search as boolean matrix powers, capped at
    ``max_distance + 1`` (which also marks unreachable pairs).

    Computed with numpy: these are many tiny matrices, where a multi-threaded kernel's start-up costs
    more than the product (and a data loader should not compete with training for threads).
    """
    adjacency = adj.cpu().numpy().astype(np.float32)
    B, N, _ = adjacency.shape
    far = max_distance + 1
    dist = np.full((B, N, N), far, dtype=np.int64)
    reach = np.broadcast_to(np.eye(N, dtype=bool), (B, N, N)).copy()
    dist[reach] = 0
    frontier = reach.astype(np.float32)
    for distance in range(1, max_distance + 1):
        walk = (frontier @ adjacency) > 0  # ends of walks of length d
        new = walk & ~reach
        if not new.any():
            break
        dist[new] = distance
        reach |= new
        frontier = walk.astype(np.float32)
    return torch.from_numpy(dist).to(adj.device)


def random_walk_encoding(adj: Tensor, steps: int) -> Tensor:
    """``RW_i = [M_ii, (M²)_ii, …, (M^K)_ii]`` with ``M = D⁻¹ A``: how likely a walk returns to i. ``(B, N, K)``."""
    adjacency = adj.cpu().numpy().astype(np.float32)
    m = adjacency / np.maximum(adjacency.sum(-1, keepdims=True), 1)  # isolated (and padding) nodes: a zero row
    out, power = [], m
    for _ in range(steps):
        out.append(np.diagonal(power, axis1=-2, axis2=-1))
        power = power @ m
    return torch.from_numpy(np.stack(out, axis=-1)).to(adj.device)


def collate_graphs(graphs: Sequence[Graph | tuple], *, k: int = 8, rw_steps: int = 8,
                   max_distance: int = 8) -> GraphBatch:
    """Pad graphs into one :class:`GraphBatch` and compute each one's structural encodings.

    Args:
        graphs: :class:`Graph` objects or ``(x, edges)`` pairs.
        k: Laplacian eigenvectors per node (zero-padded for graphs with ≤ k nodes).
        rw_steps: random-walk steps K.
        max_distance: largest shortest-path distance kept apart; farther and unreachable pairs share a bucket.
    """
    if not graphs:
        raise DataError("no graphs to batch")
    checked = [check_graph(*((graph.x, graph.edges) if isinstance(graph, Graph) else graph)) for graph in graphs]
    F = checked[0][0].shape[1]
    if any(x.shape[1] != F for x, _ in checked):
        raise DataError(f"graphs have different node-feature widths: {sorted({x.shape[1] for x, _ in checked})}")
    B, N = len(checked), max(x.shape[0] for x, _ in checked)
    x = torch.zeros(B, N, F)
    node_mask = torch.zeros(B, N, dtype=torch.bool)
    adj = torch.zeros(B, N, N, dtype=torch.bool)
    lap = torch.zeros(B, N, k)
    by_size: dict[int, list[int]] = {}
    for row, (features, edge_pairs) in enumerate(checked):
        n = features.shape[0]
        x[row, :n], node_mask[row, :n] = features, True
        if edge_pairs.numel():
            adj[row, edge_pairs[:, 0], edge_pairs[:, 1]] = True
            adj[row, edge_pairs[:, 1], edge_pairs[:, 0]] = True
        by_size.setdefault(n, []).append(row)
    # Each graph on its own n × n Laplacian (padding nodes would add spurious eigenvalues), one batched
    # eigendecomposition per graph size.
    for n, rows in by_size.items():
        idx = torch.tensor(rows)
        lap[idx, :n] = laplacian_eigenvectors(adj[idx, :n, :n].float(), k)
    dist = shortest_path_lengths(adj, max_distance)
    dist = dist.masked_fill(~(node_mask[:, :, None] & node_mask[:, None, :]), max_distance + 1)
    return GraphBatch(x, node_mask, adj, dist, lap, random_walk_encoding(adj, rw_steps))
