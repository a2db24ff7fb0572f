"""The graph task: whole-graph prediction (a class, or values) from a graph transformer."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..errors import RunError
from ..tokens.graph import GraphBatch, collate_graphs
from . import Task

if TYPE_CHECKING:
    from ..run import Run

__all__ = ["GraphPrediction"]


class GraphPrediction(Task):
    """A graph transformer: ``run.classify(graphs)`` → ``(class index, probability)`` per graph, where
    ``graphs`` is a :class:`~tokennet.tokens.graph.GraphBatch` or a list of ``(node features, edges)``."""

    name = "graph prediction"
    kind = "graph"
    verbs = ("classify",)

    def batch(self, run: Run, graphs) -> GraphBatch:
        if isinstance(graphs, GraphBatch):
            return graphs
        c = run.model.config
        return collate_graphs(list(graphs), k=c.pe_dim, rw_steps=c.pe_dim, max_distance=c.max_distance)

    @torch.no_grad()
    def classify(self, run: Run, graphs) -> list[tuple[int, float]]:
        if run.model.config.task != "classify":
            raise RunError(f"{run.path} is a regression model: it predicts values, not classes (call run.model)")
        p = run.model(self.batch(run, graphs).to(run.device)).logits.float().softmax(-1)
        prob, idx = p.max(-1)
        return [(int(i), float(q)) for i, q in zip(idx, prob, strict=True)]
