"""Multi-head attention: one class for self- and cross-attention, with grouped-query heads and a KV cache.

Per head ``h``: ``head_h = softmax(Q_h K_hᵀ / √E) V_h`` with ``Q_h = X W_q^h``, ``K_h = C W_k^h``,
``V_h = C W_v^h`` where ``C = X`` (self-attention) or the context (cross-attention); the heads are
concatenated and projected: ``MHA(X, C) = [head_1, …, head_H] W_o``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .functional import BACKENDS, attention

__all__ = ["MultiHeadAttention", "KVCache"]


class KVCache:
    """Keys and values of one attention layer, kept between decoding steps.

    For self-attention the cache is a preallocated ``(B, Hkv, max_len, E)`` buffer that grows by the
    new tokens' keys and values at each step, so a decoding step costs one query against the cache
    instead of recomputing every earlier token. For cross-attention (``static=True``) it holds the
    context's keys and values, computed once at the first step.

    Args:
        max_len: capacity in tokens (self-attention).
        static: a cross-attention cache, filled once.
    """

    def __init__(self, max_len: int = 0, *, static: bool = False):
        self.max_len = max_len
        self.static = static
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.length = 0

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store new ``(B, Hkv, n, E)`` keys/values; return all cached ones ``(B, Hkv, length, E)``."""
        if self.static:
            self.k, self.v, self.length = k, v, k.shape[2]
            return k, v
        B, Hkv, n, E = k.shape
        if self.k is None:
            self.k = k.new_empty(B, Hkv, self.max_len, E)
            self.v = v.new_empty(B, Hkv, self.max_len, v.shape[-1])
        if self.length + n > self.max_len:
            raise ValueError(
                f"KV cache full: {self.length} + {n} tokens > capacity {self.max_len}; "
                "reset it or decode with a sliding window"
            )
        self.k[:, :, self.length : self.length + n] = k
        self.v[:, :, self.length : self.length + n] = v
        self.length += n
        return self.k[:, :, : self.length], self.v[:, :, : self.length]

    def reset(self) -> None:
        """Forget every cached token (the buffers are kept)."""
        self.length = 0

    def reorder(self, index: Tensor) -> None:
        """Select batch rows, e.g. the surviving hypotheses of a beam search."""
        if self.k is not None:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)


