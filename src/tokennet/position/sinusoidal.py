"""Fixed sinusoidal positions of "Attention Is All You Need" (Vaswani et al. 2017).

PE(i, 2j) = sin(i / base^(2j/D)),  PE(i, 2j+1) = cos(i / base^(2j/D)).

Each pair of channels is a point on a circle turning at its own frequency ω_j = base^(-2j/D), so a shift
by δ positions is one fixed rotation of every pair: PE(i + δ) = M_δ PE(i) for all i, where M_δ is
block-diagonal with 2×2 blocks [[cos ω_j δ, sin ω_j δ], [−sin ω_j δ, cos ω_j δ]].
https://arxiv.org/abs/1706.03762
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["sinusoidal_table", "SinusoidalPosition"]


def _check(dim: int, base: float) -> None:
    if dim <= 0 or dim % 2:
        raise ValueError(f"sinusoidal positions need an even dim > 0 (sin/cos pairs), got dim={dim}; "
                         "use an even model width")
    if base <= 0:
        raise ValueError(f"base must be > 0, got {base}; the usual value is 10000.0")


def _table(start: int, n: int, dim: int, base: float, device, dtype) -> Tensor:
    """Rows PE(start), ..., PE(start + n - 1); computed in float64 so large positions stay exact."""
    pos = torch.arange(start, start + n, device=device, dtype=torch.float64)  # (n,)
    inv_freq = base ** (-torch.arange(0, dim, 2, device=device, dtype=torch.float64) / dim)  # (D/2,)
    angles = pos[:, None] * inv_freq[None, :]  # (n, D/2)
    table = torch.stack([angles.sin(), angles.cos()], dim=-1)  # (n, D/2, 2): sin at 2j, cos at 2j+1
    return table.reshape(n, dim).to(dtype)  # (n, D)


def sinusoidal_table(n: int, dim: int, base: float = 10000.0, *, device=None,
                     dtype: torch.dtype = torch.float32) -> Tensor:
    """Sinusoidal position table PE(i, 2j) = sin(i / base^(2j/D)), PE(i, 2j+1) = cos(i / base^(2j/D)).

    Args:
        n: number of positions 0..n-1.
        dim: width D of each row; must be even.
        base: the wavelength scale (10000 in the paper); wavelengths run from 2π to 2π·base.
        device: device of the result.
        dtype: dtype of the result (computed in float64, then cast).

    Returns:
        Tensor of shape (n, dim).
    """
    _check(dim, base)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return _table(0, n, dim, base, device, dtype)


class SinusoidalPosition(nn.Module):
    """Adds fixed sinusoidal positions to token embeddings: x + PE[offset : offset + N].

    The table for ``max_len`` positions is cached as a non-persistent buffer (it is a formula, so it is
    not saved in the state_dict); longer inputs get a table computed on the fly.

    Args:
        dim: model width D (even).
        max_len: number of positions to cache.
        base: the wavelength scale of :func:`sinusoidal_table`.
    """

    def __init__(self, dim: int, max_len: int = 4096, base: float = 10000.0):
        super().__init__()
        _check(dim, base)
        if max_len < 0:
            raise ValueError(f"max_len must be >= 0, got {max_len}")
        self.dim, self.max_len, self.base = dim, max_len, base
        self.register_buffer("pe", sinusoidal_table(max_len, dim, base), persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """Return x + PE[offset : offset + N] for x of shape (B, N, D).

        Args:
            x: token embeddings (B, N, D).
            offset: position of the first token, e.g. the KV-cache length during decoding.
        """
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"expected x of shape (B, N, {self.dim}), got {tuple(x.shape)}")
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        n = x.shape[1]
        if offset + n <= self.max_len:
            table = self.pe[offset:offset + n]  # (N, D)
        else:
            table = _table(offset, n, self.dim, self.base, x.device, self.pe.dtype)  # (N, D)
        return x + table.to(x.dtype)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, max_len={self.max_len}, base={self.base}"
