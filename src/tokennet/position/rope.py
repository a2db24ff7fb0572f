"""Rotary position embedding, RoPE (Su et al. 2021, https://arxiv.org/abs/2104.09864).

Each query and key is rotated by an angle proportional to its position: pair j of channels turns by
i·θ_j with θ_j = base^(−2j/E). Rotations compose, so the score depends only on the offset:

    ⟨R_i q, R_j k⟩ = ⟨q, R_(j−i) k⟩.

Pairs follow the "rotate_half" layout of GPT-NeoX / HF Llama: channel j is paired with j + E/2, and
x' = x ⊙ cos + rotate_half(x) ⊙ sin with cos, sin = cos/sin(cat([i θ, i θ])).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["RotaryEmbedding", "apply_rope", "rotate", "rotate_half"]


class RotaryEmbedding(nn.Module):
    """The (cos, sin) tables of RoPE for positions offset..offset+n−1, each (n, E).

    Computed once per forward of a model and passed down to every attention layer.

    Args:
        head_dim: per-head width E (even).
        base: the wavelength scale; θ_j = base^(−2j/E).
    """

    def __init__(self, head_dim: int, base: float = 10000.0):
        super().__init__()
        if head_dim <= 0 or head_dim % 2:
            raise ValueError(f"RoPE rotates pairs of channels: head_dim must be even and > 0, got {head_dim}")
        if base <= 0:
            raise ValueError(f"base must be > 0, got {base}; the usual value is 10000.0")
        self.head_dim, self.base = head_dim, base
        if torch.get_default_device().type == "meta":  # a model built without storage to check a file's shapes:
            # no table is computed (meta's arange would load torch._dynamo, and a damaged header's head_dim of
            # 2**29 would make the CPU compute gigabytes of it); to_empty/`.to` move the buffer with the model
            self.register_buffer("inv_freq", torch.empty(head_dim // 2, device="meta"), persistent=False)
            return
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device="cpu") / head_dim)  # (E/2,)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    def forward(self, n: int, offset: int = 0, *, device=None, dtype=None) -> tuple[Tensor, Tensor]:
        """Return (cos, sin), each (n, E), for positions offset..offset+n−1.

        Args:
            n: number of positions.
            offset: first position (the KV-cache length during decoding).
            device: device of the tables (default: the module's).
            dtype: dtype of the tables (default float32). Angles are computed in float32 as in
                GPT-NeoX / HF Llama, or in float64 when dtype is float64.
        """
        if n < 0 or offset < 0:
            raise ValueError(f"n and offset must be >= 0, got n={n}, offset={offset}")
        device = self.inv_freq.device if device is None else device
        dtype = torch.float32 if dtype is None else dtype
        if dtype == torch.float64:
            work = torch.float64
            two_j = torch.arange(0, self.head_dim, 2, device=device, dtype=work)  # 2j
            inv_freq = self.base ** (-two_j / self.head_dim)  # (E/2,)
        else:
            work = torch.float32
            inv_freq = self.inv_freq.to(device=device, dtype=work)
        pos = torch.arange(offset, offset + n, device=device, dtype=work)  # (n,)
        freqs = pos[:, None] * inv_freq[None, :]  # (n, E/2)
        cos, sin = self.cos_sin(freqs)
        return cos.to(dtype), sin.to(dtype)

    def cos_sin(self, freqs: Tensor) -> tuple[Tensor, Tensor]:
        """Angles ``(..., E/2)`` → ``(cos, sin)``, each ``(..., E)``: channel j and j + E/2 share an angle."""
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos(), emb.sin()

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base}"


def rotate_half(x: Tensor) -> Tensor:
    """[x1, x2] → [−x2, x1] on the last dim: a 90° turn of each pair (j, j + E/2)."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate queries or keys: x' = x ⊙ cos + rotate_half(x) ⊙ sin.

    Args:
        x: queries or keys (B, H, N, E).
        cos: (N, E) from :class:`RotaryEmbedding` (or anything broadcastable to x).
        sin: (N, E), like cos.

    Returns:
        Tensor like x, in x's dtype.
    """
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have one shape, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if x.dim() < 2 or cos.dim() < 2 or cos.shape[-1] != x.shape[-1] or cos.shape[-2] != x.shape[-2]:
        raise ValueError(f"cos/sin of shape {tuple(cos.shape)} do not match x of shape {tuple(x.shape)}; "
                         "build them with RotaryEmbedding(head_dim)(N, offset) for x (B, H, N, E)")
    return rotate(x, cos.to(x.dtype), sin.to(x.dtype))


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """:func:`apply_rope`'s formula without its checks, for a caller that built the tables for ``x`` itself (a
    decoding step's hot path): ``x ⊙ cos + rotate_half(x) ⊙ sin``, in these operations and this order."""
    return x * cos + rotate_half(x) * sin
