"""Positions concatenated to the tokens instead of added: ``position_mode="concat"``.

The lecture's transcript: *"I can concatenate each token with a value that tells me where it came from in the
input signal"*. Added positions, ``x_i ← x_i + P_i``, share the token's D dimensions with its content;
concatenated ones give the position dimensions of its own, ``x_i ← [x_i ; P_i]``, so a token embedded at width
``D − D_p`` leaves the step at width D. (A linear map applied after a concatenation is an addition,
``[x ; p] W = x W_x + p W_p``, so the two differ in what the first layer must learn, not in what it can.)

:class:`ConcatPosition` wraps any additive encoding (learned, sinusoidal): its table is the encoding added to
zeros, ``P = enc(0)``, so one module of each encoding serves both modes.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["POSITION_MODES", "ConcatPosition", "with_position_mode"]

POSITION_MODES = ("add", "concat")


class ConcatPosition(nn.Module):
    """``(B, N, D − D_p) → (B, N, D)``: ``[x ; P[offset : offset + N]]`` with ``P`` an additive encoding's table.

    Args:
        encoding: an additive position module of width ``D_p`` (``forward(x, offset) = x + P[offset:]``).
        pos_dim: its width ``D_p``.
    """

    def __init__(self, encoding: nn.Module, pos_dim: int):
        super().__init__()
        if pos_dim < 1:
            raise ValueError(f"pos_dim must be positive, got {pos_dim}")
        self.encoding, self.pos_dim = encoding, pos_dim

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """Concatenate each token with its position's vector: ``(B, N, D_x) → (B, N, D_x + D_p)``."""
        B, N, _ = x.shape
        table = self.encoding(x.new_zeros(1, N, self.pos_dim), offset)  # (1, N, D_p): the table's rows
        return torch.cat([x, table.expand(B, N, self.pos_dim)], dim=-1)  # (B, N, D_x + D_p)


def with_position_mode(encoding: nn.Module, position_mode: str, pos_dim: int) -> nn.Module:
    """The additive ``encoding`` as it is (``"add"``) or wrapped in :class:`ConcatPosition` (``"concat"``)."""
    if position_mode not in POSITION_MODES:
        raise ValueError(f"position_mode must be one of {POSITION_MODES}, got {position_mode!r}")
    return encoding if position_mode == "add" else ConcatPosition(encoding, pos_dim)
