"""Scaled dot-product attention, ``A = softmax(Q Kᵀ / √E) V``, with interchangeable backends.

Backends:

- ``"math"``: the formula as written in the lecture; materializes the attention matrix ``A`` and can
  return it. This is the reference every fast path is tested against.
- ``"sdpa"``: PyTorch's fused ``scaled_dot_product_attention`` (FlashAttention / memory-efficient
  kernels on GPU, a flash kernel on CPU); never materializes ``A``.
- ``"flash"``: tokennet's own FlashAttention-style tiled attention with an online softmax
  (:mod:`tokennet.attention.flash`), written for reading; slower than ``"sdpa"``.
- ``"auto"``: ``"sdpa"`` unless the call needs ``A`` (``return_weights=True``) or drops attention weights on a CPU
  (SDPA would fall back to the plain formula there, drawing its mask one unit at a time), then ``"math"``.

All backends agree on one rule: a query row whose mask is all False attends to nothing and yields
zeros (never NaN), in the forward and the backward pass.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..dropout import dropout as drop
from .masks import causal as causal_mask
from .masks import check_mask

__all__ = ["attention", "masked_softmax", "BACKENDS"]

BACKENDS = ("auto", "math", "sdpa", "flash")


def masked_softmax(scores: Tensor, mask: Tensor | None = None, dim: int = -1) -> Tensor:
    """Softmax over ``dim`` that gives masked entries exactly 0; a fully masked row gives all zeros.

    ``softmax(s)_j = exp(s_j) / Σ_{k valid} exp(s_k)`` for valid ``j``, ``0`` otherwise.

    Args:
        scores: attention scores, e.g. ``(B, H, Nq, Nk)``.
        mask: boolean, broadcastable to ``scores``; True = keep.
        dim: the dimension to normalize over.
    """
    if mask is None:
        return torch.softmax(scores, dim=dim)
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be boolean (True = may attend), got dtype {mask.dtype}")
    # A finite fill (not -inf) keeps fully masked rows free of NaN in forward and backward; the
    # final multiply makes masked entries exactly 0 and fully masked rows all zeros.
    filled = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.softmax(filled, dim=dim) * mask


def _check(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None, backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must have shape (B, H, N, E), got {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.dtype.is_floating_point:
        raise ValueError(f"q, k, v must be floating point, got {q.dtype}")
    B, H, _, E = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"batch sizes differ: q {q.shape[0]}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[-1] != E:
        raise ValueError(f"q and k need the same head width E, got q {E} and k {k.shape[-1]}")
    if k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} need the same (B, H, Nk)")
    if H % k.shape[1] != 0:
        raise ValueError(f"query heads ({H}) must be a multiple of key/value heads ({k.shape[1]})")
    shape = (B, H, q.shape[2], k.shape[2])
    if mask is not None:
        check_mask(mask, shape)
    if bias is not None:
        if not bias.dtype.is_floating_point:
            raise ValueError(f"bias must be a float tensor (added to the scores), got {bias.dtype}")
        try:
            ok = torch.broadcast_shapes(bias.shape, shape) == torch.Size(shape)
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(
                f"bias of shape {tuple(bias.shape)} does not broadcast to (B, H, Nq, Nk) = {shape}"
            )


def _expand_kv(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Grouped-query attention: repeat each key/value head for its group of query heads."""
    H, Hkv = q.shape[1], k.shape[1]
    if H == Hkv:
        return k, v
    group = H // Hkv
    B, _, n_keys, E = k.shape
    k = k[:, :, None].expand(B, Hkv, group, n_keys, E).reshape(B, H, n_keys, E)  # (B, H, Nk, E)
    v = v[:, :, None].expand(B, Hkv, group, n_keys, v.shape[-1]).reshape(B, H, n_keys, v.shape[-1])
    return k, v


