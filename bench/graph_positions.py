"""Graphs: which Laplacian positions carry structure on the marked-distance task, each change measured.

The graph recipe's task (how far apart are two marked nodes? classes 1..6+, majority 26 %) can only be
solved from structure. Every variant here is the recipe's model (``graph-small``: 4 layers × 64, full
attention) with one way of giving it the structure, trained with the recipe's settings (AdamW, lr 1e-3,
100 warm-up steps, weight decay 0.01, batch 64) for the same steps on the same batches (cached, so every
variant sees identical graphs) from the same seed, and tested on the recipe's 2,000 held-out graphs.

Rows (``--rows`` picks some):

- the recipe's ablation (set model, Laplacian, random-walk, adjacency mask, distance bias);
- the ladder from today's Laplacian positions (normalized ``L``, k = 8, linear map, random sign flips) to
  ones that work: more eigenvectors (k = 15 = all of them for n ≤ 16), no flips, eigenvalues as inputs,
  an MLP map, SAN-style ``Σ_k φ(u_k(i), λ_k)``, SignNet with a GIN ``φ(v) + φ(−v)``, the combinatorial
  Laplacian ``D − A``, the commute-time embedding ``u_k/√λ_k`` (``position=commute-time``) and the
  spectral-kernel bias ``V diag(φ(λ)) Vᵀ`` (``position=spectral-kernel``);
- combinations with the mask and the distance bias, and longer training (``--steps``).

The rows that are not model options (eigenvalue inputs, MLP, SAN, SignNet, normalized kernel) are
defined here, as subclasses overriding :meth:`GraphTransformer.positions`. Writes
``bench/results/graph_positions.json``. Accuracies at a fixed step count do not depend on the machine's load.

    python bench/graph_positions.py                              # every row, 800 steps, seed 0
    python bench/graph_positions.py --rows ct-k8 kernel-k16 --steps 3200 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tokennet.data.graphs import MarkedDistanceGraphs, marked_distance_set  # noqa: E402
from tokennet.models.graph import GraphConfig, GraphTransformer  # noqa: E402
from tokennet.position.laplacian import SpectralKernelBias, laplacian_spectrum  # noqa: E402
from tokennet.train.trainer import TrainConfig, Trainer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/_record.py, also when a test loads this file
from _record import write  # noqa: E402


def _mlp(i: int, h: int, o: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(i, h), nn.GELU(), nn.Linear(h, o))


class _Spectral(GraphTransformer):
    """A bench-only position: eigenpairs from the batch's adjacency (``normalized`` Laplacian or not)."""

    normalized = True

    def spectrum(self, g, skip_trivial: bool = True):
        with torch.no_grad():
            return laplacian_spectrum(g.adj, g.node_mask, self.config.pe_dim, normalized=self.normalized,
                                      skip_trivial=skip_trivial)

    def flip(self, v):
        if not self.training:
            return v
        return v * (torch.randint(0, 2, (v.shape[0], 1, v.shape[-1])) * 2 - 1).to(v.dtype)


class EigvalInputs(_Spectral):
    """``W [u(i), λ] + b`` (normalized L, flips): the eigenvalues beside each node's coordinates."""

    hidden = 0

    def __init__(self, config):
        super().__init__(config)
        k, d = config.pe_dim, config.dim
        self.enc = _mlp(2 * k, 2 * 64, d) if self.hidden else nn.Linear(2 * k, d)

    def positions(self, g):
        v, lam = self.spectrum(g)
        v = self.flip(v)
        return self.enc(torch.cat([v, lam[:, None, :].expand_as(v)], -1)), None


class EigvalMLP(EigvalInputs):
    """``MLP([u(i), λ])``: a learned non-linear map."""

    hidden = 1


class SAN(_Spectral):
    """``ρ(Σ_k φ(u_k(i), λ_k))`` (Kreuzer et al. 2021's eigenvector-as-token idea with a sum), flips."""

    def __init__(self, config):
        super().__init__(config)
        self.phi, self.rho = _mlp(2, 64, 64), _mlp(64, 64, config.dim)

    def positions(self, g):
        v, lam = self.spectrum(g)
        v = self.flip(v)
        x = torch.stack([v, lam[:, None, :].expand_as(v)], -1)  # (B, N, k, 2)
        valid = (lam > 0).to(v.dtype)[:, None, :, None]  # (B, 1, k, 1)
        return self.rho((self.phi(x) * valid).sum(2)), None


