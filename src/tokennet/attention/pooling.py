"""Attention pooling: Nadaraya–Watson kernel regression as attention, and its baseline.

A query ``x`` attends to keys ``x_i`` carrying values ``y_i``:

    f(x) = Σ_i α(x, x_i) y_i,   α(x, x_i) = softmax_i(a(x, x_i)),

with any scoring function ``a`` from :mod:`tokennet.attention.scores`. With a kernel score
``a = log K`` this is the Nadaraya–Watson estimator ``f(x) = Σ_i K(x − x_i) y_i / Σ_j K(x − x_j)``
(Nadaraya 1964, https://doi.org/10.1137/1109020; Watson 1964, https://www.jstor.org/stable/25049340).

Inputs are either 1-D — queries ``(Nq,)``, keys and values ``(N,)`` — or batched — queries
``(B, Nq, d)``, keys ``(B, N, d)``, values ``(B, N, dv)``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .functional import masked_softmax

__all__ = ["nadaraya_watson", "AttentionPooling", "average_pooling"]


def _batched(queries: Tensor, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor, Tensor, bool]:
    """Return ``(B, Nq, d), (B, N, d), (B, N, dv)`` views and whether the inputs were 1-D."""
    dims = (queries.dim(), keys.dim(), values.dim())
    if dims == (1, 1, 1):
        if keys.shape != values.shape:
            raise ValueError(
                f"keys {tuple(keys.shape)} and values {tuple(values.shape)} need the same length N"
            )
        return queries[None, :, None], keys[None, :, None], values[None, :, None], True  # (1, N, 1)
    if dims == (3, 3, 3):
        if keys.shape[:2] != values.shape[:2]:
            raise ValueError(
                f"keys {tuple(keys.shape)} and values {tuple(values.shape)} need the same (B, N)"
            )
        return queries, keys, values, False
    raise ValueError(
        f"expected 1-D queries (Nq,), keys and values (N,), or batched (B, Nq, d), (B, N, d), (B, N, dv); "
        f"got shapes {tuple(queries.shape)}, {tuple(keys.shape)}, {tuple(values.shape)}"
    )


def _check_mask(mask: Tensor, shape: torch.Size, flat: bool) -> None:
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be boolean (True = may attend), got dtype {mask.dtype}")
    try:
        ok = torch.broadcast_shapes(mask.shape, shape) == shape
    except RuntimeError:
        ok = False
    if not ok:
        expected = f"(Nq, N) = {tuple(shape[1:])}" if flat else f"(B, Nq, N) = {tuple(shape)}"
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to {expected}")


def _pool(kernel: nn.Module, queries: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None):
    q, k, v, flat = _batched(queries, keys, values)
    scores = kernel(q, k)  # (B, Nq, N)
    support_fn = getattr(kernel, "mask", None)
    support = support_fn(q, k) if callable(support_fn) else None  # e.g. the boxcar's box
    if mask is not None:
        _check_mask(mask, scores.shape, flat)
    if support is None:
        full = mask
    else:
        full = support if mask is None else support & mask
    weights = masked_softmax(scores, full)  # (B, Nq, N)
    out = weights @ v  # (B, Nq, dv)
    if flat:
        return out[0, :, 0], weights[0]  # (Nq,), (Nq, N)
    return out, weights


def nadaraya_watson(
    queries: Tensor, keys: Tensor, values: Tensor, kernel: nn.Module, *, mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Nadaraya–Watson regression ``f(x) = Σ_i softmax_i(a(x, x_i)) y_i``.

    Nadaraya 1964, https://doi.org/10.1137/1109020; Watson 1964, https://www.jstor.org/stable/25049340.

    Args:
        queries: where to predict, ``(Nq,)`` or ``(B, Nq, d)``.
        keys: the training inputs ``x_i``, ``(N,)`` or ``(B, N, d)``.
        values: the training targets ``y_i``, ``(N,)`` or ``(B, N, dv)``.
        kernel: a scoring module, e.g. :class:`~tokennet.attention.scores.GaussianKernel`.
        mask: optional boolean ``(Nq, N)`` / ``(B, Nq, N)``, True = may attend (e.g. ``~eye`` for
            leave-one-out).

    Returns:
        ``(predictions, weights)``: ``(Nq,)`` and ``(Nq, N)`` for 1-D inputs, ``(B, Nq, dv)`` and
        ``(B, Nq, N)`` for batched ones. Each row of ``weights`` sums to 1 (or is all zeros when the
        query can attend to nothing).
    """
    return _pool(kernel, queries, keys, values, mask)


class AttentionPooling(nn.Module):
    """Attention pooling ``f(x) = Σ_i α(x, x_i) y_i`` with ``α = masked_softmax(kernel(x, x_i))``.

    Holds the kernel (and so its learnable parameters, e.g. a Gaussian bandwidth); see
    :func:`nadaraya_watson` for shapes.

    Args:
        kernel: a scoring module from :mod:`tokennet.attention.scores` (any module mapping
            ``(B, Nq, d), (B, N, d) -> (B, Nq, N)`` works; a ``mask(queries, keys)`` method, if
            present, restricts the weights to its support).
    """

    def __init__(self, kernel: nn.Module):
        super().__init__()
        self.kernel = kernel

    def forward(
        self,
        queries: Tensor,
        keys: Tensor,
        values: Tensor,
        mask: Tensor | None = None,
        return_weights: bool = False,
    ):
        """Pool ``values`` for each query; returns ``out`` or ``(out, weights)`` when ``return_weights``.

        Args:
            queries: ``(Nq,)`` or ``(B, Nq, d)``.
            keys: ``(N,)`` or ``(B, N, d)``.
            values: ``(N,)`` or ``(B, N, dv)``.
            mask: optional boolean, broadcastable to ``(Nq, N)`` / ``(B, Nq, N)``; True = may attend.
            return_weights: also return the attention weights.
        """
        out, weights = _pool(self.kernel, queries, keys, values, mask)
        return (out, weights) if return_weights else out


def average_pooling(queries: Tensor, values: Tensor) -> Tensor:
    """The baseline ``f(x) = (1/N) Σ_i y_i``: every query gets the mean of the values.

    Attention pooling with uniform weights ``α(x, x_i) = 1/N``.

    Args:
        queries: ``(Nq,)`` or ``(B, Nq, d)``; only their number is used.
        values: ``(N,)`` or ``(B, N, dv)``.

    Returns:
        ``(Nq,)`` or ``(B, Nq, dv)``.
    """
    if queries.dim() == 1 and values.dim() == 1:
        return values.mean().expand(queries.shape[0])  # (Nq,)
    if queries.dim() == 3 and values.dim() == 3 and queries.shape[0] == values.shape[0]:
        B, n_queries, _ = queries.shape
        return values.mean(dim=1, keepdim=True).expand(B, n_queries, values.shape[-1])  # (B, Nq, dv)
    raise ValueError(
        f"expected 1-D queries (Nq,) and values (N,), or batched (B, Nq, d) and (B, N, dv) with the same B; "
        f"got {tuple(queries.shape)} and {tuple(values.shape)}"
    )
