"""Multi-head attention: one class for self- and cross-attention, with grouped-query heads and a KV cache.

Per head ``h``: ``head_h = softmax(Q_h K_hᵀ / √E) V_h`` with ``Q_h = X W_q^h``, ``K_h = C W_k^h``,
``V_h = C W_v^h`` where ``C = X`` (self-attention) or the context (cross-attention); the heads are
concatenated and projected: ``MHA(X, C) = [head_1, …, head_H] W_o``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..dropout import Dropout
from ..position.rope import apply_rope
from .functional import BACKENDS, attention

__all__ = ["MultiHeadAttention", "KVCache", "one_query_attention", "use_kernel"]


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
        self.k.narrow(2, self.length, n).copy_(k)  # narrow and copy_: two calls, where slice assignment takes ~6
        self.v.narrow(2, self.length, n).copy_(v)  # (a decoding step appends once per layer)
        self.length += n
        return self.k.narrow(2, 0, self.length), self.v.narrow(2, 0, self.length)

    def reset(self) -> None:
        """Forget every cached token (the buffers are kept)."""
        self.length = 0

    def reorder(self, index: Tensor) -> None:
        """Select batch rows, e.g. the surviving hypotheses of a beam search."""
        if self.k is not None:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)


def one_query_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """``softmax(q Kᵀ / √E) V`` for one query per head, written elementwise, grouped-query heads included.

    ``q (B, H, 1, E)``, ``k, v (B, Hkv, L, E)`` → ``(B, H, 1, E)``. A decoding step's attention, as a compiled
    step computes it: Inductor fuses these sums into the step's own loops, where a call of the fused
    attention kernel per layer would cost more than the few thousand multiplications it does.
    ``mask``: boolean ``(B or 1, 1, 1, L)``, True = may attend (the serving engine's rows at their own lengths);
    a row with no key left gives 0, as :func:`~tokennet.attention.functional.attention` does.
    """
    B, H, _, E = q.shape
    Hkv = k.shape[1]
    q_grouped = q.reshape(B, Hkv, H // Hkv, 1, E).float()  # (B, Hkv, g, 1, E): the g query heads of each key head
    scores = (q_grouped * k[:, :, None].float()).sum(-1) * E**-0.5  # (B, Hkv, g, L)
    if mask is not None:  # (B, 1, 1, L) broadcasts over (Hkv, g)
        has_any = mask.any(dim=-1, keepdim=True)  # a row without keys attends everywhere, then is zeroed
        scores = scores.masked_fill(~(mask | ~has_any), float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    out = (weights[..., None] * v[:, :, None].float()).sum(-2)  # (B, Hkv, g, E)
    if mask is not None:
        out = out * has_any.to(out.dtype)
    return out.reshape(B, H, 1, E).to(q.dtype)


AttentionKernel = Callable[..., "Tensor | None"]


def use_kernel(net: nn.Module, kernel: AttentionKernel | None) -> None:
    """Install ``kernel`` in every self-attention of ``net`` (None: the layers' own backend again).

    The lecture's attention stays the lecture's: :class:`MultiHeadAttention` computes ``softmax(Q Kᵀ / √E) V`` with
    its backend, and a decoding engine that wants another kernel for some calls (a compiled one-query step, say)
    installs it from outside; the kernel answers None for the calls it leaves to the backend."""
    for m in net.modules():
        if isinstance(m, MultiHeadAttention):
            m.kernel = kernel


class MultiHeadAttention(nn.Module):
    """Multi-head attention for self- and cross-attention (Vaswani et al. 2017).

    ``forward(x, context=None)`` is self-attention; with a ``context`` it is cross-attention (queries
    from ``x``, keys and values from ``context``). ``num_kv_heads < num_heads`` gives grouped-query
    attention (Ainslie et al. 2023, https://arxiv.org/abs/2305.13245): each key/value head serves
    ``num_heads / num_kv_heads`` query heads.

    The projections are parameters themselves, never a copy derived from them (an optimizer may update
    parameters in place without telling anyone, so a cached copy would go stale):

    - a self-attention layer (``context_dim=None``) holds ``[W_q; W_k; W_v]`` as one projection
      ``qkv_proj`` (nanoGPT's ``c_attn``), so Q, K and V cost one matmul. Given a context of width
      ``dim`` it still cross-attends, with views of the same matrix (like ``nn.MultiheadAttention``);
    - a cross-attention layer (``context_dim`` given) holds ``q_proj`` (D → H·E) for the queries and
      ``kv_proj`` (Dc → 2·Hkv·E) for the context's keys and values.

    Checkpoints written with separate ``q_proj``/``k_proj``/``v_proj`` load unchanged: their tensors are
    concatenated into the fused ones on load (:meth:`_load_from_state_dict`).

    Args:
        dim: model width D (the queries' width).
        num_heads: number of heads H; must divide ``dim`` unless ``head_dim`` is given.
        num_kv_heads: key/value heads (default ``num_heads``); must divide ``num_heads``.
        context_dim: width Dc of the context: builds a cross-attention layer (default: self-attention).
        head_dim: per-head width E (default ``dim // num_heads``).
        bias: use biases in the projections.
        dropout: dropout on the attention weights and the output.
        backend: attention backend, see :func:`tokennet.attention.attention`.
        qk_norm: RMS-normalize each head's queries and keys (learned gain, per head width E) before the
            scores, ``q ← q / rms(q) ⊙ g_q`` (Dehghani et al. 2023, https://arxiv.org/abs/2302.05442): the
            logits stay bounded, so higher learning rates train stably.
        value_proj: learn ``W_v`` (default). ``False`` takes ``W_v = I``, ``V = C``: the lecture's *"One could
            simply take W_v to be the identity; it's just extra expressivity"* (needs ``Hkv·E`` equal to the
            context's width; ``W_o`` remains).
        query_mlp: a cross-attention layer's queries from an MLP of this hidden width, ``Q = GELU(X W_1 + b_1)
            W_2 + b_2``, instead of ``Q = X W_q`` (0, the default: linear). The transcript: the query function
            "is just a linear projection of the token vector … But it could be other functions … It could be an
            MLP". A query that is not affine in ``x`` can pick different keys for inputs no linear map separates.
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
        qk_norm: bool | Callable[[int], nn.Module] = False,
        value_proj: bool = True,
        query_mlp: int = 0,
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
        if context_dim is not None and context_dim < 1:
            raise ValueError(f"context_dim must be positive, got {context_dim}")
        if isinstance(query_mlp, bool) or not isinstance(query_mlp, int) or query_mlp < 0:
            raise ValueError(f"query_mlp is the hidden width of the query MLP (0: linear queries), got {query_mlp!r}")
        if query_mlp and context_dim is None:
            raise ValueError("query_mlp needs a cross-attention layer (context_dim given): self-attention computes "
                             "its queries with the keys and values in one fused projection")
        self.dim, self.num_heads, self.num_kv_heads, self.head_dim = dim, num_heads, num_kv_heads, head_dim
        self.context_dim = dim if context_dim is None else context_dim
        self.is_cross = context_dim is not None
        self.dropout, self.backend = dropout, backend
        # A decoding engine's attention kernel (use_kernel): a function of (q, k, v, mask, *, bias, dropout,
        # return_weights, is_causal) giving the output, or None for a call it does not take. Not state: never saved.
        self.kernel: AttentionKernel | None = None
        self.q_dim, self.kv_dim = num_heads * head_dim, num_kv_heads * head_dim  # H·E and Hkv·E
        if not value_proj and self.kv_dim != self.context_dim:
            raise ValueError(f"value_proj=False (W_v = I) needs num_kv_heads·head_dim = {self.kv_dim} equal to the "
                             f"context's width {self.context_dim}")
        self.value_proj = value_proj
        self.v_dim = self.kv_dim if value_proj else 0  # the rows of W_v in the fused projection (none when W_v = I)
        if self.is_cross:
            self.q_proj = (nn.Sequential(nn.Linear(dim, query_mlp, bias=bias), nn.GELU(),
                                         nn.Linear(query_mlp, self.q_dim, bias=bias)) if query_mlp
                           else nn.Linear(dim, self.q_dim, bias=bias))
            self.kv_proj = nn.Linear(context_dim, self.kv_dim + self.v_dim, bias=bias)
        else:
            self.qkv_proj = nn.Linear(dim, self.q_dim + self.kv_dim + self.v_dim, bias=bias)
        self.out_proj = nn.Linear(self.q_dim, dim, bias=bias)
        self.out_drop = (Dropout(dropout) if dropout > 0 else nn.Identity())
        kind = qk_norm if callable(qk_norm) else (lambda width: nn.RMSNorm(width)) if qk_norm else None
        self.q_norm = kind(head_dim) if kind else None
        self.k_norm = kind(head_dim) if kind else None

    # -- projections --------------------------------------------------------------------------------
    def _heads(self, t: Tensor, h: int) -> Tensor:
        B, N, _ = t.shape
        return t.reshape(B, N, h, self.head_dim).transpose(1, 2)  # (B, h, N, E)

    def project_q(self, x: Tensor) -> Tensor:
        """Queries ``Q = X W_q`` ``(B, N, H·E)`` (``query_mlp``: ``Q = MLP(X)``)."""
        if self.is_cross:
            return self.q_proj(x)
        qkv_bias = self.qkv_proj.bias
        return F.linear(x, self.qkv_proj.weight[: self.q_dim], None if qkv_bias is None else qkv_bias[: self.q_dim])

    def project_kv(self, context: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of a context, ``K = C W_k`` and ``V = C W_v``, each ``(B, M, Hkv·E)``."""
        if self.is_cross:
            keys_values = self.kv_proj(context)
        else:  # a view of the fused matrix's K and V rows: no copy
            qkv_bias = self.qkv_proj.bias
            keys_values = F.linear(context, self.qkv_proj.weight[self.q_dim :],
                                   None if qkv_bias is None else qkv_bias[self.q_dim :])
        if not self.value_proj:  # W_v = I: the values are the context's tokens themselves
            return keys_values, context
        return keys_values.split([self.kv_dim, self.kv_dim], -1)

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention's ``Q, K, V`` with one matmul against ``[W_q; W_k; W_v]``."""
        if self.is_cross:
            return (self.project_q(x), *self.project_kv(x))
        if not self.value_proj:
            return (*self.qkv_proj(x).split([self.q_dim, self.kv_dim], -1), x)
        return self.qkv_proj(x).split([self.q_dim, self.kv_dim, self.kv_dim], -1)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Older checkpoints hold separate q_proj/k_proj/v_proj: concatenate them into the fused rows.
        for part in ("weight", "bias"):
            q, k, v = (prefix + f"{n}_proj.{part}" for n in "qkv")
            if k in state_dict and v in state_dict:
                kv_param = torch.cat([state_dict.pop(k), state_dict.pop(v)])
                if self.is_cross:
                    state_dict[prefix + f"kv_proj.{part}"] = kv_param
                elif q in state_dict:
                    state_dict[prefix + f"qkv_proj.{part}"] = torch.cat([state_dict.pop(q), kv_param])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

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
            return_weights: also return ``A`` ``(B, H, N, Nk)``, computed with the plain formula (the
                fused kernels never form ``A``), so a model trained with a fused backend can be inspected.
        """
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape (B, N, {self.dim}), got {tuple(x.shape)}")
        B, N, _ = x.shape
        cross = context is not None
        if self.is_cross and not cross:
            raise ValueError("this is a cross-attention layer (built with context_dim): pass context=(B, M, Dc)")
        if rope is not None and cross:
            raise ValueError("rope applies to self-attention only; cross-attention has no shared positions")
        if cross:
            q, k, v = self._cross_qkv(x, context, cache)
        else:
            q, k, v = self._self_qkv(x, rope, cache)
        out = self._attend(q, k, v, mask, bias=bias, is_causal=is_causal and not cross, cross=cross,
                           return_weights=return_weights)
        if return_weights:
            out, weights = out
        out = out.transpose(1, 2).reshape(B, N, self.q_dim)  # (B, N, H·E)
        out = self.out_drop(self.out_proj(out))
        return (out, weights) if return_weights else out

    def _cross_qkv(self, x: Tensor, context: Tensor, cache: KVCache | None) -> tuple[Tensor, Tensor, Tensor]:
        """Queries from ``x``, keys and values from ``context`` (computed once into a static cache and reused)."""
        B = x.shape[0]
        q = self._heads(self.project_q(x), self.num_heads)  # (B, H, N, E)
        if self.q_norm is not None:
            q = self.q_norm(q)
        if cache is not None and cache.static and cache.k is not None:
            return q, cache.k, cache.v  # cross-attention keys/values computed once
        if context.dim() != 3 or context.shape[0] != B or context.shape[-1] != self.context_dim:
            raise ValueError(f"context must have shape (B={B}, M, {self.context_dim}), got {tuple(context.shape)}")
        k, v = self.project_kv(context)
        k = self._heads(k, self.num_kv_heads)  # (B, Hkv, M, E)
        v = self._heads(v, self.num_kv_heads)  # (B, Hkv, M, E)
        if self.k_norm is not None:
            k = self.k_norm(k)
        if cache is not None:
            k, v = cache.append(k, v)
        return q, k, v

    def _self_qkv(self, x: Tensor, rope: tuple[Tensor, Tensor] | None,
                  cache: KVCache | None) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values from ``x`` (rotated by ``rope``), the keys and values appended to ``cache``."""
        if rope is not None and self.k_norm is None:
            # Q and K are adjacent columns of [W_q; W_k; W_v]'s output: one rotation turns both.
            q_and_k, v = self.qkv_proj(x).split([self.q_dim + self.kv_dim, self.v_dim], -1)
            v = v if self.value_proj else x
            q_and_k = apply_rope(self._heads(q_and_k, self.num_heads + self.num_kv_heads), *rope)  # (B, H+Hkv, N, E)
            q, k = q_and_k.split([self.num_heads, self.num_kv_heads], 1)  # (B, H, N, E), (B, Hkv, N, E)
        else:
            q, k, v = self.project_qkv(x)
            q = self._heads(q, self.num_heads)  # (B, H, N, E)
            k = self._heads(k, self.num_kv_heads)  # (B, Hkv, N, E)
            if self.k_norm is not None:  # before rope: normalize contents, then rotate by position
                q, k = self.q_norm(q), self.k_norm(k)
            if rope is not None:
                q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        v = self._heads(v, self.num_kv_heads)  # (B, Hkv, N, E)
        if cache is not None:
            k, v = cache.append(k, v)
        return q, k, v

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, *, bias: Tensor | None,
                is_causal: bool, cross: bool, return_weights: bool):
        """``softmax(Q Kᵀ / √E + bias) V`` under ``mask``: the kernel of :attr:`backend` (the plain formula when the
        weights are asked for), unless a decoding engine installed a :attr:`kernel` that takes this call."""
        dropout = self.dropout if self.training else 0.0
        if self.kernel is not None and not cross:  # a decoding engine's choice (use_kernel), for the calls it takes
            out = self.kernel(q, k, v, mask, bias=bias, dropout=dropout, return_weights=return_weights,
                              is_causal=is_causal)
            if out is not None:
                return out
        return attention(q, k, v, mask, bias=bias, is_causal=is_causal, dropout=dropout,
                         backend="math" if return_weights else self.backend, return_weights=return_weights)
