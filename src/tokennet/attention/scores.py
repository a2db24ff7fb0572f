"""Attention scoring functions ``a(q, k)`` behind one interface.

Every scorer is an ``nn.Module`` with ``forward(queries (B, Nq, dq), keys (B, Nk, dk)) -> (B, Nq, Nk)``
(any leading dims that broadcast work in place of ``B``), so attention is always

    A = masked_softmax(score(Q, K), mask),   output = A V.

Two families:

- **Learned similarity** for transformers and seq2seq: :class:`DotProductScore` (``q kᵀ / √d``) and
  :class:`AdditiveScore` (Bahdanau's ``w_vᵀ tanh(W_q q + W_k k)``).
- **Kernels** for Nadaraya–Watson pooling: the score is ``log K(q − k)``, so that
  ``softmax_i(score(q, k_i)) = K(q − k_i) / Σ_j K(q − k_j)`` — the kernel-weighted average is exactly
  attention. :class:`GaussianKernel`, :class:`LaplaceKernel`, :class:`BoxcarKernel`.

Each scorer also has ``mask(queries, keys)``, the boolean support of its weights (True = may
attend) or ``None`` when every key gets a positive weight. Only :class:`BoxcarKernel` has a finite
support; :class:`~tokennet.attention.pooling.AttentionPooling` combines it with the caller's mask so a
query with no key inside the box yields zeros, never NaN.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = [
    "Score",
    "DotProductScore",
    "AdditiveScore",
    "GaussianKernel",
    "LaplaceKernel",
    "BoxcarKernel",
    "SCORES",
    "score_function",
]


def _check_pair(queries: Tensor, keys: Tensor, *, same_width: bool) -> None:
    """Raise ``ValueError`` unless ``queries`` (..., Nq, dq) and ``keys`` (..., Nk, dk) can be scored."""
    for name, t in (("queries", queries), ("keys", keys)):
        if t.dim() < 2:
            raise ValueError(
                f"{name} must have shape (B, N, d) (or (N, d)), got {tuple(t.shape)}; "
                "for 1-D inputs add a feature axis with x[..., None]"
            )
    try:
        torch.broadcast_shapes(queries.shape[:-2], keys.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"leading (batch) dims of queries {tuple(queries.shape)} and keys {tuple(keys.shape)} "
            "do not broadcast; give both the same batch size B"
        ) from None
    if same_width and queries.shape[-1] != keys.shape[-1]:
        raise ValueError(
            f"queries and keys need the same width d, got {queries.shape[-1]} and {keys.shape[-1]}; "
            "project them to a common width or use AdditiveScore, which allows different widths"
        )


def _differences(queries: Tensor, keys: Tensor) -> Tensor:
    """All pairwise differences ``q_i − k_j`` as ``(..., Nq, Nk, d)``.

    Exact (no ``‖q‖² + ‖k‖² − 2 q·k`` cancellation), at the cost of an ``Nq × Nk × d`` tensor: fine for
    the small problems kernels are used on.
    """
    return queries.unsqueeze(-2) - keys.unsqueeze(-3)  # (..., Nq, Nk, d)


class Score(nn.Module):
    """Base class: ``forward(queries (B, Nq, dq), keys (B, Nk, dk)) -> scores (B, Nq, Nk)``."""

    def mask(self, queries: Tensor, keys: Tensor) -> Tensor | None:
        """Boolean support ``(B, Nq, Nk)`` of the attention weights, or ``None`` when it is everywhere."""
        return None


class DotProductScore(Score):
    """Scaled dot product ``a(q, k) = q kᵀ / √d``, i.e. ``S = Q Kᵀ / √d``.

    Vaswani et al. 2017, https://arxiv.org/abs/1706.03762.

    Args:
        scale: multiply ``q kᵀ`` by this instead of ``1/√d``.
    """

    def __init__(self, scale: float | None = None):
        super().__init__()
        if scale is not None and not scale > 0:
            raise ValueError(f"scale must be positive (or None for 1/√d), got {scale}")
        self.scale = scale

    def forward(self, queries: Tensor, keys: Tensor) -> Tensor:
        _check_pair(queries, keys, same_width=True)
        scale = 1.0 / math.sqrt(queries.shape[-1]) if self.scale is None else self.scale
        return (queries @ keys.transpose(-2, -1)) * scale  # (B, Nq, Nk)

    def extra_repr(self) -> str:
        return f"scale={self.scale}"


class AdditiveScore(Score):
    """Additive attention ``a(q, k) = w_vᵀ tanh(W_q q + W_k k)``; queries and keys may differ in width.

    Bahdanau, Cho & Bengio 2015, https://arxiv.org/abs/1409.0473. Computed for all pairs at once by
    broadcasting ``(B, Nq, 1, h) + (B, 1, Nk, h)``.

    Args:
        query_dim: width ``dq`` of the queries.
        key_dim: width ``dk`` of the keys.
        hidden_dim: width ``h`` of the hidden layer.
    """

    def __init__(self, query_dim: int, key_dim: int, hidden_dim: int):
        super().__init__()
        for name, v in (("query_dim", query_dim), ("key_dim", key_dim), ("hidden_dim", hidden_dim)):
            if v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v}")
        self.W_q = nn.Linear(query_dim, hidden_dim, bias=False)
        self.W_k = nn.Linear(key_dim, hidden_dim, bias=False)
        self.w_v = nn.Linear(hidden_dim, 1, bias=False)

    def forward(self, queries: Tensor, keys: Tensor) -> Tensor:
        _check_pair(queries, keys, same_width=False)
        q_width, k_width = self.W_q.in_features, self.W_k.in_features
        if queries.shape[-1] != q_width or keys.shape[-1] != k_width:
            raise ValueError(
                f"AdditiveScore was built for query width {q_width} and key width {k_width}, got "
                f"{queries.shape[-1]} and {keys.shape[-1]}; "
                "build it with AdditiveScore(query_dim, key_dim, hidden_dim) for your widths"
            )
        q = self.W_q(queries).unsqueeze(-2)  # (B, Nq, 1, h)
        k = self.W_k(keys).unsqueeze(-3)  # (B, 1, Nk, h)
        return self.w_v(torch.tanh(q + k)).squeeze(-1)  # (B, Nq, Nk)


class _BandwidthKernel(Score):
    """A kernel ``K(u / σ)`` with a bandwidth ``σ > 0``, fixed or learned as ``log σ``."""

    def __init__(self, bandwidth: float = 1.0, learnable: bool = False):
        super().__init__()
        if not bandwidth > 0:
            raise ValueError(f"bandwidth must be positive, got {bandwidth}")
        # Learning log σ keeps σ positive without clamping and makes steps scale-free.
        log_bw = torch.tensor(math.log(bandwidth))
        if learnable:
            self.log_bandwidth = nn.Parameter(log_bw)
        else:
            self.register_buffer("log_bandwidth", log_bw)
        self.learnable = learnable

    @property
    def bandwidth(self) -> Tensor:
        """The bandwidth ``σ = exp(log σ)`` as a 0-dim tensor (differentiable when learnable)."""
        return self.log_bandwidth.exp()

    def extra_repr(self) -> str:
        return f"bandwidth={self.bandwidth.item():.4g}, learnable={self.learnable}"


class GaussianKernel(_BandwidthKernel):
    """Gaussian kernel score ``a(q, k) = −‖q − k‖² / (2σ²)``, the log of ``K(u) = exp(−‖u‖² / 2σ²)``.

    ``softmax_i a(q, k_i) = K(q − k_i) / Σ_j K(q − k_j)``: Nadaraya–Watson regression with a Gaussian
    kernel. d2l's parametric form ``−½((q − k) w)²`` is the same with ``σ = 1/|w|``.

    Args:
        bandwidth: initial (or fixed) ``σ``.
        learnable: learn ``log σ`` by gradient descent.
    """

    def forward(self, queries: Tensor, keys: Tensor) -> Tensor:
        _check_pair(queries, keys, same_width=True)
        sq_dist = _differences(queries, keys).pow(2).sum(-1)  # (B, Nq, Nk)
        return -sq_dist / (2 * self.bandwidth**2)


class LaplaceKernel(_BandwidthKernel):
    """Laplace kernel score ``a(q, k) = −‖q − k‖ / σ``, the log of ``K(u) = exp(−‖u‖ / σ)``.

    Args:
        bandwidth: initial (or fixed) ``σ``.
        learnable: learn ``log σ`` by gradient descent.
    """

    def forward(self, queries: Tensor, keys: Tensor) -> Tensor:
        _check_pair(queries, keys, same_width=True)
        # vector_norm's backward is 0 (not NaN) at q = k, unlike sqrt of the squared distance.
        dist = torch.linalg.vector_norm(_differences(queries, keys), dim=-1)  # (B, Nq, Nk)
        return -dist / self.bandwidth


class BoxcarKernel(Score):
    """Boxcar kernel ``K(u) = 1[‖u‖ ≤ width]``: an unweighted average of the keys within ``width``.

    The score is ``log K``: ``0`` inside the box and ``−inf`` outside, so ``softmax`` gives equal
    weights to the keys inside. A query with no key inside has no valid weights at all; ``mask`` returns
    the box as a boolean mask and ``masked_softmax(scores, mask)`` then gives that row zeros, not NaN
    (:class:`~tokennet.attention.pooling.AttentionPooling` does this for you). d2l's boxcar
    ``|x| < 1`` is ``width=1`` (up to the boundary).

    Args:
        width: radius of the box around each query (half its full width).
    """

    def __init__(self, width: float = 1.0):
        super().__init__()
        if not width > 0:
            raise ValueError(f"width must be positive, got {width}")
        self.width = width

    def mask(self, queries: Tensor, keys: Tensor) -> Tensor:
        _check_pair(queries, keys, same_width=True)
        return torch.linalg.vector_norm(_differences(queries, keys), dim=-1) <= self.width  # (B, Nq, Nk)

    def forward(self, queries: Tensor, keys: Tensor) -> Tensor:
        inside = self.mask(queries, keys)
        zeros = torch.zeros(inside.shape, dtype=queries.dtype, device=queries.device)
        return zeros.masked_fill(~inside, float("-inf"))

    def extra_repr(self) -> str:
        return f"width={self.width}"


SCORES: dict[str, type[Score]] = {
    "dot": DotProductScore,
    "additive": AdditiveScore,
    "gaussian": GaussianKernel,
    "laplace": LaplaceKernel,
    "boxcar": BoxcarKernel,
}


def score_function(name: str, **kwargs) -> Score:
    """Build a scoring function by name: one of the keys of :data:`SCORES`.

    Names: ``"dot"``, ``"additive"``, ``"gaussian"``, ``"laplace"``, ``"boxcar"``.

    Args:
        name: the scorer's name.
        **kwargs: passed to its constructor (e.g. ``bandwidth=0.5`` or ``query_dim=8, key_dim=4,
            hidden_dim=16``).
    """
    if name not in SCORES:
        raise ValueError(f"unknown score function {name!r}; expected one of {', '.join(SCORES)}")
    return SCORES[name](**kwargs)