class SignNet(_Spectral):
    """SignNet (Lim et al. 2022, https://arxiv.org/abs/2202.13013): ``ρ([φ(v_k) + φ(−v_k)]_k)`` with φ a
    2-layer GIN over the graph on each eigenvector (with its eigenvalue) as a node signal. Note that φ sees
    the adjacency itself, not only the eigenpairs."""

    def __init__(self, config):
        super().__init__(config)
        self.g1, self.g2 = _mlp(2, 64, 64), _mlp(64, 64, 64)
        self.rho = _mlp(config.pe_dim * 64, 64, config.dim)

    def positions(self, g):
        v, lam = self.spectrum(g)
        B, N, k = v.shape
        a = g.adj.to(v.dtype)

        def phi(u):
            x = self.g1(torch.stack([u, lam[:, None, :].expand(B, N, k)], -1))  # (B, N, k, 64)
            x = x + torch.einsum("bij,bjkh->bikh", a, x)
            x = self.g2(x)
            return x + torch.einsum("bij,bjkh->bikh", a, x)

        z = (phi(v) + phi(-v)) * g.node_mask[:, :, None, None]
        return self.rho(z.reshape(B, N, k * 64)), None  # (B, N, D)


class CombinatorialLinear(_Spectral):
    """``W u(i) + b`` of ``D − A`` (no eigenvalue scaling), flips."""

    normalized = False

    def __init__(self, config):
        super().__init__(config)
        self.enc = nn.Linear(config.pe_dim, config.dim)

    def positions(self, g):
        v, _ = self.spectrum(g)
        return self.enc(self.flip(v)), None


class CommuteTimeNoFlip(_Spectral):
    """``position=commute-time`` without the random sign flips."""

    normalized = False

    def __init__(self, config):
        super().__init__(config)
        self.enc = nn.Linear(config.pe_dim, config.dim)

    def positions(self, g):
        v, lam = self.spectrum(g)
        from tokennet.position.laplacian import CommuteTimePosition

        return self.enc(CommuteTimePosition.embedding(v, lam)), None


class NormalizedKernel(_Spectral):
    """``position=spectral-kernel`` on the normalized Laplacian."""

    def __init__(self, config):
        super().__init__(config)
        self.kern = SpectralKernelBias(config.num_heads, config.dim)

    def positions(self, g):
        return self.kern(*self.spectrum(g, skip_trivial=False))


# name → (description, model class, config overrides, data pe_dim)
ROWS = {
    "set": ("set model (no structure)", GraphTransformer, dict(position="none"), 8),
    "lap-k8": ("Laplacian positions (today: normalized L, k=8, linear, flips)", GraphTransformer,
               dict(position="laplacian"), 8),
    "rw": ("random-walk positions", GraphTransformer, dict(position="random-walk"), 8),
    "adjacency": ("adjacency mask", GraphTransformer, dict(attention="adjacency", position="none"), 8),
    "distance-bias": ("distance bias (Graphormer)", GraphTransformer, dict(attention="distance-bias", position="none"),
                      8),
    "lap-k15": ("Laplacian, k=15 (all eigenvectors)", GraphTransformer, dict(position="laplacian", pe_dim=15), 15),
    "eigval-k15": ("+ eigenvalues as inputs (linear)", EigvalInputs, dict(position="none", pe_dim=15), 8),
    "eigval-mlp-k15": ("+ eigenvalues, MLP map", EigvalMLP, dict(position="none", pe_dim=15), 8),
    "san-k15": ("SAN-style Σ_k φ(u_k(i), λ_k)", SAN, dict(position="none", pe_dim=15), 8),
    "signnet-k15": ("SignNet, GIN φ(v)+φ(−v) (sees the adjacency)", SignNet, dict(position="none", pe_dim=15), 8),
    "comb-k8": ("combinatorial L = D − A, k=8, linear, flips", CombinatorialLinear, dict(position="none"), 8),
    "ct-k4": ("commute-time u/√λ of D − A, k=4", GraphTransformer, dict(position="commute-time", pe_dim=4), 8),
    "ct-k8": ("commute-time u/√λ of D − A, k=8", GraphTransformer, dict(position="commute-time"), 8),
    "ct-k8-noflip": ("commute-time, k=8, no sign flips", CommuteTimeNoFlip, dict(position="none"), 8),
    "ct-k15": ("commute-time, k=15", GraphTransformer, dict(position="commute-time", pe_dim=15), 8),
    "kernel-norm-k15": ("spectral kernel V φ(Λ) Vᵀ, normalized L, k=15", NormalizedKernel,
                        dict(position="none", pe_dim=15), 8),
    "kernel-k8": ("spectral kernel V φ(Λ) Vᵀ of D − A, k=8", GraphTransformer, dict(position="spectral-kernel"), 8),
    "kernel-k16": ("spectral kernel of D − A, k=16 (all)", GraphTransformer,
                   dict(position="spectral-kernel", pe_dim=16), 8),
    "kernel-k16+adjacency": ("spectral kernel k=16 + adjacency mask", GraphTransformer,
                             dict(position="spectral-kernel", pe_dim=16, attention="adjacency"), 8),
    "ct-k8+distance-bias": ("commute-time k=8 + distance bias", GraphTransformer,
                            dict(position="commute-time", attention="distance-bias"), 8),
}


