"""The graph task: whole-graph prediction (a class, or values) from a graph transformer.

``tokennet generate RUN --input graphs.json`` (or ``--graphs``) reads graphs from a JSON file: one graph or a
list of them, each ``{"nodes": [[feature, ...], ...], "edges": [[i, j], ...]}`` (node indices from 0, undirected), plus
``"positions": [[x, y, z], ...]`` for a model that reads 3-D geometry (``attention=distance-3d``, the QM9
profile). It prints one line per graph: ``index<TAB>class<TAB>probability``, or ``index<TAB>value`` for a
regression model.

Bounded: a graph has at most ``MAX_GRAPH_NODES`` nodes and ``MAX_GRAPH_EDGES`` edges, a file or a list of graphs at
most ``MAX_NODE_PAIRS`` node pairs Σ n² (:mod:`tokennet.tokens.graph` says why), checked before any tensor is built;
the graphs are collated a few at a time, so one large graph does not pad a thousand small ones to its size.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .. import jsonio
from ..errors import DataError, RunError
from ..tokens.graph import MAX_NODE_PAIRS, Graph, GraphBatch, collate_graphs, graph_size_problem, length
from ..viz.explore.graphs import GraphExplorer
from .base import Input, Task, register_task, verb
from .example_files import Example, take, varied

if TYPE_CHECKING:
    from ..run import Run

__all__ = ["GraphPrediction", "read_graphs", "write_graphs"]


def read_graphs(path: str | Path, *, node_features: int, needs_positions: bool = False) -> list[dict[str, Any]]:
    """The graphs of a JSON file (see the module docstring), checked: a ``DataError`` naming the file and graph."""
    file = Path(path)
    if not file.is_file():
        raise DataError(f"graph file {file} does not exist")
    try:
        data = jsonio.load(file)  # nested too deep: a JSONTooDeep line naming the file
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as decode_err:  # RecursionError: nesting too deep
        raise DataError(f"{file} is not a JSON file of graphs ({decode_err})") from None
    graphs = [data] if isinstance(data, dict) else data
    if not isinstance(graphs, list) or not graphs:
        raise DataError(f"{file}: expected a graph object or a non-empty list of them")
    for i, graph in enumerate(graphs):
        if not isinstance(graph, dict) or "nodes" not in graph or "edges" not in graph:
            raise DataError(f"{file}: graph {i} must be an object with 'nodes' and 'edges'")
        if not isinstance(graph["nodes"], list) or not isinstance(graph["edges"], list):
            raise DataError(f"{file}: graph {i}: 'nodes' and 'edges' must be lists")
    check_sizes([(len(graph["nodes"]), len(graph["edges"])) for graph in graphs], str(file))
    out = []
    for i, graph in enumerate(graphs):
        try:
            x = torch.tensor(graph["nodes"], dtype=torch.float32)
            decode_err = torch.tensor(graph["edges"], dtype=torch.long).reshape(-1, 2)
            pos = torch.tensor(graph["positions"], dtype=torch.float32) if "positions" in graph else None
        except (TypeError, ValueError, RuntimeError) as err:
            raise DataError(f"{file}: graph {i} has malformed nodes, edges or positions ({err})") from None
        if x.dim() != 2 or x.shape[0] < 1 or x.shape[1] != node_features:
            raise DataError(f"{file}: graph {i}: nodes must be a list of {node_features} features per node, got shape "
                            f"{tuple(x.shape)}")
        if not torch.isfinite(x).all() or (pos is not None and not torch.isfinite(pos).all()):
            raise DataError(f"{file}: graph {i}: node features or positions contain NaN or infinity")
        if decode_err.numel() and (decode_err.min() < 0 or decode_err.max() >= len(x)):
            raise DataError(f"{file}: graph {i}: an edge names a node outside 0..{len(x) - 1}")
        if needs_positions and (pos is None or tuple(pos.shape) != (len(x), 3)):
            raise DataError(f"{file}: graph {i}: this model reads 3-D geometry: give 'positions', one [x, y, z] per "
                            "node")
        out.append({"x": x, "edges": decode_err, "pos": pos})
    return out


def check_sizes(sizes: Sequence[tuple[int, int]], where: str) -> None:
    """Refuse graphs of ``(nodes, edges)`` past the bounds of :mod:`tokennet.tokens.graph`: one ``DataError`` line
    naming ``where`` (a file), the graph and the bound."""
    for i, (n, num_edges) in enumerate(sizes):
        too_big = graph_size_problem(n, num_edges)
        if too_big:
            raise DataError(f"{where}: graph {i} is too large: {too_big}")
    pairs = sum(n * n for n, _ in sizes)
    if pairs > MAX_NODE_PAIRS:
        raise DataError(f"{where}: {len(sizes):,} graphs with {pairs:,} node pairs (the sum of n² over the graphs); "
                        f"at most {MAX_NODE_PAIRS:,} (MAX_NODE_PAIRS) are read at once: split them")


def _chunks(sizes: Sequence[int], cells: int = 2**21) -> Iterator[slice]:
    """Consecutive runs of graphs whose padded batch ``B · N²`` stays within ``cells`` (at least one graph each)."""
    start, widest = 0, 0
    for i, n in enumerate(sizes):
        widest = max(widest, n)
        if i > start and (i - start + 1) * widest**2 > cells:
            yield slice(start, i)
            start, widest = i, n
    yield slice(start, len(sizes))


def write_graphs(batch: GraphBatch, path: str | Path, items: Sequence[int] | None = None) -> Path:
    """Write the graphs ``items`` of a batch (default: all) in the file format :func:`read_graphs` reads."""
    graphs = []
    for item in range(len(batch.x)) if items is None else items:
        n = int(batch.node_mask[item].sum())
        i, j = torch.triu(batch.adj[item, :n, :n], diagonal=1).nonzero(as_tuple=True)
        graph = {"nodes": batch.x[item, :n].tolist(), "edges": torch.stack([i, j], 1).tolist()}
        if batch.pos is not None:
            graph["positions"] = batch.pos[item, :n].tolist()
        graphs.append(graph)
    Path(path).write_text(json.dumps(graphs))
    return Path(path)


@register_task
class GraphPrediction(Task):
    """A graph transformer: ``run.classify(graphs)`` → ``(class index, probability)`` per graph, and
    ``run.predict(graphs)`` → the raw outputs (a regression's values), where ``graphs`` is a
    :class:`~tokennet.tokens.graph.GraphBatch`, a list of ``(node features, edges)`` or a JSON file of graphs."""

    name = "graph prediction"
    columns = ("graph", "class", "probability")  # respond: one line per graph; a regression's: table_columns
    kind = "graph"
    families = ("graph",)
    viz_uses = ("index", "patch", "layer", "head")
    explorer = GraphExplorer
    inputs = (Input("graphs", "graph runs: JSON files of graphs ({\"nodes\": [[features]], \"edges\": [[i, j]]}, one "
                    "graph or a list per file)"),)

    def batches(self, run: Run, graphs) -> Iterator[GraphBatch]:
        """The graphs collated a few at a time (see the module docstring), after their sizes are checked."""
        if isinstance(graphs, GraphBatch):
            yield graphs
            return
        config = run.model.config
        collate_kwargs = dict(k=config.pe_dim, rw_steps=config.pe_dim, max_distance=config.max_distance)
        if isinstance(graphs, (str, Path)):
            read = read_graphs(graphs, node_features=config.node_features,
                               needs_positions=config.attention == "distance-3d")
        else:
            pairs = [(graph.x, graph.edges) if isinstance(graph, Graph) else tuple(graph) for graph in graphs]
            check_sizes([(length(x), length(edges)) for x, edges in pairs], "the graphs given")
            read = [{"x": x, "edges": edges, "pos": None} for x, edges in pairs]
        for part in _chunks([length(graph["x"]) for graph in read]):
            batch = collate_graphs([(graph["x"], graph["edges"]) for graph in read[part]], **collate_kwargs)
            if config.attention == "distance-3d" and all(graph["pos"] is not None for graph in read[part]):
                batch.pos = torch.zeros(len(batch.x), batch.x.shape[1], 3)
                for item, graph in enumerate(read[part]):
                    batch.pos[item, :len(graph["x"])] = graph["pos"]
            yield batch

    @verb
    @torch.no_grad()
    def predict(self, run: Run, graphs) -> torch.Tensor:
        """The model's raw outputs ``(B, K)`` for the graphs: class logits, or a regression's values in its units.
        ``tokennet generate --graphs`` prints the values of a regression, and a classifier's :meth:`classify`
        (``(class, probability)`` per graph, the softmax of these logits): this returns more than a classifier's
        command prints."""
        return torch.cat([run.model(batch.to(run.device)).logits.float().cpu() for batch in self.batches(run, graphs)])

    @verb
    def classify(self, run: Run, graphs) -> list[tuple[int, float]]:
        if run.model.config.task != "classify":
            raise RunError(f"{run.path} is a regression model: it predicts values, not classes (run.predict)")
        prob, idx = self.predict(run, graphs).softmax(-1).max(-1)
        return [(int(i), float(top_prob)) for i, top_prob in zip(idx, prob, strict=True)]

    def table_columns(self, run: Run) -> tuple[str, ...]:
        """``graph`` (its place in the --graphs file), then ``class`` and ``probability``, or a regression's
        predicted values (``value``, or ``value_0``, ``value_1``, ...)."""
        if run.model.config.task == "classify":
            return ("graph", "class", "probability")
        outputs = run.model.config.num_outputs
        return ("graph", "value") if outputs == 1 else ("graph", *(f"value_{i}" for i in range(outputs)))

    def respond(self, run: Run, values: dict[str, Any]) -> Iterator[str]:
        for path in values["graphs"]:
            if run.model.config.task == "classify":
                for i, (label, prob) in enumerate(self.classify(run, path)):
                    yield f"{i}\t{label}\t{prob:.4f}\n"
            else:
                for i, row in enumerate(self.predict(run, path).tolist()):
                    yield f"{i}\t" + "\t".join(f"{v:.6g}" for v in row) + "\n"

    def draw(self, run: Run, out_dir: Path, **options) -> list[Path]:
        """``node_attention.png`` and ``laplacian_positions.png`` of a held-out graph (the generated task)."""
        from ..viz.graph import graph_viz

        return graph_viz(run, out_dir, **options)

    def panel(self, run: Run, log) -> list[tuple[str, str]]:
        from ..viz.report.graphs import graph_panel

        return graph_panel(run, log)

    def examples(self, run: Run, directory: Path, count: int = 1) -> list[Example]:
        """``graph-K.json`` per held-out graph (one graph a file), labelled with its class (the classes in turn) or
        its target values."""
        batch, targets = run.data.held_out()
        classes = targets.dim() == 1  # class indices (n,); a regression's targets are (n, K)
        items = varied(targets, count, run.path) if classes else list(take(count, len(batch.x), run.path))
        out = []
        for k, item in enumerate(items):
            path = write_graphs(batch, Path(directory) / f"graph-{k}.json", [item])
            target = targets[item]
            label = str(int(target)) if classes else "\t".join(f"{v:.6g}" for v in target.tolist())
            out.append(Example({"graphs": [str(path)]}, label, (path,)))
        return out

    def bad_inputs(self, run: Run, directory: Path) -> list[tuple[dict[str, Any], str]]:
        root = Path(directory)
        (root / "broken.json").write_text("{not json")
        (root / "wide.json").write_text(json.dumps({"nodes": [[1.0] * (run.model.config.node_features + 3)],
                                                 "edges": []}))
        (root / "far_edge.json").write_text(json.dumps({"nodes": [[0.0] * run.model.config.node_features] * 2,
                                                     "edges": [[0, 5]]}))
        return [({"graphs": [str(root / "missing.json")]}, "does not exist"),
                ({"graphs": [str(root / "broken.json")]}, "JSON"),
                ({"graphs": [str(root / "wide.json")]}, "features per node"),
                ({"graphs": [str(root / "far_edge.json")]}, "outside")]
