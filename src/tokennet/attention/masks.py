"""Boolean attention masks: ``True`` means "may attend".

Every mask here is broadcastable to ``(B, H, Nq, Nk)``, the convention of
``torch.nn.functional.scaled_dot_product_attention``: entry ``[b, h, i, j]`` is True when query ``i``
may attend to key ``j``. Masks combine with ``&`` (both must allow) and ``|``.

These are the only functions in tokennet that build masks; models call them instead of writing
their own triangles.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["causal", "sliding_window", "window_band", "valid_lengths", "padding", "prefix", "adjacency", "check_mask"]


def _positions(n_q: int, n_k: int, device) -> tuple[Tensor, Tensor]:
    """Absolute positions of the queries (the last ``n_q`` of ``n_k``) and of the keys."""
    if n_q < 1 or n_k < 1:
        raise ValueError(f"mask sizes must be positive, got n_q={n_q}, n_k={n_k}")
    if n_k < n_q:
        raise ValueError(
            f"n_k={n_k} < n_q={n_q}: queries are the last n_q of the n_k positions, so n_k must be >= n_q"
        )
    qpos = torch.arange(n_k - n_q, n_k, device=device)[:, None]  # (Nq, 1)
    kpos = torch.arange(n_k, device=device)[None, :]  # (1, Nk)
    return qpos, kpos


def causal(n_q: int, n_k: int | None = None, *, device=None) -> Tensor:
    """Causal mask ``(Nq, Nk)``: token t attends to tokens 0..t only.

    When ``n_k > n_q`` the queries are the *last* ``n_q`` positions (decoding with a KV cache: the
    new tokens see everything cached before them).

    Args:
        n_q: number of queries.
        n_k: number of keys (defaults to ``n_q``).
        device: where to build the mask.
    """
    n_k = n_q if n_k is None else n_k
    qpos, kpos = _positions(n_q, n_k, device)
    return kpos <= qpos


def sliding_window(n_q: int, n_k: int | None = None, window: int = 1, *, device=None) -> Tensor:
    """Causal sliding-window mask ``(Nq, Nk)`` (Mistral, Gemma's local layers): the query at position i attends to
    the ``window`` most recent keys, ``i − window < j ≤ i``. Queries are the last ``n_q`` of ``n_k``, as in
    :func:`causal`.

    Args:
        n_q: number of queries.
        n_k: number of keys (defaults to ``n_q``).
        window: keys each query sees, itself included (≥ 1).
        device: where to build the mask.
    """
    n_k = n_q if n_k is None else n_k
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    qpos, kpos = _positions(n_q, n_k, device)
    return (kpos <= qpos) & (qpos - kpos < window)


def window_band(positions: Tensor, n_k: int, window: int) -> Tensor:
    """The window part of :func:`sliding_window` for per-row query positions: ``positions`` ``(B, Nq)`` →
    ``(B, 1, Nq, Nk)``, True where key j (at position j) is within ``window`` of the query, ``pos − j < window``
    (combine with a causal or key mask)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    keys = torch.arange(n_k, device=positions.device)
    return (positions[:, None, :, None] - keys < window)  # (B, 1, Nq, Nk)


def valid_lengths(lengths: Tensor, n_k: int) -> Tensor:
    """Mask of the valid keys, as in the masked softmax over valid lengths.

    ``lengths`` of shape ``(B,)`` gives one length per sequence and returns ``(B, 1, 1, Nk)``;
    shape ``(B, Nq)`` gives one length per query and returns ``(B, 1, Nq, Nk)``. Key ``j`` is valid
    when ``j < length``. A length of 0 masks the whole row (attention then returns zeros).

    Args:
        lengths: integer tensor of valid lengths.
        n_k: number of keys.
    """
    lengths = torch.as_tensor(lengths)
    if lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
        raise ValueError(f"lengths must be an integer tensor, got dtype {lengths.dtype}")
    if lengths.dim() not in (1, 2):
        raise ValueError(f"lengths must have shape (B,) or (B, Nq), got {tuple(lengths.shape)}")
    keys = torch.arange(n_k, device=lengths.device)
    if lengths.dim() == 1:
        return (keys < lengths[:, None])[:, None, None, :]  # (B, 1, 1, Nk)
    return (keys < lengths[..., None])[:, None, :, :]  # (B, 1, Nq, Nk)


def padding(is_pad: Tensor) -> Tensor:
    """Key-padding mask ``(B, 1, 1, N)`` from a boolean ``(B, N)`` tensor that is True at padding.

    Args:
        is_pad: True where the token is padding and must not be attended to.
    """
    if is_pad.dtype != torch.bool or is_pad.dim() != 2:
        raise ValueError(f"is_pad must be a boolean (B, N) tensor, got {is_pad.dtype} {tuple(is_pad.shape)}")
    return (~is_pad)[:, None, None, :]


def prefix(n_prefix: int, n_q: int, n_k: int | None = None, *, device=None) -> Tensor:
    """The cross-modality prefix mask ``(Nq, Nk)`` of a decoder-only model over [prefix; text].

    The first ``n_prefix`` tokens (e.g. image patches) attend to each other freely; every later token
    attends causally to everything before it, the whole prefix included:
    ``mask[i, j] = (j <= i) or (j < n_prefix)`` for a query at absolute position ``i``. Queries are
    the last ``n_q`` of ``n_k`` positions, as in :func:`causal`.

    Args:
        n_prefix: length of the bidirectional prefix.
        n_q: number of queries.
        n_k: number of keys (defaults to ``n_q``).
        device: where to build the mask.
    """
    n_k = n_q if n_k is None else n_k
    if n_prefix < 0:
        raise ValueError(f"n_prefix must be >= 0, got {n_prefix}")
    qpos, kpos = _positions(n_q, n_k, device)
    # Every query sees the whole prefix; beyond it, only the past. A prefix query never sees text.
    return (kpos <= qpos) | (kpos < n_prefix)


def adjacency(adj: Tensor, *, self_loops: bool = True) -> Tensor:
    """Graph mask: node i attends to node j when there is an edge (i, j).

    ``adj`` of shape ``(N, N)`` returns ``(N, N)``; ``(B, N, N)`` returns ``(B, 1, N, N)``. Any
    non-zero entry is an edge. With ``self_loops`` every node also attends to itself.

    Args:
        adj: adjacency matrix (bool, int or float).
        self_loops: add the diagonal.
    """
    if adj.dim() not in (2, 3) or adj.shape[-1] != adj.shape[-2]:
        raise ValueError(f"adj must be a square (N, N) or (B, N, N) matrix, got {tuple(adj.shape)}")
    m = adj != 0
    if self_loops:
        m = m | torch.eye(adj.shape[-1], dtype=torch.bool, device=adj.device)
    return m if m.dim() == 2 else m[:, None]


def check_mask(mask: Tensor, shape: tuple[int, int, int, int]) -> None:
    """Raise ``ValueError`` unless ``mask`` is boolean and broadcasts to ``shape`` = (B, H, Nq, Nk)."""
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be boolean (True = may attend), got dtype {mask.dtype}")
    if mask.dim() > 4:
        raise ValueError(f"mask must have at most 4 dims (B, H, Nq, Nk), got shape {tuple(mask.shape)}")
    try:
        out = torch.broadcast_shapes(mask.shape, shape)
    except RuntimeError:
        out = None
    if out != torch.Size(shape):
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to (B, H, Nq, Nk) = {tuple(shape)}"
        )
