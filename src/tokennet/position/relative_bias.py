"""Relative position bias inside a window (Swin, Liu et al. 2021, https://arxiv.org/abs/2103.14030, eq. 4).

Within a ``wh × ww`` window the scores get a learned bias that depends only on the offset between the two
tokens, not on where they are::

    A = softmax(Q Kᵀ / √E + B),   B[i, j] = T[r_j − r_i, c_j − c_i]   (one table T per head)

The offsets range over ``(2·wh − 1) × (2·ww − 1)`` values, so the table ``T`` has that many rows per head;
an index ``(N, N)`` (N = wh·ww tokens, row-major) says which row each pair reads. Unlike absolute positions,
the bias is the same for every window (and for every shift of the windows), which is what lets Swin share
one table across the whole image.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["RelativePositionBias2D", "relative_position_index"]


def relative_position_index(window: tuple[int, int]) -> Tensor:
    """``(N, N)`` long: the table row of each (query, key) pair of a ``wh × ww`` window, N = wh·ww row-major.

    Row ``(Δr + wh − 1)·(2·ww − 1) + (Δc + ww − 1)`` for the offset ``(Δr, Δc) = (r_j − r_i, c_j − c_i)``.
    """
    win_h, win_w = window
    row, col = torch.meshgrid(torch.arange(win_h), torch.arange(win_w), indexing="ij")
    row, col = row.flatten(), col.flatten()  # (N,) each: the row and column of every token
    drow = row[None, :] - row[:, None] + win_h - 1  # (N, N) in 0 .. 2·wh − 2
    dcol = col[None, :] - col[:, None] + win_w - 1  # (N, N) in 0 .. 2·ww − 2
    return drow * (2 * win_w - 1) + dcol


class RelativePositionBias2D(nn.Module):
    """A learned bias per head and per 2-D offset inside a window: ``forward() → (H, N, N)``.

    Args:
        window: ``(wh, ww)``.
        num_heads: H.
        init_std: std of the truncated-normal initialisation (0.02, as Swin).
    """

    def __init__(self, window: tuple[int, int], num_heads: int, *, init_std: float = 0.02):
        super().__init__()
        win_h, win_w = window
        if win_h < 1 or win_w < 1 or num_heads < 1:
            raise ValueError(f"window and num_heads must be positive, got window={window}, num_heads={num_heads}")
        self.window, self.num_heads = (win_h, win_w), num_heads
        self.table = nn.Parameter(torch.empty((2 * win_h - 1) * (2 * win_w - 1), num_heads))
        nn.init.trunc_normal_(self.table, std=init_std)
        # A constant of the window's shape, not derived from parameters: it cannot go stale (and is not saved).
        self.register_buffer("index", relative_position_index((win_h, win_w)), persistent=False)

    def forward(self) -> Tensor:
        """The bias ``B`` ``(H, N, N)``: ``B[h, i, j] = T[index[i, j], h]``."""
        N = self.index.shape[0]
        return self.table[self.index.flatten()].view(N, N, self.num_heads).permute(2, 0, 1)  # (H, N, N)

    def extra_repr(self) -> str:
        return f"window={self.window}, num_heads={self.num_heads}"
