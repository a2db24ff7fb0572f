"""ALiBi: attention with linear biases (Press et al. 2022, https://arxiv.org/abs/2108.12409).

No position is added to the tokens; each head h instead adds a penalty linear in the distance to
its scores:

    A = softmax(Q Kᵀ / √E + bias),   bias[h, i, j] = −m_h · (i − j),

with head slopes m_h = 2^(−8h/H), h = 1..H, a geometric sequence (1/2, 1/4, ..., 1/256 for H = 8).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["alibi_slopes", "alibi_bias", "ALiBi"]


def _slopes(num_heads: int) -> list[float]:
    if math.log2(num_heads).is_integer():
        return [2.0 ** (-8.0 * head / num_heads) for head in range(1, num_heads + 1)]
    # Not a power of 2: the slopes of the closest smaller power of 2, then every other slope of the next
    # power of 2 (the reference implementation of Press et al.), so the slopes interleave.
    closest = 2 ** math.floor(math.log2(num_heads))
    return _slopes(closest) + _slopes(2 * closest)[0::2][: num_heads - closest]


def alibi_slopes(num_heads: int) -> Tensor:
    """Head slopes m_h = 2^(−8h/H), h = 1..H (with the paper's rule when H is not a power of 2).

    Args:
        num_heads: number of heads H.

    Returns:
        float32 Tensor of shape (H,).
    """
    if not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"num_heads must be an int >= 1, got {num_heads!r}")
    return torch.tensor(_slopes(num_heads), dtype=torch.float32)


def _bias(slopes: Tensor, n_q: int, n_k: int | None) -> Tensor:
    n_k = n_q if n_k is None else n_k
    if n_q < 0 or n_k < n_q:
        raise ValueError(f"need 0 <= n_q <= n_k (queries are the last n_q of the n_k keys), "
                         f"got n_q={n_q}, n_k={n_k}")
    q_pos = torch.arange(n_k - n_q, n_k, device=slopes.device, dtype=slopes.dtype)  # (n_q,)
    k_pos = torch.arange(n_k, device=slopes.device, dtype=slopes.dtype)  # (n_k,)
    dist = q_pos[:, None] - k_pos[None, :]  # (n_q, n_k): i − j, negative for future keys
    return -slopes[:, None, None] * dist[None]  # (H, n_q, n_k)


def alibi_bias(num_heads: int, n_q: int, n_k: int | None = None, *, device=None,
               dtype: torch.dtype = torch.float32) -> Tensor:
    """ALiBi bias[h, i, j] = −m_h · (pos_i − j), added to the attention scores.

    Queries are the last n_q of the n_k key positions, pos_i = n_k − n_q + i, as when decoding with a
    KV cache. Future keys (j > pos_i) get the same linear formula, i.e. a positive bias; a causal mask
    removes them. Add it to scores of shape (B, H, n_q, n_k); it broadcasts over B.

    Args:
        num_heads: number of heads H.
        n_q: number of queries.
        n_k: number of keys (default n_q).
        device: device of the result.
        dtype: dtype of the result.

    Returns:
        Tensor of shape (H, n_q, n_k).
    """
    return _bias(alibi_slopes(num_heads).to(device=device, dtype=dtype), n_q, n_k)


class ALiBi(nn.Module):
    """ALiBi bias as a module: forward(n_q, n_k) → (H, n_q, n_k); slopes kept as a non-persistent buffer.

    Args:
        num_heads: number of heads H.
    """

    def __init__(self, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.register_buffer("slopes", alibi_slopes(num_heads), persistent=False)

    def forward(self, n_q: int, n_k: int | None = None) -> Tensor:
        """Return the (H, n_q, n_k) bias, queries being the last n_q of the n_k positions.

        Args:
            n_q: number of queries.
            n_k: number of keys (default n_q).
        """
        return _bias(self.slopes, n_q, n_k)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"
