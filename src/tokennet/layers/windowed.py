"""Swin's layers: a block of (shifted) window attention on a token grid, and patch merging between stages.

A Swin block is the pre-norm transformer block with its attention restricted to windows (Liu et al. 2021,
https://arxiv.org/abs/2103.14030, eq. 3)::

    ẑ = z + DropPath(W-MSA(LN(z))),   z' = ẑ + DropPath(MLP(LN(ẑ)))

and the next block does the same with SW-MSA (shifted windows). Tokens stay a grid ``(B, h, w, D)`` from
block to block; the LayerNorms and the MLP act on each token alone, so only the attention sees windows.
Patch merging then concatenates each 2 × 2 group of neighbours (``4·D``), normalizes, and projects to
``2·D``: the grid halves and the width doubles, as a CNN's stride-2 stage does.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from ..attention.windows import WindowAttention
from .drop_path import DropPath
from .mlp import MLP

__all__ = ["SwinBlock", "PatchMerging"]


class SwinBlock(nn.Module):
    """One Swin block on a token grid: ``(B, h, w, D) → (B, h, w, D)``.

    Args:
        dim: width D.
        num_heads: heads H.
        window_size: the window M.
        shifted: shifted windows (SW-MSA), as every second block of a stage.
        mlp_ratio: MLP width as a multiple of D.
        dropout: dropout on attention weights, outputs and the MLP.
        drop_path: stochastic depth rate of both residual branches.
        bias: biases in linear layers and LayerNorms.
        norm_eps: LayerNorm epsilon.
        backend: attention backend.
    """

    def __init__(self, dim: int, num_heads: int, window_size: int | tuple[int, int], *, shifted: bool = False,
                 mlp_ratio: float = 4.0, dropout: float = 0.0, drop_path: float = 0.0, bias: bool = True,
                 norm_eps: float = 1e-5, backend: str = "auto"):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps, bias=bias)
        self.attn = WindowAttention(dim, num_heads, window_size, shifted=shifted, bias=bias, dropout=dropout,
                                    backend=backend)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps, bias=bias)
        self.mlp = MLP(dim, mlp_ratio=mlp_ratio, activation="gelu", dropout=dropout, bias=bias)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: Tensor, *, return_weights: bool = False):
        """``(B, h, w, D) → (B, h, w, D)``; with ``return_weights``, ``(x, {"self": A (B, H, h·w, h·w)})``."""
        hidden = self.attn(self.norm1(x), return_weights=return_weights)
        if return_weights:
            hidden, attn_weights = hidden
        x = x + self.drop_path(hidden)
        x = x + self.drop_path(self.mlp(self.norm2(x)))
        return (x, {"self": attn_weights}) if return_weights else x


class PatchMerging(nn.Module):
    """Concatenate each ``fh × fw`` group of neighbouring tokens, LayerNorm, project: ``(B, h, w, D) →
    (B, ⌈h/fh⌉, ⌈w/fw⌉, out_dim)``. An odd grid is zero-padded at the bottom and right first.

    The group's tokens are concatenated in Swin's order (``x[0::2, 0::2], x[1::2, 0::2], x[0::2, 1::2],
    x[1::2, 1::2]``). A 1-D grid (``h = 1``) merges pairs along its length: ``factor=(1, 2)``.

    Args:
        dim: input width D.
        out_dim: output width (Swin: 2·D).
        factor: ``(fh, fw)``, ``(2, 2)`` for images.
        norm_eps: LayerNorm epsilon.
    """

    def __init__(self, dim: int, out_dim: int | None = None, *, factor: tuple[int, int] = (2, 2),
                 norm_eps: float = 1e-5, bias: bool = True):
        super().__init__()
        factor_h, factor_w = factor
        self.factor, self.dim, self.out_dim = (factor_h, factor_w), dim, 2 * dim if out_dim is None else out_dim
        self.norm = nn.LayerNorm(factor_h * factor_w * dim, eps=norm_eps, bias=bias)
        self.reduction = nn.Linear(factor_h * factor_w * dim, self.out_dim, bias=False)

    def output_grid(self, grid: tuple[int, int]) -> tuple[int, int]:
        (height, width), (factor_h, factor_w) = grid, self.factor
        return -(-height // factor_h), -(-width // factor_w)

    def forward(self, x: Tensor) -> Tensor:
        B, height, width, D = x.shape
        factor_h, factor_w = self.factor
        grid_h, grid_w = self.output_grid((height, width))
        if (grid_h * factor_h, grid_w * factor_w) != (height, width):
            x = F.pad(x, (0, 0, 0, grid_w * factor_w - width, 0, grid_h * factor_h - height))  # (B, gh·fh, gw·fw, D)
        # (B, gh, gw, fw, fh, D): Swin's order
        x = x.view(B, grid_h, factor_h, grid_w, factor_w, D).permute(0, 1, 3, 4, 2, 5)
        x = x.reshape(B, grid_h, grid_w, factor_w * factor_h * D)  # (B, gh, gw, fh·fw·D)
        return self.reduction(self.norm(x))  # (B, gh, gw, out_dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, out_dim={self.out_dim}, factor={self.factor}"