class MultiHeadAttention(nn.Module):
    """Multi-head attention for self- and cross-attention (Vaswani et al. 2017).

    ``forward(x, context=None)`` is self-attention; with a ``context`` it is cross-attention (queries
    from ``x``, keys and values from ``context``). ``num_kv_heads < num_heads`` gives grouped-query
    attention (Ainslie et al. 2023, https://arxiv.org/abs/2305.13245): each key/value head serves
    ``num_heads / num_kv_heads`` query heads.

    Set ``store_weights = True`` to keep the last attention matrix in ``self.weights``
    ``(B, H, Nq, Nk)``: that call then uses the plain formula (the fused kernels never form ``A``), so
    a model trained with the fused backend can still be inspected.

    Args:
        dim: model width D (the queries' width).
        num_heads: number of heads H; must divide ``dim`` unless ``head_dim`` is given.
        num_kv_heads: key/value heads (default ``num_heads``); must divide ``num_heads``.
        context_dim: width of the context for cross-attention (default ``dim``).
        head_dim: per-head width E (default ``dim // num_heads``).
        bias: use biases in the projections.
        dropout: dropout on the attention weights and the output.
        backend: attention backend, see :func:`tokennet.attention.attention`.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        context_dim: int | None = None,
        head_dim: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        backend: str = "auto",
    ):
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if dim < 1 or num_heads < 1 or num_kv_heads < 1:
            raise ValueError(f"dim, num_heads, num_kv_heads must be positive, got {dim}, {num_heads}, {num_kv_heads}")
        if head_dim is None:
            if dim % num_heads:
                raise ValueError(f"num_heads={num_heads} must divide dim={dim} (or pass head_dim explicitly)")
            head_dim = dim // num_heads
        if num_heads % num_kv_heads:
            raise ValueError(f"num_kv_heads={num_kv_heads} must divide num_heads={num_heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if backend not in BACKENDS:
            raise ValueError(f"unknown attention backend {backend!r}; expected one of {', '.join(BACKENDS)}")
        context_dim = dim if context_dim is None else context_dim
        self.dim, self.num_heads, self.num_kv_heads, self.head_dim = dim, num_heads, num_kv_heads, head_dim
        self.dropout, self.backend = dropout, backend
        self.q_proj = nn.Linear(dim, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(context_dim, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(context_dim, num_kv_heads * head_dim, bias=bias)
        self.out_proj = nn.Linear(num_heads * head_dim, dim, bias=bias)
        self.out_drop = (nn.Dropout(dropout) if dropout > 0 else nn.Identity())
        self.store_weights = False
        self.weights: Tensor | None = None
        self._qkv_cache: tuple[tuple, Tensor, Tensor | None] | None = None

    def _qkv_params(self) -> tuple[Tensor, Tensor | None]:
        """``[W_q; W_k; W_v]`` and ``[b_q; b_k; b_v]`` for the one-matmul self-attention projection.

        With autograd recording, the concatenation is part of the graph (its copy is small next to the
        matmul over a training batch). Without it (evaluation, decoding one token at a time, where the
        copy would cost more than the matmul), the result is kept and reused until a parameter changes:
        in-place updates bump a tensor's version counter and moves change its storage, both in the key.
        """
        ps = [self.q_proj.weight, self.k_proj.weight, self.v_proj.weight]
        bs = None if self.q_proj.bias is None else [self.q_proj.bias, self.k_proj.bias, self.v_proj.bias]
        if torch.is_grad_enabled():
            return torch.cat(ps), None if bs is None else torch.cat(bs)
        key = tuple((t.data_ptr(), t._version, t.device, t.dtype) for t in ps + (bs or []))
        if self._qkv_cache is None or self._qkv_cache[0] != key:
            self._qkv_cache = (key, torch.cat(ps), None if bs is None else torch.cat(bs))
        return self._qkv_cache[1], self._qkv_cache[2]

    def _heads(self, t: Tensor, h: int) -> Tensor:
        B, N, _ = t.shape
        return t.reshape(B, N, h, self.head_dim).transpose(1, 2)  # (B, h, N, E)

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        is_causal: bool = False,
        rope: tuple[Tensor, Tensor] | None = None,
        bias: Tensor | None = None,
        cache: KVCache | None = None,
        return_weights: bool = False,
    ):
        """Multi-head attention: ``A = softmax(Q Kᵀ / √E) V`` per head; self-attention when context is None.

        Args:
            x: queries' tokens ``(B, N, D)``.
            context: keys' and values' tokens ``(B, M, Dc)`` for cross-attention.
            mask: boolean, broadcastable to ``(B, H, N, Nk)``; True = may attend.
            is_causal: causal self-attention (with a cache: the new tokens are the last positions).
            rope: ``(cos, sin)``, each ``(N, E)``, rotary angles of the new tokens' positions; applied
                to queries and keys of self-attention before the keys enter the cache.
            bias: additive float scores bias broadcastable to ``(B, H, N, Nk)`` (e.g. ALiBi).
            cache: a :class:`KVCache` to read and extend (self) or fill once and reuse (cross).
            return_weights: also return ``A`` ``(B, H, N, Nk)``.
        """
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape (B, N, {self.dim}), got {tuple(x.shape)}")
        B, N, _ = x.shape
        cross = context is not None
        if not cross:
            # Self-attention: one matmul against [W_q; W_k; W_v] instead of three small ones.
            qkv = F.linear(x, *self._qkv_params())
            q, k, v = qkv.split([self.q_proj.out_features, self.k_proj.out_features, self.v_proj.out_features], -1)
            q = self._heads(q, self.num_heads)  # (B, H, N, E)
            k = self._heads(k, self.num_kv_heads)  # (B, Hkv, N, E)
            v = self._heads(v, self.num_kv_heads)  # (B, Hkv, N, E)
        else:
            q = self._heads(self.q_proj(x), self.num_heads)  # (B, H, N, E)
        if cross and cache is not None and cache.static and cache.k is not None:
            k, v = cache.k, cache.v  # cross-attention keys/values computed once
        else:
            if cross:
                if context.dim() != 3 or context.shape[0] != B:
                    raise ValueError(f"context must have shape (B={B}, M, Dc), got {tuple(context.shape)}")
                k = self._heads(self.k_proj(context), self.num_kv_heads)  # (B, Hkv, M, E)
                v = self._heads(self.v_proj(context), self.num_kv_heads)  # (B, Hkv, M, E)
            if rope is not None and not cross:
                from ..position.rope import apply_rope

                q, k = apply_rope(q, *rope), apply_rope(k, *rope)
            if cache is not None:
                k, v = cache.append(k, v)
        if rope is not None and cross:
            raise ValueError("rope applies to self-attention only; cross-attention has no shared positions")
        need_weights = return_weights or self.store_weights
        out = attention(
            q,
            k,
            v,
            mask,
            bias=bias,
            is_causal=is_causal and not cross,
            dropout=self.dropout if self.training else 0.0,
            backend="math" if need_weights else self.backend,
            return_weights=need_weights,
        )
        if need_weights:
            out, a = out
            if self.store_weights:
                self.weights = a.detach()
        out = out.transpose(1, 2).reshape(B, N, self.num_heads * self.head_dim)  # (B, N, H·E)
        out = self.out_drop(self.out_proj(out))
        return (out, a) if return_weights else out
