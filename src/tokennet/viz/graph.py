"""``tokennet viz`` for graph runs: one node's attention over the graph, and the Laplacian positions.

- ``node_attention.png``: the graph (a seeded spring layout) with every node shaded by how much the
  query node attends to it (``A = softmax(Q Kᵀ/√E + structure)``, per layer, mean of heads), the query
  ringed, and the marked nodes of the task drawn as squares.
- ``laplacian_positions.png``: the first Laplacian eigenvectors as node colours — the graph's
  "sinusoids": the first varies slowly across the graph, later ones faster.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import DataError, RunError
from .attention_maps import select as _select

__all__ = ["graph_viz"]


def _layout(adj: torch.Tensor):
    import networkx as nx

    n = adj.shape[0]
    graph = nx.Graph()
    graph.add_nodes_from(range(n))
    graph.add_edges_from((int(i), int(j)) for i, j in adj.nonzero().tolist() if i < j)
    return graph, nx.spring_layout(graph, seed=0)


def _draw(ax, g, pos, values, *, query=None, marked=(), cmap="inferno", title=""):
    import networkx as nx

    nx.draw_networkx_edges(g, pos, ax=ax, edge_color="0.6", width=1.2)
    nodes = list(g.nodes)
    shapes = {"s": [i for i in nodes if i in marked], "o": [i for i in nodes if i not in marked]}
    vmax = float(max(values.abs().max(), 1e-12)) if cmap == "coolwarm" else float(max(values.max(), 1e-12))
    vmin = -vmax if cmap == "coolwarm" else 0.0
    for shape, which in shapes.items():
        if which:
            nx.draw_networkx_nodes(g, pos, nodelist=which, node_shape=shape, ax=ax, node_size=260,
                                   node_color=[float(values[i]) for i in which], cmap=cmap, vmin=vmin, vmax=vmax,
                                   edgecolors="0.2", linewidths=0.8)
    if query is not None:
        nx.draw_networkx_nodes(g, pos, nodelist=[query], ax=ax, node_size=520, node_color="none",
                               edgecolors="cyan", linewidths=2.5)
    nx.draw_networkx_labels(g, pos, ax=ax, font_size=7, font_color="white")
    ax.set_title(title, fontsize=9)
    ax.axis("off")


def graph_viz(run, out_dir: Path, *, index: int | None = None, patch: int | None = None, layer: int | None = None,
              head: int | None = None, **_) -> list[Path]:
    """Write ``node_attention.png`` and ``laplacian_positions.png`` for test graph ``index`` (default 0).

    Args:
        run: a loaded graph :class:`~tokennet.run.Run`.
        out_dir: where the PNGs go.
        index: which held-out test graph.
        patch: the query node (default: the first marked node, else node 0).
        layer: only this layer (default: all).
        head: only this head (default: the mean of heads).
    """
    from .attention_maps import _plt, _save

    config, spec = run.model.config, run.data
    if spec is None or not hasattr(spec, "held_out"):
        raise RunError(f"{run.path} has no run.json to say which graphs it was trained on")
    if spec.kind != "marked-distance":
        raise RunError(f"{run.path} was trained on {spec.kind} data: node attention is drawn for the generated "
                       "marked-distance graphs")
    index = 0 if index is None else index
    test, labels = spec.held_out()
    _select(len(labels), index, "index")
    one_graph = test.select(torch.tensor([index]))
    n = int(one_graph.node_mask.sum())
    marked = [int(i) for i in (one_graph.x[0, :n, 0] > 0).nonzero().flatten()]
    query = (marked[0] if marked else 0) if patch is None else patch
    if not 0 <= query < n:
        raise DataError(f"node {query} out of range: the graph has nodes 0..{n - 1}")
    with torch.no_grad():
        maps = run.attention_maps(one_graph.to(run.device))["self"]  # per layer (1, H, N, N)
        pred = int(run.model(one_graph.to(run.device)).logits.argmax(-1))
    layers = _select(len(maps), layer, "layer")
    heads = _select(maps[0].shape[1], head, "head")
    graph, pos = _layout(one_graph.adj[0, :n, :n])
    plt = _plt()
    fig, axes = plt.subplots(1, len(layers), figsize=(3.6 * len(layers), 3.6), squeeze=False)
    for ax, i in zip(axes[0], layers, strict=True):
        row = maps[i][0, heads, query, :n].float().mean(0).cpu()  # (n,)
        which = "mean of heads" if head is None else f"head {head}"
        _draw(ax, graph, pos, row, query=query, marked=marked, title=f"layer {i}, {which} (max {row.max():.2f})")
    fig.suptitle(f"test graph {index}: attention of node {query} (ringed); marked nodes are squares; "
                 f"distance class {int(labels[index]) + 1}, predicted {pred + 1}", fontsize=9)
    fig.tight_layout()
    files = [_save(fig, Path(out_dir) / "node_attention.png")]

    k = min(3, config.pe_dim, max(1, n - 1))
    fig, axes = plt.subplots(1, k, figsize=(3.4 * k, 3.4), squeeze=False)
    for j in range(k):
        _draw(axes[0][j], graph, pos, one_graph.lap[0, :n, j], marked=marked, cmap="coolwarm",
              title=f"Laplacian eigenvector {j + 1}")
    fig.suptitle(f"test graph {index}: Laplacian positions (sign arbitrary)", fontsize=9)
    fig.tight_layout()
    files.append(_save(fig, Path(out_dir) / "laplacian_positions.png"))
    return files

