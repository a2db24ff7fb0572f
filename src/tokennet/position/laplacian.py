"""Laplacian eigenvector positions for graph nodes (Dwivedi et al. 2020, https://arxiv.org/abs/2003.00982).

A graph has no node order, so its "positions" are the low-frequency eigenvectors of its Laplacian

    L = I − D^(−1/2) A D^(−1/2)   (normalized)      or      L = D − A   (combinatorial),

the graph analogue of the sinusoids of a sequence: on a cycle graph C_n they are exactly the Fourier
modes cos(2πkj/n), sin(2πkj/n) with eigenvalues 2 − 2cos(2πk/n) (times 1/2 when normalized).
Eigenvectors are defined only up to sign (and up to rotation within repeated eigenvalues), so
:class:`LaplacianPosition` flips signs at random during training.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["laplacian_eigenvectors", "LaplacianPosition"]


def laplacian_eigenvectors(adj: Tensor, k: int, normalized: bool = True, *,
                           return_eigenvalues: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Eigenvectors of the graph Laplacian for the k smallest non-trivial eigenvalues.

    L = I − D^(−1/2) A D^(−1/2) when normalized (isolated nodes get D^(−1/2) = 0), else L = D − A.
    Eigenvalues are sorted ascending (torch.linalg.eigh) and the first, the trivial λ = 0 with the
    constant (or √degree) eigenvector, is skipped; only that one is skipped, so a disconnected graph
    keeps its other zero eigenvalues. If the graph has fewer than k + 1 nodes the result is padded
    with zero columns (and zero eigenvalues).

    Args:
        adj: symmetric (weighted) adjacency matrix, (n, n) or batched (B, n, n).
        k: number of eigenvectors per node.
        normalized: use the symmetric normalized Laplacian instead of D − A.
        return_eigenvalues: also return the (..., k) eigenvalues.

    Returns:
        Tensor (..., n, k) of unit-norm eigenvectors, one per column, in adj's floating dtype
        (float32 for bool/int adj); with return_eigenvalues, the pair (eigvecs, eigvals).
    """
    if adj.dim() not in (2, 3) or adj.shape[-1] != adj.shape[-2]:
        raise ValueError(f"adj must be a square (n, n) or (B, n, n) adjacency matrix, "
                         f"got shape {tuple(adj.shape)}")
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1 (number of eigenvectors), got {k!r}")
    out_dtype = adj.dtype if adj.is_floating_point() else torch.float32
    a = adj.to(torch.float64 if adj.dtype == torch.float64 else torch.float32)
    if not torch.allclose(a, a.mT, atol=1e-6):
        raise ValueError("adj must be symmetric (an undirected graph); symmetrize it, "
                         "e.g. (adj + adj.mT) / 2, or adj | adj.mT for a boolean adjacency")
    n = a.shape[-1]
    deg = a.sum(-1)  # (..., n)
    if normalized:
        d = deg.clamp_min(0).rsqrt()
        d = torch.where(deg > 0, d, torch.zeros_like(d))  # isolated nodes: no inf
        lap = torch.eye(n, dtype=a.dtype, device=a.device) - d[..., :, None] * a * d[..., None, :]
    else:
        lap = torch.diag_embed(deg) - a
    evals, evecs = torch.linalg.eigh(lap)  # ascending: (..., n), (..., n, n)
    evals, evecs = evals[..., 1:k + 1], evecs[..., :, 1:k + 1]  # skip the trivial one
    if evecs.shape[-1] < k:  # fewer than k + 1 nodes
        pad = k - evecs.shape[-1]
        evecs = torch.cat([evecs, evecs.new_zeros(*evecs.shape[:-1], pad)], dim=-1)
        evals = torch.cat([evals, evals.new_zeros(*evals.shape[:-1], pad)], dim=-1)
    evecs = evecs.to(out_dtype)
    return (evecs, evals.to(out_dtype)) if return_eigenvalues else evecs


class LaplacianPosition(nn.Module):
    """Node positions W u_i + b from the k Laplacian eigenvector entries u_i of node i.

    In training mode each eigenvector's sign is flipped at random, independently per graph, so the
    model learns to be invariant to the arbitrary sign that eigh returns (Dwivedi et al. 2020).

    Args:
        k: number of eigenvectors (input width).
        dim: output width D.
    """

    def __init__(self, k: int, dim: int):
        super().__init__()
        if k < 1 or dim < 1:
            raise ValueError(f"k and dim must be >= 1, got k={k}, dim={dim}")
        self.k, self.dim = k, dim
        self.proj = nn.Linear(k, dim)

    def forward(self, eigvecs: Tensor) -> Tensor:
        """Map eigenvectors (..., n, k), e.g. from :func:`laplacian_eigenvectors`, to positions (..., n, D).

        Args:
            eigvecs: (n, k) for one graph or (B, n, k) for a batch; the sign flip is drawn per graph.
        """
        if eigvecs.dim() < 2 or eigvecs.shape[-1] != self.k:
            raise ValueError(f"expected eigvecs of shape (..., n, {self.k}), got {tuple(eigvecs.shape)}")
        if self.training:
            shape = (*eigvecs.shape[:-2], 1, self.k)  # one sign per graph and eigenvector
            sign = torch.randint(0, 2, shape, device=eigvecs.device).to(eigvecs.dtype) * 2 - 1
            eigvecs = eigvecs * sign
        return self.proj(eigvecs.to(self.proj.weight.dtype))  # (..., n, D)

    def extra_repr(self) -> str:
        return f"k={self.k}, dim={self.dim}"
