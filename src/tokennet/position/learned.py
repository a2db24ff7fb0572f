"""Learned absolute positions: one trained vector per position (GPT-2, BERT) or per patch (ViT).

x_i ← x_i + P_i, with P a (max_len, D) parameter. A learned table cannot extrapolate past max_len;
it can only be resized by interpolation (as ViT does when fine-tuning at a higher resolution,
Dosovitskiy et al. 2021, https://arxiv.org/abs/2010.11929).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["LearnedPosition", "LearnedPosition2D"]


class LearnedPosition(nn.Module):
    """Learned 1-D positions: x + P[offset : offset + N], P ∈ R^(max_len × D).

    Args:
        max_len: number of positions with a trained vector.
        dim: model width D.
        init_std: std of the normal initialisation (0.02 as in GPT-2).
    """

    def __init__(self, max_len: int, dim: int, init_std: float = 0.02):
        super().__init__()
        if max_len <= 0 or dim <= 0:
            raise ValueError(f"max_len and dim must be > 0, got max_len={max_len}, dim={dim}")
        self.max_len, self.dim = max_len, dim
        self.weight = nn.Parameter(torch.randn(max_len, dim) * init_std)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """Return x + P[offset : offset + N] for x of shape (B, N, D).

        Args:
            x: token embeddings (B, N, D).
            offset: position of the first token (the KV-cache length during decoding).
        """
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"expected x of shape (B, N, {self.dim}), got {tuple(x.shape)}")
        n = x.shape[1]
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        if offset + n > self.max_len:
            raise ValueError(
                f"positions {offset}..{offset + n - 1} exceed max_len={self.max_len} of the learned table; "
                "shorten the input, or call resize(new_len) to interpolate the table to more positions")
        return x + self.weight[offset:offset + n].to(x.dtype)

    @torch.no_grad()
    def resize(self, new_len: int) -> LearnedPosition:
        """Resize the table to ``new_len`` positions by 1-D linear interpolation, in place.

        Uses F.interpolate(mode="linear", align_corners=False). The parameter is replaced, so build the
        optimizer after resizing.

        Args:
            new_len: the new number of positions.

        Returns:
            self.
        """
        if new_len <= 0:
            raise ValueError(f"new_len must be > 0, got {new_len}")
        table = self.weight.detach().float().t()[None]  # (1, D, max_len)
        table = F.interpolate(table, size=new_len, mode="linear", align_corners=False)  # (1, D, new_len)
        new = table[0].t().contiguous().to(self.weight.dtype)  # (new_len, D)
        self.weight = nn.Parameter(new, requires_grad=self.weight.requires_grad)
        self.max_len = new_len
        return self

    def extra_repr(self) -> str:
        return f"max_len={self.max_len}, dim={self.dim}"


class LearnedPosition2D(nn.Module):
    """Learned positions for a (gh, gw) grid of patches plus ``num_prefix`` tokens (e.g. <cls>), as in ViT.

    The table has num_prefix + gh·gw rows: prefix rows first, then the grid in row-major order. For
    another grid the grid part is resampled bicubically at call time (like timm's
    ``resample_abs_pos_embed``); prefix rows are kept as they are.

    Args:
        grid: the trained grid (gh, gw).
        dim: model width D.
        num_prefix: number of prefix tokens (0, or 1 for a <cls> token).
        init_std: std of the normal initialisation.
    """

    def __init__(self, grid: tuple[int, int], dim: int, num_prefix: int = 0, init_std: float = 0.02):
        super().__init__()
        self.grid = _check_grid(grid)
        if dim <= 0 or num_prefix < 0:
            raise ValueError(f"dim must be > 0 and num_prefix >= 0, got dim={dim}, num_prefix={num_prefix}")
        self.dim, self.num_prefix = dim, num_prefix
        grid_h, grid_w = self.grid
        self.weight = nn.Parameter(torch.randn(num_prefix + grid_h * grid_w, dim) * init_std)

    def interpolate(self, grid: tuple[int, int] | None = None) -> Tensor:
        """Return the (num_prefix + gh'·gw', D) table for ``grid`` (the trained one if None).

        The grid part is reshaped to an image (1, D, gh, gw) and resampled with bicubic interpolation
        (align_corners=False, antialiased when shrinking), as timm does for ViT fine-tuning.

        Args:
            grid: target grid (gh', gw').
        """
        grid = self.grid if grid is None else _check_grid(grid)
        if grid == self.grid:
            return self.weight
        grid_h, grid_w = self.grid
        prefix, rest = self.weight[: self.num_prefix], self.weight[self.num_prefix:]
        img = rest.float().reshape(grid_h, grid_w, self.dim).permute(2, 0, 1)[None]  # (1, D, gh, gw)
        img = F.interpolate(img, size=grid, mode="bicubic", align_corners=False, antialias=True)
        rest = img[0].permute(1, 2, 0).reshape(grid[0] * grid[1], self.dim)  # (gh'·gw', D)
        return torch.cat([prefix, rest.to(self.weight.dtype)], dim=0)

    def forward(self, x: Tensor, grid: tuple[int, int] | None = None) -> Tensor:
        """Return x + P(grid) for x of shape (B, num_prefix + gh'·gw', D).

        Args:
            x: tokens, prefix tokens first, then patches in row-major order.
            grid: the patch grid of x, if it differs from the trained grid.
        """
        table = self.interpolate(grid)  # (N, D)
        if x.dim() != 3 or tuple(x.shape[1:]) != tuple(table.shape):
            shown_grid = self.grid if grid is None else grid
            raise ValueError(
                f"expected x of shape (B, {table.shape[0]}, {self.dim}) = num_prefix {self.num_prefix} + "
                f"grid {shown_grid[0]}x{shown_grid[1]} tokens, got {tuple(x.shape)}; pass grid=(gh, gw) of the input")
        return x + table.to(x.dtype)

    def extra_repr(self) -> str:
        return f"grid={self.grid}, dim={self.dim}, num_prefix={self.num_prefix}"


def _check_grid(grid) -> tuple[int, int]:
    if not isinstance(grid, (tuple, list)) or len(grid) != 2 or min(grid) <= 0:
        raise ValueError(f"grid must be a pair (gh, gw) of positive ints, got {grid}")
    return int(grid[0]), int(grid[1])
