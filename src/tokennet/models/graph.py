"""Graph transformer: nodes are tokens, one encoder over them, a permutation-invariant readout.

    T⁰ = X W_in (+ P)                         node tokens (+ Laplacian or random-walk positions P)
    Tˡ = Block(Tˡ⁻¹; mask, bias)              pre-norm blocks; structure as positions, mask or bias
    y  = head(LN(mean_{i ∈ V} T^L_i))         mean over the real nodes: invariant to node order

``attention`` picks how structure reaches attention: ``"full"`` (every node attends to every node:
a set model unless positions are added), ``"adjacency"`` (neighbours and itself only: message passing
with attention weights, Veličković et al. 2018), ``"distance-bias"`` (Graphormer's spatial encoding,
Ying et al. 2021, https://arxiv.org/abs/2106.05234: a learned bias per head and shortest-path distance
added to every score), or ``"distance-3d"`` (for graphs with a geometry, e.g. molecules: a bias per head
from the Euclidean distance expanded in Gaussian radial basis functions,
``b_h(i, j) = Σ_k w_hk exp(−γ (|r_i − r_j| − μ_k)²)``, as in Graphormer-3D and SchNet's filters).
``position`` adds ``"laplacian"`` eigenvector positions (random sign flips in training),
``"random-walk"`` encodings, or ``"none"``; or, from the eigenpairs of ``D − A`` computed in the forward
pass from the batch's adjacency (:func:`~tokennet.position.laplacian.laplacian_spectrum`),
``"commute-time"`` node positions ``u_k(i)/√λ_k`` (distances between them are effective resistances) or
``"spectral-kernel"``, relative positions: per-head attention biases from learned kernels
``V diag(φ(λ)) Vᵀ``, invariant to the eigenvectors' signs and bases by construction (SPE). On the
marked-distance task (graph recipe, 800 steps × 64, seed 0) these two reach 90 % and 97.5 % where the
raw eigenvectors stay near the majority class; ``bench/graph_positions.py`` has the table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention.masks import adjacency, padding
from ..dropout import Dropout
from ..layers.stack import AttentionMaps, Encoder
from ..position.laplacian import CommuteTimePosition, LaplacianPosition, SpectralKernelBias, laplacian_spectrum
from ..tokens.graph import GraphBatch, collate_graphs
from .registry import CountsParameters, Output, TransformerConfig, register_family, register_preset

__all__ = ["GraphConfig", "GraphTransformer", "ATTENTIONS", "POSITIONS", "TASKS"]

ATTENTIONS = ("full", "adjacency", "distance-bias", "distance-3d")
RBF_CENTERS, RBF_MAX = 32, 6.0  # Gaussian centres μ_k on [0, 6] Å
POSITIONS = ("none", "laplacian", "random-walk", "commute-time", "spectral-kernel")
SPECTRAL = ("commute-time", "spectral-kernel")  # eigenpairs computed in forward, from the adjacency
TASKS = ("classify", "regress")


@dataclass
class GraphConfig(TransformerConfig, defaults=dict(dim=64, num_layers=4, mlp_ratio=2.0)):
    """Config of :class:`GraphTransformer`.

    Args:
        node_features: width F of the input node features.
        task: ``"classify"`` (``num_outputs`` classes, cross-entropy) or ``"regress"`` (``num_outputs``
            targets, L1 loss: the mean absolute error is the metric of molecular property prediction).
        num_outputs: classes or regression targets.
        dim, num_layers, num_heads, mlp_ratio, dropout: the encoder.
        attention: ``"full"``, ``"adjacency"`` or ``"distance-bias"``.
        position: ``"none"``, ``"laplacian"``, ``"random-walk"``, ``"commute-time"`` or ``"spectral-kernel"``.
        pe_dim: Laplacian eigenvectors k (also the random-walk steps K).
        max_distance: distances kept apart by the bias; farther and unreachable pairs share one bucket.
        target_mean, target_std: a regressor predicts ``mean + std · head(h)``, so its head works on
            standardized targets while its outputs and loss are in the targets' units (the loss is the L1
            error divided by ``std``).
        backend: attention backend.
    """

    node_features: int = 1
    task: str = "classify"
    num_outputs: int = 2
    attention: str = "full"
    position: str = "laplacian"
    pe_dim: int = 8
    max_distance: int = 8
    target_mean: float = 0.0
    target_std: float = 1.0

    def __post_init__(self):
        self.family = "graph"
        self._positive(node_features=self.node_features, num_outputs=self.num_outputs, dim=self.dim,
                       num_layers=self.num_layers, num_heads=self.num_heads, pe_dim=self.pe_dim,
                       max_distance=self.max_distance)
        self._choice("task", self.task, TASKS)
        self._choice("attention", self.attention, ATTENTIONS)
        self._choice("position", self.position, POSITIONS)
        from ..errors import ConfigError

        if self.dim % self.num_heads:
            raise ConfigError(f"num_heads={self.num_heads} must divide dim={self.dim}")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.task == "classify" and self.num_outputs < 2:
            raise ConfigError(f"a classifier needs num_outputs >= 2 classes, got {self.num_outputs}")
        if not self.target_std > 0:
            raise ConfigError(f"target_std must be positive, got {self.target_std}")


class GraphTransformer(CountsParameters, nn.Module):
    """``forward(GraphBatch, targets=None) → Output(logits (B, num_outputs), loss)``."""

    def __init__(self, config: GraphConfig):
        super().__init__()
        self.config = cfg = config
        self.node_proj = nn.Linear(cfg.node_features, cfg.dim)
        self.lap_pos = LaplacianPosition(cfg.pe_dim, cfg.dim) if cfg.position == "laplacian" else None
        self.rw_pos = nn.Linear(cfg.pe_dim, cfg.dim) if cfg.position == "random-walk" else None
        self.ct_pos = CommuteTimePosition(cfg.pe_dim, cfg.dim) if cfg.position == "commute-time" else None
        self.kernel_pos = SpectralKernelBias(cfg.num_heads, cfg.dim) if cfg.position == "spectral-kernel" else None
        # Graphormer's spatial encoding: one learned scalar per head and distance bucket 0..max+1.
        self.dist_bias = nn.Embedding(cfg.max_distance + 2, cfg.num_heads) if cfg.attention == "distance-bias" else None
        if self.dist_bias is not None:
            nn.init.zeros_(self.dist_bias.weight)
        self.rbf_bias = nn.Linear(RBF_CENTERS, cfg.num_heads) if cfg.attention == "distance-3d" else None
        if self.rbf_bias is not None:
            self.register_buffer("rbf_mu", torch.linspace(0.0, RBF_MAX, RBF_CENTERS), persistent=False)
        self.drop = Dropout(cfg.dropout) if cfg.dropout > 0 else nn.Identity()
        self.encoder = Encoder(cfg.dim, cfg.num_layers, cfg.num_heads, mlp_ratio=cfg.mlp_ratio, norm="pre",
                               dropout=cfg.dropout, backend=cfg.backend, value_proj=cfg.value_proj)
        self.head = nn.Linear(cfg.dim, cfg.num_outputs)

    def _check(self, g: GraphBatch) -> GraphBatch:
        cfg = self.config
        if not isinstance(g, GraphBatch):
            raise ValueError(f"a graph model takes a GraphBatch (see tokennet.tokens.graph.collate_graphs), "
                             f"got {type(g).__name__}")
        if g.x.shape[-1] != cfg.node_features:
            raise ValueError(f"node features are {g.x.shape[-1]} wide, the model expects {cfg.node_features}")
        if (cfg.position in ("laplacian", "random-walk")
                and (g.lap.shape[-1] != cfg.pe_dim or g.rw.shape[-1] != cfg.pe_dim)):
            raise ValueError(f"the batch has {g.lap.shape[-1]} eigenvectors / {g.rw.shape[-1]} walk steps, the model "
                             f"expects pe_dim={cfg.pe_dim}: collate with k=rw_steps={cfg.pe_dim}")
        return g

    def structure(self, g: GraphBatch) -> tuple[Tensor, Tensor | None]:
        """The attention mask ``(B, 1, N|1, N)`` and additive bias ``(B, H, N, N)`` (or None) of a batch."""
        mask = padding(~g.node_mask)  # (B, 1, 1, N): only real nodes are keys
        if self.config.attention == "adjacency":
            mask = mask & adjacency(g.adj)  # (B, 1, N, N): neighbours and itself
        bias = None
        if self.dist_bias is not None:
            bias = self.dist_bias(g.dist.clamp(max=self.config.max_distance + 1)).permute(0, 3, 1, 2)  # (B, H, N, N)
        elif self.rbf_bias is not None:
            if g.pos is None:
                raise ValueError("attention='distance-3d' needs node coordinates: the batch has no pos")
            dist = torch.cdist(g.pos.to(self.rbf_mu.dtype), g.pos.to(self.rbf_mu.dtype))  # (B, N, N) in Å
            gamma = (RBF_CENTERS / RBF_MAX) ** 2  # one width per centre spacing
            phi = torch.exp(-gamma * (dist[..., None] - self.rbf_mu) ** 2)  # (B, N, N, K)
            bias = self.rbf_bias(phi).permute(0, 3, 1, 2)  # (B, H, N, N)
        return mask, bias

    def positions(self, g: GraphBatch) -> tuple[Tensor | None, Tensor | None]:
        """The position terms of a batch: added to the node tokens ``(B, N, D)`` and to the attention
        scores ``(B, H, N, N)`` (either None)."""
        if self.lap_pos is not None:
            return self.lap_pos(g.lap), None
        if self.rw_pos is not None:
            return self.rw_pos(g.rw), None
        if self.config.position in SPECTRAL:
            kernel = self.kernel_pos is not None
            with torch.no_grad():  # the eigenpairs are data: no gradient flows into eigh
                vecs, vals = laplacian_spectrum(g.adj, g.node_mask, self.config.pe_dim, normalized=False,
                                                skip_trivial=not kernel)
            return self.kernel_pos(vecs, vals) if kernel else (self.ct_pos(vecs, vals), None)
        return None, None

    def forward_features(self, g: GraphBatch, *, return_attention: bool = False):
        """Node tokens after the encoder ``(B, N, D)`` (padding rows are not meaningful)."""
        graph = self._check(g)
        feats = self.node_proj(graph.x)  # (B, N, D)
        node_pos, pos_bias = self.positions(graph)
        if node_pos is not None:
            feats = feats + node_pos
        mask, bias = self.structure(graph)
        if pos_bias is not None:
            bias = pos_bias if bias is None else bias + pos_bias
        return self.encoder(self.drop(feats), mask=mask, bias=bias, return_weights=return_attention)

    def readout(self, h: Tensor, node_mask: Tensor) -> Tensor:
        """Mean of the real nodes' tokens ``(B, D)``: the same for every ordering of the nodes."""
        weight = node_mask.to(h.dtype)[..., None]  # (B, N, 1)
        return (h * weight).sum(1) / weight.sum(1).clamp_min(1)

    def forward_head(self, h: Tensor, node_mask: Tensor) -> Tensor:
        cfg = self.config
        out = self.head(self.readout(h, node_mask))
        return out if cfg.task == "classify" else cfg.target_mean + cfg.target_std * out

    def forward(self, g: GraphBatch, targets: Tensor | None = None) -> Output:
        out = self.forward_head(self.forward_features(g), g.node_mask)  # (B, num_outputs)
        loss = None
        if targets is not None:
            if self.config.task == "classify":
                loss = F.cross_entropy(out, targets)
            else:
                loss = F.l1_loss(out, targets.reshape(out.shape).to(out.dtype)) / self.config.target_std
        return Output(out, loss)

    def attention_maps(self, g: GraphBatch) -> AttentionMaps:
        """Every layer's attention over the nodes, plain formula: ``{"self": [(B, H, N, N)] * L}``."""
        _, maps = self.forward_features(g, return_attention=True)
        return {"self": [m["self"] for m in maps]}

    # -- examples for tests --------------------------------------------------------------------
    def example_input(self, batch_size: int = 2) -> GraphBatch:
        """Random small graphs (cycles with a chord, different sizes) with random features."""
        cfg = self.config
        gen = torch.Generator().manual_seed(0)
        graphs = []
        for index in range(batch_size):
            n = 5 + index % 4
            edges = [(i, (i + 1) % n) for i in range(n)] + [(0, n // 2)]
            graphs.append((torch.randn(n, cfg.node_features, generator=gen), edges))
        return collate_graphs(graphs, k=cfg.pe_dim, rw_steps=cfg.pe_dim, max_distance=cfg.max_distance)

    def example_targets(self, batch_size: int = 2) -> Tensor:
        gen = torch.Generator().manual_seed(1)
        cfg = self.config
        if cfg.task == "classify":
            return torch.randint(cfg.num_outputs, (batch_size,), generator=gen)
        return torch.randn(batch_size, cfg.num_outputs, generator=gen)


register_family("graph", GraphConfig, GraphTransformer)
register_preset("graph-small", "graph", "Graph transformer, 4 layers × 64, Laplacian positions (8 eigenvectors)")
register_preset("graph-micro", "graph", "Graph transformer, 1 layer × 32 (tests)", dim=32, num_layers=1, num_heads=2,
                pe_dim=4, max_distance=4)
