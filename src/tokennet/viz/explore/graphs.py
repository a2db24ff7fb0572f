"""The explorer of graph runs: nodes are the tokens, drawn as the points of the graph (a seeded spring layout);
the output is the class probabilities (or a regression's values)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ...errors import DataError, RunError
from .views import Exploration, Explorer, check_index, graph_view, top_k

if TYPE_CHECKING:
    from ...run import Run

__all__ = ["GraphExplorer"]


class GraphExplorer(Explorer):
    """A graph transformer: one token per node; a user's graph is JSON as ``tokennet generate --graphs`` reads it
    (``{"nodes": [[features]], "edges": [[i, j]]}``)."""

    accepts = ("graph",)

    def __init__(self, run: Run):
        super().__init__(run)
        if run.data is None or not hasattr(run.data, "held_out"):
            raise RunError(f"{run.path} has no data spec (run.json): the page needs its held-out graphs")
        self.graphs, self.labels = run.data.held_out()
        self.marked_feature = getattr(run.data, "kind", None) == "marked-distance"

    def examples(self, limit: int) -> list[str]:
        sizes = self.graphs.node_mask.sum(-1).tolist()
        return [f"test graph #{i}: {int(sizes[i])} nodes, target {self._target(i)}"
                for i in range(min(limit, len(self.labels)))]

    def _target(self, index: int) -> str:
        value = self.labels[index]
        return str(int(value)) if value.dim() == 0 and not value.is_floating_point() else \
            ", ".join(f"{v:.3g}" for v in value.reshape(-1).tolist())

    def example(self, index: int) -> Exploration:
        index = check_index(index, len(self.labels))
        return self.explore(self.graphs.select(torch.tensor([index])), f"test graph #{index}: target "
                                                                       f"{self._target(index)}")

    def custom(self, fields: dict[str, Any]) -> Exploration:
        graph = fields.get("graph")
        if not isinstance(graph, dict):
            raise DataError('give one graph as a JSON object: {"nodes": [[features], ...], "edges": [[i, j], ...]}')
        with tempfile.TemporaryDirectory(prefix="tokennet-explore-") as directory:
            path = Path(directory) / "graph.json"
            path.write_text(json.dumps(graph))
            try:
                batch = next(iter(self.run.task.batches(self.run, str(path))))
            except DataError as error:
                raise DataError(str(error).replace(str(path), "your graph")) from None
        return self.explore(batch, "your graph")

    def explore(self, batch, title: str) -> Exploration:
        n = int(batch.node_mask[0].sum())
        i, j = torch.triu(batch.adj[0, :n, :n], diagonal=1).nonzero(as_tuple=True)
        marked = (batch.x[0, :n, 0] > 0).nonzero().flatten().tolist() if self.marked_feature else []
        tokens = [{"label": f"node {k}" + (" (marked)" if k in marked else ""), "view": "graph", "cell": k}
                  for k in range(n)]
        tokens += [{"label": "(padding)", "view": None, "cell": None, "hidden": True}
                   for _ in range(batch.x.shape[1] - n)]
        inputs = batch.to(self.run.device)
        classify = self.run.model.config.task == "classify"

        def predict() -> dict[str, Any]:
            with torch.no_grad():
                out = self.run.model(inputs).logits.float()[0].cpu()
            if classify:
                top = top_k(out.softmax(-1), None)
                return {"text": f"class {top[0][0]} ({top[0][1]:.2f})", "top": top}
            values = [[f"output {k}", round(float(v), 5)] for k, v in enumerate(out.tolist())]
            return {"text": ", ".join(f"{v:.4g}" for v in out.tolist()), "top": values}

        view = graph_view(n, list(zip(i.tolist(), j.tolist(), strict=True)), marked)
        return Exploration(inputs, tokens, {"graph": view}, title, predict)
