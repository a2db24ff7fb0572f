"""Laplacian eigenvector positions for graph nodes (Dwivedi et al. 2020, https://arxiv.org/abs/2003.00982).

A graph has no node order, so its "positions" are the low-frequency eigenvectors of its Laplacian

    L = I − D^(−1/2) A D^(−1/2)   (normalized)      or      L = D − A   (combinatorial),

the graph analogue of the sinusoids of a sequence: on a cycle graph C_n they are exactly the Fourier
modes cos(2πkj/n), sin(2πkj/n) with eigenvalues 2 − 2cos(2πk/n) (times 1/2 when normalized).
Eigenvectors are defined only up to sign (and up to rotation within repeated eigenvalues), so
:class:`LaplacianPosition` flips signs at random during training.

Raw eigenvectors are hard to use: on the marked-distance task (how far apart are two marked nodes?) the
node's normalized-Laplacian coordinates give no better than the majority class. Two encodings built from
the same eigenpairs carry the structure, because they put the eigenvalues where the geometry needs them:

- :class:`CommuteTimePosition`, absolute: ``p_i = (u_1(i)/√λ_1, …, u_k(i)/√λ_k)`` of the combinatorial
  Laplacian ``L = D − A``, the commute-time embedding (Qiu & Hancock 2007). With every eigenvector,
  ``‖p_i − p_j‖² = L⁺_ii + L⁺_jj − 2L⁺_ij`` is the effective resistance between i and j (Klein & Randić
  1993), which on a tree *is* the hop distance, and it does not depend on the eigenvectors' signs.
- :class:`SpectralKernelBias`, relative: ``K_m = V diag(φ_m(λ)) Vᵀ`` for m learned filters φ of the
  eigenvalues (the stable positional encoding SPE, Huang et al. 2024, https://arxiv.org/abs/2310.02579;
  GraphiT's diffusion kernel ``exp(−βL)`` is one such filter, Mialon et al. 2021), turned into one
  attention bias per head. ``V diag(φ(λ)) Vᵀ`` is the same for every choice of signs and of basis
  within a repeated eigenvalue: invariant by construction, not by augmentation.

:func:`laplacian_spectrum` computes the eigenpairs of a padded batch of graphs of different sizes in one
batched eigendecomposition (so a model can do it in its forward pass from the adjacency alone).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["laplacian_eigenvectors", "laplacian_spectrum", "LaplacianPosition", "CommuteTimePosition",
           "SpectralKernelBias"]


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
    adj_float = adj.to(torch.float64 if adj.dtype == torch.float64 else torch.float32)
    if not torch.allclose(adj_float, adj_float.mT, atol=1e-6):
        raise ValueError("adj must be symmetric (an undirected graph); symmetrize it, "
                         "e.g. (adj + adj.mT) / 2, or adj | adj.mT for a boolean adjacency")
    n = adj_float.shape[-1]
    deg = adj_float.sum(-1)  # (..., n)
    if normalized:
        inv_sqrt_deg = deg.clamp_min(0).rsqrt()
        inv_sqrt_deg = torch.where(deg > 0, inv_sqrt_deg, torch.zeros_like(inv_sqrt_deg))  # isolated nodes: no inf
        lap = (torch.eye(n, dtype=adj_float.dtype, device=adj_float.device)
               - inv_sqrt_deg[..., :, None] * adj_float * inv_sqrt_deg[..., None, :])
    else:
        lap = torch.diag_embed(deg) - adj_float
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


def laplacian_spectrum(adj: Tensor, node_mask: Tensor, k: int, normalized: bool = False, *,
                       skip_trivial: bool = True) -> tuple[Tensor, Tensor]:
    """The k smallest non-trivial Laplacian eigenpairs of each graph of a padded batch, one batched ``eigh``.

    Padding nodes would add isolated nodes (spurious zero eigenvalues mixing with the real ones), so
    their diagonal entry is set to ``c = 2·d_max + 1``, above every real eigenvalue (``λ ≤ 2·d_max``
    for ``D − A``, ``λ ≤ 2`` normalized): the matrix is block-diagonal, the padding block is ``c·I``, and
    the lowest n eigenpairs are exactly the graph's own. As in :func:`laplacian_eigenvectors` the trivial
    first eigenpair is skipped (unless ``skip_trivial=False``), and columns beyond a graph's own (``n − 1``,
    or ``n``) are zero (vectors and values).

    Skipping one vector is basis-dependent when λ = 0 is repeated (a disconnected graph: one zero per
    component): a kernel ``V φ(Λ) Vᵀ`` that must not depend on the basis keeps the trivial eigenpair.

    Args:
        adj: (B, N, N) symmetric adjacency (bool or weighted); padding rows and columns zero.
        node_mask: (B, N) bool, True at real nodes.
        k: eigenpairs per graph.
        normalized: ``I − D^(−1/2) A D^(−1/2)`` instead of ``D − A``.
        skip_trivial: leave out the first (λ = 0) eigenpair.

    Returns:
        ``(eigvecs (B, N, k), eigvals (B, k))`` in float32.
    """
    if adj.dim() != 3 or adj.shape[-1] != adj.shape[-2] or node_mask.shape != adj.shape[:2]:
        raise ValueError(f"adj must be (B, N, N) and node_mask (B, N), got {tuple(adj.shape)} and "
                         f"{tuple(node_mask.shape)}")
    adj_float = adj.to(torch.float64)
    B, N, _ = adj_float.shape
    real = node_mask.to(torch.float64)  # (B, N)
    adj_float = adj_float * real[:, :, None] * real[:, None, :]
    deg = adj_float.sum(-1)  # (B, N)
    if normalized:
        inv_sqrt_deg = torch.where(deg > 0, deg.clamp_min(1e-12).rsqrt(), torch.zeros_like(deg))
        lap = torch.diag_embed(real) - inv_sqrt_deg[:, :, None] * adj_float * inv_sqrt_deg[:, None, :]
    else:
        lap = torch.diag_embed(deg) - adj_float
    pad_value = 2 * float(deg.max()) + 1 if deg.numel() else 1.0
    lap = lap + torch.diag_embed((1 - real) * pad_value)  # padding block pad_value·I: above the real spectrum
    evals, evecs = torch.linalg.eigh(lap)  # ascending: (B, N), (B, N, N)
    first = 1 if skip_trivial else 0
    evals, evecs = evals[:, first:k + first], evecs[:, :, first:k + first]
    if evecs.shape[-1] < k:  # fewer than k + first padded nodes
        evecs = torch.cat([evecs, evecs.new_zeros(B, N, k - evecs.shape[-1])], dim=-1)
        evals = torch.cat([evals, evals.new_zeros(B, k - evals.shape[-1])], dim=-1)
    n = node_mask.sum(1)  # (B,)
    valid = torch.arange(k, device=adj.device)[None, :] < (n[:, None] - first)  # (B, k): the graph's own columns
    evecs = evecs * valid[:, None, :] * real[:, :, None]  # (B, N, k)
    evals = evals * valid
    return evecs.float(), evals.float()


class CommuteTimePosition(LaplacianPosition):
    """Node positions ``W p_i + b`` from the commute-time embedding ``p_i = (u_k(i) / √λ_k)_k``.

    Use the combinatorial Laplacian ``D − A`` (:func:`laplacian_spectrum` with ``normalized=False``):
    then ``‖p_i − p_j‖²`` is the effective resistance between i and j (exactly, with all n − 1
    eigenvectors; the k smallest eigenvalues carry most of it, being divided by the smallest λ), and a
    tree's resistance is its hop distance. Columns with λ = 0 (padding, or the extra zero eigenvalues of a
    disconnected graph) contribute zeros. Signs are flipped at random in training, as in
    :class:`LaplacianPosition` (distances do not depend on them; the linear map does).

    Args:
        k: eigenpairs per node (input width).
        dim: output width D.
    """

    @staticmethod
    def embedding(eigvecs: Tensor, eigvals: Tensor, eps: float = 1e-6) -> Tensor:
        """``p = U Λ^(−1/2)`` ``(..., n, k)``, zero where ``λ ≤ eps``."""
        scale = torch.where(eigvals > eps, eigvals.clamp_min(eps).rsqrt(), torch.zeros_like(eigvals))
        return eigvecs * scale[..., None, :]

    def forward(self, eigvecs: Tensor, eigvals: Tensor) -> Tensor:
        """``(..., n, k)`` eigenvectors and ``(..., k)`` eigenvalues → positions ``(..., n, D)``."""
        if eigvecs.shape[-1] != self.k or eigvals.shape[-1] != self.k:
            raise ValueError(f"expected eigvecs (..., n, {self.k}) and eigvals (..., {self.k}), got "
                             f"{tuple(eigvecs.shape)} and {tuple(eigvals.shape)}")
        return super().forward(self.embedding(eigvecs, eigvals))  # random signs in training, then W p + b


class SpectralKernelBias(nn.Module):
    """Relative positions from the spectrum: per-head attention biases and node terms from learned kernels.

        K_m = V diag(φ_m(λ)) Vᵀ,   m = 1..M        (B, M, N, N): M learned filters φ: ℝ → ℝ^M of the eigenvalues
        b_h(i, j) = ρ_h(K_1(i, j), …, K_M(i, j))    an MLP over the M kernel values of each pair → one bias per head
        t_i = W [K_1(i, i), …, K_M(i, i)]           the diagonal as a node term (its "return" profile)

    ``V diag(φ(λ)) Vᵀ = Σ_k φ(λ_k) u_k u_kᵀ`` does not change when an eigenvector's sign flips or a
    repeated eigenvalue's basis rotates, so neither does anything computed from it (SPE, Huang et al.
    2024, https://arxiv.org/abs/2310.02579). With ``φ(λ) = 1/λ`` it is the pseudo-inverse ``L⁺`` (effective
    resistances), with ``φ(λ) = e^(−βλ)`` the diffusion kernel of GraphiT (Mialon et al. 2021); the
    filters are learned. Zero eigenvector columns (padding) contribute nothing. Feed it
    ``laplacian_spectrum(..., skip_trivial=False)``: with the trivial eigenpair the kernel does not depend on
    the basis of a repeated λ = 0 (a disconnected graph), and with k ≥ n it is exact for every graph;
    a k that cuts through a repeated eigenvalue makes it basis-dependent again.

    Args:
        num_heads: H, one bias per head.
        dim: width D of the node term.
        channels: M filters.
        hidden: width of the MLPs φ and ρ.
    """

    def __init__(self, num_heads: int, dim: int, channels: int = 16, hidden: int = 64):
        super().__init__()
        if min(num_heads, dim, channels, hidden) < 1:
            raise ValueError(f"num_heads, dim, channels and hidden must be >= 1, got {num_heads}, {dim}, {channels}, "
                             f"{hidden}")
        self.num_heads, self.channels = num_heads, channels
        self.phi = nn.Sequential(nn.Linear(1, hidden), nn.GELU(), nn.Linear(hidden, channels))
        self.rho = nn.Sequential(nn.Linear(channels, hidden), nn.GELU(), nn.Linear(hidden, num_heads))
        self.node = nn.Linear(channels, dim)

    def kernels(self, eigvecs: Tensor, eigvals: Tensor) -> Tensor:
        """``K = V diag(φ(λ)) Vᵀ`` per channel: ``(B, N, k), (B, k) → (B, N, N, M)``."""
        weights = self.phi(eigvals[..., None].to(self.node.weight.dtype))  # (B, k, M)
        v = eigvecs.to(weights.dtype)
        return torch.einsum("bik,bkm,bjk->bijm", v, weights, v)  # (B, N, N, M)

    def forward(self, eigvecs: Tensor, eigvals: Tensor) -> tuple[Tensor, Tensor]:
        """``(node terms (B, N, D), bias (B, H, N, N))``."""
        ker = self.kernels(eigvecs, eigvals)  # (B, N, N, M)
        diag = torch.diagonal(ker, dim1=1, dim2=2).transpose(1, 2)  # (B, N, M)
        return self.node(diag), self.rho(ker).permute(0, 3, 1, 2)  # (B, N, D), (B, H, N, N)

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, channels={self.channels}"
