"""2-D Fourier (sin-cos) positions for image patches, and random Fourier features.

For a patch at row r and column c of a (gh, gw) grid, with ω_k = base^(-k/(D/4)), k = 0..D/4-1:

    PE(r, c) = [sin(r ω), cos(r ω), sin(c ω), cos(c ω)]   (each block D/4 wide)

half of the channels encode the row and half the column, as in MAE's 2-D sin-cos embedding
(He et al. 2022, https://arxiv.org/abs/2111.06377). MAE puts the column half first; here the row half
comes first, which only permutes channels.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["fourier_2d", "Fourier2DPosition", "random_fourier_features"]


def _check(dim: int, base: float) -> None:
    if dim <= 0 or dim % 4:
        raise ValueError(f"fourier_2d needs dim divisible by 4 (sin, cos for rows and columns), got {dim}; "
                         "use a model width that is a multiple of 4")
    if base <= 0:
        raise ValueError(f"base must be > 0, got {base}; the usual value is 10000.0")


def _sincos_1d(pos: Tensor, dim: int, base: float) -> Tensor:
    """[sin(p ω), cos(p ω)] with ω_k = base^(-k/(dim/2)); pos (n,) → (n, dim)."""
    omega = base ** (-torch.arange(dim // 2, device=pos.device, dtype=torch.float64) / (dim // 2))  # (dim/2,)
    angles = pos[:, None] * omega[None, :]  # (n, dim/2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)  # (n, dim)


def fourier_2d(h: int, w: int, dim: int, base: float = 10000.0, *, device=None,
               dtype: torch.dtype = torch.float32) -> Tensor:
    """2-D sin-cos features of a (h, w) grid in row-major order: PE(r, c) = [sincos(r), sincos(c)].

    Args:
        h: number of rows of the grid.
        w: number of columns of the grid.
        dim: feature width D, divisible by 4; channels [0, D/2) encode the row, [D/2, D) the column.
        base: the wavelength scale.
        device: device of the result.
        dtype: dtype of the result (computed in float64, then cast).

    Returns:
        Tensor of shape (h·w, dim); row r·w + c belongs to the patch at row r, column c.
    """
    _check(dim, base)
    if h <= 0 or w <= 0:
        raise ValueError(f"grid sides must be > 0, got h={h}, w={w}")
    rows = torch.arange(h, device=device, dtype=torch.float64).repeat_interleave(w)  # (h·w,) r of each patch
    cols = torch.arange(w, device=device, dtype=torch.float64).repeat(h)  # (h·w,) c of each patch
    table = torch.cat([_sincos_1d(rows, dim // 2, base), _sincos_1d(cols, dim // 2, base)], dim=-1)  # (h·w, D)
    return table.to(dtype)


class Fourier2DPosition(nn.Module):
    """Adds 2-D sin-cos positions to patch tokens; prefix tokens (e.g. <cls>) get zeros.

    The table for the configured grid is cached as a non-persistent buffer; any other grid passed to
    :meth:`forward` is computed on the fly.

    Args:
        dim: model width D (divisible by 4).
        grid: the default patch grid (gh, gw).
        num_prefix: number of tokens before the patches.
        base: the wavelength scale.
    """

    def __init__(self, dim: int, grid: tuple[int, int], num_prefix: int = 0, base: float = 10000.0):
        super().__init__()
        _check(dim, base)
        if not isinstance(grid, (tuple, list)) or len(grid) != 2 or min(grid) <= 0:
            raise ValueError(f"grid must be a pair (gh, gw) of positive ints, got {grid}")
        if num_prefix < 0:
            raise ValueError(f"num_prefix must be >= 0, got {num_prefix}")
        self.dim, self.grid, self.num_prefix, self.base = dim, (int(grid[0]), int(grid[1])), num_prefix, base
        self.register_buffer("pe", fourier_2d(*self.grid, dim, base), persistent=False)

    def forward(self, x: Tensor, grid: tuple[int, int] | None = None) -> Tensor:
        """Return x with PE added to its last gh·gw tokens; x is (B, num_prefix + gh·gw, D).

        Args:
            x: tokens, prefix tokens first, then patches in row-major order.
            grid: the patch grid of x, if it differs from the configured one.
        """
        grid = self.grid if grid is None else tuple(grid)
        n_patch = grid[0] * grid[1]
        if x.dim() != 3 or x.shape[1] != self.num_prefix + n_patch or x.shape[2] != self.dim:
            raise ValueError(
                f"expected x of shape (B, {self.num_prefix + n_patch}, {self.dim}) = num_prefix "
                f"{self.num_prefix} + grid {grid[0]}x{grid[1]} tokens, got {tuple(x.shape)}; "
                "pass grid=(gh, gw) of the input")
        if grid == self.grid:
            table = self.pe
        else:
            table = fourier_2d(grid[0], grid[1], self.dim, self.base, device=x.device, dtype=self.pe.dtype)
        table = torch.cat([table.new_zeros(self.num_prefix, self.dim), table], dim=0)  # (N, D): zeros for prefix
        return x + table.to(x.dtype)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, grid={self.grid}, num_prefix={self.num_prefix}, base={self.base}"


def random_fourier_features(coords: Tensor, dim: int, sigma: float = 1.0,
                            generator: torch.Generator | None = None) -> Tensor:
    """Random Fourier features γ(v) = [cos(2π B v), sin(2π B v)], B_ij ~ N(0, σ²) (Tancik et al. 2020).

    B is drawn anew on every call: pass a seeded ``generator`` so that all calls share one B.
    https://arxiv.org/abs/2006.10739

    Args:
        coords: coordinates v of shape (..., C).
        dim: output width, even (dim/2 frequencies).
        sigma: std of the frequencies; larger σ resolves finer detail.
        generator: random generator for B (on the CPU; B is moved to coords' device).

    Returns:
        Tensor of shape (..., dim) in coords' dtype (float32 for integer coords).
    """
    if dim <= 0 or dim % 2:
        raise ValueError(f"random_fourier_features needs an even dim > 0 (cos and sin), got {dim}")
    if sigma <= 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    if coords.dim() < 1:
        raise ValueError("coords must have shape (..., C); got a scalar, use coords[None]")
    dtype = coords.dtype if coords.is_floating_point() else torch.float32
    B = torch.randn(dim // 2, coords.shape[-1], generator=generator) * sigma  # (dim/2, C)
    proj = 2 * math.pi * coords.to(dtype) @ B.to(coords.device, dtype).t()  # (..., dim/2)
    return torch.cat([proj.cos(), proj.sin()], dim=-1)