class CachedSource:
    """The recipe's batch source, each batch made once and shared by every variant."""

    def __init__(self, batch_size: int, seed: int, pe_dim: int):
        self.src = MarkedDistanceGraphs(batch_size, seed=seed, pe_dim=pe_dim, max_distance=6, graph_max_distance=8)
        self.cache: dict[int, tuple] = {}

    def batch(self, index: int):
        if index not in self.cache:
            self.cache[index] = self.src.batch(index)
        return self.cache[index]


@torch.no_grad()
def accuracy(model, batch, labels) -> float:
    model.eval()
    correct = 0
    for i in range(0, len(labels), 500):
        idx = torch.arange(i, min(len(labels), i + 500))
        correct += int((model(batch.select(idx)).logits.argmax(-1) == labels[idx]).sum())
    return correct / len(labels)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", nargs="*", default=list(ROWS), choices=list(ROWS))
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--seeds", type=int, nargs="*", default=[0])
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "graph_positions.json"))
    args = p.parse_args()
    torch.set_num_threads(1)
    tests = {k: marked_distance_set(2000, "test-0", pe_dim=k, max_distance=6, graph_max_distance=8) for k in (8, 15)}
    labels = tests[8][1]
    majority = max(Counter(labels.tolist()).values()) / len(labels)
    results = []
    print(f"\n{args.steps} steps × batch 64, seeds {args.seeds}; majority class {100 * majority:.1f} %\n")
    print("| row | variant | test accuracy | parameters |\n| --- | --- | --- | --- |", flush=True)
    for seed in args.seeds:
        sources = {}
        for row in args.rows:
            desc, cls, over, pe = ROWS[row]
            src = sources.setdefault(pe, CachedSource(64, seed, pe))
            cfg = TrainConfig(max_iters=args.steps, batch_size=64, lr=1e-3, warmup_iters=100, weight_decay=0.01,
                              eval_interval=0, checkpoint_interval=0, log_interval=0, progress=False, report=False,
                              seed=seed)
            torch.manual_seed(seed)
            model = cls(GraphConfig(node_features=2, num_outputs=6, **over))
            t0 = time.perf_counter()
            with tempfile.TemporaryDirectory() as scratch:
                Trainer(model, cfg, src, out_dir=scratch).fit()
            acc = accuracy(model, *tests[pe])
            n = sum(q.numel() for q in model.parameters())
            results.append({"row": row, "variant": desc, "seed": seed, "steps": args.steps, "test_accuracy": acc,
                            "parameters": n, "wall_s_shared_machine": round(time.perf_counter() - t0, 1)})
            print(f"| {row} (seed {seed}) | {desc} | {100 * acc:.1f} % | {n:,} |", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write(args.out, {"majority_class": majority, "results": results, "torch": torch.__version__},
          settings=vars(args), torch=torch.__version__)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