def _kv_for_sdpa(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, dict]:
    """Keys and values for ``F.scaled_dot_product_attention``, and its keyword for grouped-query attention.

    On the CPU, SDPA's own ``enable_gqa`` reads each key/value head for its group of query heads, so the
    cache is not copied H/Hkv times at every decoding step; other devices get the expanded heads (not
    every fused CUDA kernel takes ``enable_gqa``).
    """
    if q.shape[1] == k.shape[1]:
        return k, v, {}
    if q.device.type == "cpu":
        return k, v, {"enable_gqa": True}
    return *_expand_kv(q, k, v), {}


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    bias: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout: float = 0.0,
    backend: str = "auto",
    return_weights: bool = False,
):
    """Attention ``A = softmax(Q Kᵀ · scale + bias) ∘ mask``, output ``A V``, over ``(B, H, N, E)``.

    Vaswani et al. 2017, https://arxiv.org/abs/1706.03762. ``scale`` defaults to ``1/√E``.

    Args:
        q: queries ``(B, H, Nq, E)``.
        k: keys ``(B, Hkv, Nk, E)``; ``H`` must be a multiple of ``Hkv`` (grouped-query attention).
        v: values ``(B, Hkv, Nk, Ev)``.
        mask: boolean, broadcastable to ``(B, H, Nq, Nk)``; True = may attend (see :mod:`.masks`).
        bias: float, broadcastable to ``(B, H, Nq, Nk)``, added to the scores (e.g. ALiBi).
        is_causal: add a causal mask (queries are the last ``Nq`` of ``Nk`` positions).
        scale: score scale, default ``1/√E``.
        dropout: dropout probability on ``A`` (pass 0 in eval mode).
        backend: ``"auto"``, ``"math"``, ``"sdpa"`` or ``"flash"``.
        return_weights: also return ``A`` ``(B, H, Nq, Nk)`` (uses the math backend).

    Returns:
        ``out`` of shape ``(B, H, Nq, Ev)``, or ``(out, A)`` when ``return_weights``.
    """
    _check(q, k, v, mask, bias, backend)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if backend == "auto":
        # On a CPU, SDPA with dropout falls back to this same formula and draws its mask one unit at a time; the
        # math path draws it with tokennet.dropout's packed mask (bench/dropout.py).
        on_cpu_with_dropout = dropout > 0 and q.device.type == "cpu"
        backend = "math" if return_weights or on_cpu_with_dropout else "sdpa"
    elif return_weights and backend != "math":
        raise ValueError(f"return_weights=True needs backend 'math' or 'auto', got {backend!r}")
    n_queries, n_keys = q.shape[2], k.shape[2]
    if is_causal:
        if n_keys < n_queries:
            raise ValueError(f"is_causal with fewer keys ({n_keys}) than queries ({n_queries}) is ambiguous")
        if mask is None and bias is None and backend == "sdpa" and n_queries == n_keys:
            k, v, gqa = _kv_for_sdpa(q, k, v)
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=scale,
                                                  **gqa)
        # One query over a cache sees every key: no mask needed; flash skips the future tiles itself.
        if backend != "flash" and (n_queries > 1 or mask is not None):
            causal = causal_mask(n_queries, n_keys, device=q.device)
            mask = causal if mask is None else mask & causal
    if backend == "sdpa":
        return _sdpa(q, *_kv_for_sdpa(q, k, v), mask, bias, scale, dropout)
    k, v = _expand_kv(q, k, v)
    if backend == "math":
        return _math(q, k, v, mask, bias, scale, dropout, return_weights)
    if backend == "flash":
        from .flash import flash_attention

        return flash_attention(q, k, v, mask, bias=bias, scale=scale, dropout=dropout, is_causal=is_causal)
    raise AssertionError(f"unhandled backend {backend!r}")  # _check admits only the ones above


def _math(q, k, v, mask, bias, scale, dropout, return_weights):
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, Nq, Nk)
    if bias is not None:
        scores = scores + bias
    weights = masked_softmax(scores, mask)
    a_drop = drop(weights, dropout) if dropout > 0 else weights
    out = a_drop @ v  # (B, H, Nq, Ev)
    return (out, weights) if return_weights else out


def _sdpa(q, k, v, gqa, mask, bias, scale, dropout):
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout, scale=scale, **gqa)
    # SDPA returns NaN for a fully masked row. Let such rows attend everywhere, then zero them:
    # the multiply also zeroes their gradients.
    has_any = mask.any(dim=-1, keepdim=True)  # (.., Nq, 1)
    mask = mask | ~has_any  # no host sync: cheaper than asking whether any row is empty
    attn_mask = mask if bias is None else bias.masked_fill(~mask, float("-inf"))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout, scale=scale, **gqa)
    return out * has_any.to(out.dtype)
