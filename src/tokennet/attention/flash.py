"""FlashAttention-style tiled attention with an online softmax, in plain PyTorch, for reading.

Dao et al. 2022, *FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness*,
https://arxiv.org/abs/2205.14135 (the loop order follows FlashAttention-2, Dao 2023,
https://arxiv.org/abs/2307.08691).

The output ``O = softmax(S) V`` with ``S = Q Kᵀ · scale + bias`` is computed one
``(block_q, block_k)`` tile of ``S`` at a time; the full ``(Nq, Nk)`` matrix is never built. For each
query block the loop over key blocks keeps three running quantities per query row:

- ``m``, the largest score seen so far,
- ``l = Σ_j exp(S_j - m)``, the softmax denominator relative to ``m``,
- ``acc = Σ_j exp(S_j - m) V_j``, the unnormalized output.

When a new tile raises the maximum from ``m`` to ``m'``, the old sums are rescaled by
``exp(m - m')`` (the *online softmax*, Milakov & Gimelshein 2018, https://arxiv.org/abs/1805.02867);
at the end ``O = acc / l``. The forward pass saves only ``O`` and the log-sum-exp ``L = m + log l``
per row, and the backward pass recomputes each tile's probabilities ``P = exp(S - L)`` from them, so
the extra memory is O(N) instead of O(N²).

The Python loops run over blocks, never over tokens; every tile is one batched matmul over all
``(B, H)``. This is much slower than PyTorch's fused kernels (``backend="sdpa"``): it is here so the
algorithm can be read and tested against the plain formula (``backend="math"``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .masks import check_mask

__all__ = ["flash_attention"]


def flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    bias: Tensor | None = None,
    scale: float | None = None,
    dropout: float = 0.0,
    is_causal: bool = False,
    block_q: int = 128,
    block_k: int = 128,
) -> Tensor:
    """Tiled attention ``O = softmax(Q Kᵀ · scale + bias) V`` with an online softmax; O(N) extra memory.

    Dao et al. 2022, https://arxiv.org/abs/2205.14135. A query row that may attend to no key gives
    zeros (never NaN), in the forward and the backward pass. The backward pass is FlashAttention's
    recomputation backward: it saves ``O`` and the row log-sum-exp, not the attention matrix.
    Gradients flow to ``q``, ``k``, ``v`` and ``bias``; double backward is not supported.

    Args:
        q: queries ``(B, H, Nq, E)``.
        k: keys ``(B, H, Nk, E)``, already expanded to ``H`` heads (see ``functional.attention``).
        v: values ``(B, H, Nk, Ev)``.
        mask: boolean, broadcastable to ``(B, H, Nq, Nk)``; True = may attend. Key tiles that the mask
            blocks for every batch entry and head are skipped.
        bias: float, broadcastable to ``(B, H, Nq, Nk)``, added to the scores.
        scale: score scale, default ``1/√E``.
        dropout: must be 0; the tiled backend does not implement dropout.
        is_causal: add a causal mask (queries are the last ``Nq`` of ``Nk`` positions, as in
            :func:`tokennet.attention.masks.causal`) and skip the key tiles above the diagonal.
        block_q: query rows per tile.
        block_k: key columns per tile.

    Returns:
        ``O`` of shape ``(B, H, Nq, Ev)``.
    """
    if dropout != 0.0:
        raise ValueError(
            f"the tiled 'flash' backend does not support dropout (got dropout={dropout}); "
            "use backend 'math' or 'sdpa', or pass dropout=0"
        )
    _check(q, k, v, mask, bias, is_causal, block_q, block_k)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    # Broadcast views with exactly 4 dims, so tiles can be sliced the same way for every input.
    mask4 = None if mask is None else mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    bias4 = None if bias is None else bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
    out = _FlashAttention.apply(q, k, v, mask4, bias4, scale, is_causal, block_q, block_k)
    return out


def _check(q, k, v, mask, bias, is_causal, block_q, block_k) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must have shape (B, H, N, E), got {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or not q.dtype.is_floating_point:
        raise ValueError(f"q, k, v must share a floating-point dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    B, H, Nq, E = q.shape
    if k.shape[:2] != (B, H) or v.shape[:3] != k.shape[:3] or k.shape[-1] != E:
        raise ValueError(
            f"expected k (B, H, Nk, E) and v (B, H, Nk, Ev) matching q {tuple(q.shape)}, got "
            f"k {tuple(k.shape)} and v {tuple(v.shape)} (expand grouped key/value heads first)"
        )
    shape = (B, H, Nq, k.shape[2])
    if mask is not None:
        check_mask(mask, shape)
    if bias is not None:
        if not bias.dtype.is_floating_point:
            raise ValueError(f"bias must be a float tensor (added to the scores), got {bias.dtype}")
        try:
            ok = bias.dim() <= 4 and torch.broadcast_shapes(bias.shape, shape) == torch.Size(shape)
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(
                f"bias of shape {tuple(bias.shape)} does not broadcast to (B, H, Nq, Nk) = {shape}"
            )
    if is_causal and k.shape[2] < Nq:
        raise ValueError(f"is_causal with fewer keys ({k.shape[2]}) than queries ({Nq}) is ambiguous")
    for name, b in (("block_q", block_q), ("block_k", block_k)):
        if not isinstance(b, int) or b < 1:
            raise ValueError(f"{name} must be a positive integer, got {b!r}")


def _blocks(n: int, size: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` covering ``0..n`` in steps of ``size``; the last block may be shorter."""
    return [(s, min(s + size, n)) for s in range(0, n, size)]


def _tile(t: Tensor | None, rows: tuple[int, int], cols: tuple[int, int]) -> Tensor | None:
    """The ``rows × cols`` tile of a 4-dim broadcastable tensor; a broadcast dim (size 1) stays size 1."""
    if t is None:
        return None
    r = slice(None) if t.shape[-2] == 1 else slice(*rows)
    c = slice(None) if t.shape[-1] == 1 else slice(*cols)
    return t[..., r, c]


def _live_tiles(mask4, q_blocks, k_blocks, is_causal: bool, offset: int) -> list[list[str]]:
    """For every (query block, key block): ``"skip"``, ``"full"`` (no masking needed) or ``"partial"``.

    A tile is skipped when no query in it may attend to any key in it, for every batch entry and head:
    it would only add zeros. The mask is reduced to one small table per tile grid (one host sync),
    not inspected tile by tile.
    """
    live = [["full"] * len(k_blocks) for _ in q_blocks]
    if mask4 is not None:
        some = _per_tile(mask4.any(dim=1).any(dim=0), q_blocks, k_blocks, "any")  # any (b, h) may attend
        every = _per_tile(mask4.all(dim=1).all(dim=0), q_blocks, k_blocks, "all")  # every (b, h) may
        some, every = torch.stack([some, every]).tolist()
        for i in range(len(q_blocks)):
            ib = i if len(some) > 1 else 0  # a mask broadcast over queries has one row of tiles
            for j in range(len(k_blocks)):
                jb = j if len(some[0]) > 1 else 0
                if not some[ib][jb]:
                    live[i][j] = "skip"
                elif not every[ib][jb]:
                    live[i][j] = "partial"
    if is_causal:
        for i, (i0, i1) in enumerate(q_blocks):
            for j, (j0, j1) in enumerate(k_blocks):
                # The query in row r sits at absolute position r + offset and sees keys 0..r + offset.
                if j0 > i1 - 1 + offset:
                    live[i][j] = "skip"  # above the diagonal: no query here sees any key here
                elif j1 - 1 > i0 + offset and live[i][j] == "full":
                    live[i][j] = "partial"  # crosses the diagonal
    return live


def _per_tile(m: Tensor, q_blocks, k_blocks, how: str) -> Tensor:
    """Reduce a boolean ``(Nq or 1, Nk or 1)`` matrix to one value per tile with ``any`` or ``all``."""
    bq = q_blocks[0][1] if m.shape[0] > 1 else 1  # a broadcast dim (size 1) forms a single block
    bk = k_blocks[0][1] if m.shape[1] > 1 else 1
    nq, nk = -(-m.shape[0] // bq), -(-m.shape[1] // bk)
    # Pad to whole tiles with a value that does not change the reduction.
    padded = m.new_full((nq * bq, nk * bk), how == "all")
    padded[: m.shape[0], : m.shape[1]] = m
    tiles = padded.view(nq, bq, nk, bk)  # (tile row, row in tile, tile column, column in tile)
    return tiles.any(dim=3).any(dim=1) if how == "any" else tiles.all(dim=3).all(dim=1)


def _scores(q_i, k_j, mask4, bias4, rows, cols, kind, is_causal, offset, scale, dtype) -> Tensor:
    """One tile of scores ``S = Q_i K_jᵀ · scale + bias``, with disallowed entries set to -inf."""
    s = (q_i.to(dtype) @ k_j.to(dtype).transpose(-2, -1)) * scale  # (B, H, bq, bk)
    b = _tile(bias4, rows, cols)
    if b is not None:
        s = s + b.to(dtype)
    if kind == "partial":
        allowed = _tile(mask4, rows, cols)
        if is_causal:
            qpos = torch.arange(rows[0], rows[1], device=s.device)[:, None] + offset  # (bq, 1)
            kpos = torch.arange(cols[0], cols[1], device=s.device)[None, :]  # (1, bk)
            c = kpos <= qpos  # (bq, bk)
            allowed = c if allowed is None else allowed & c
        s = s.masked_fill(~allowed, float("-inf"))
    return s


class _FlashAttention(torch.autograd.Function):
    """Tiled attention with the recomputation backward of FlashAttention (saves ``O`` and ``L`` only)."""

    @staticmethod
    def forward(ctx, q, k, v, mask4, bias4, scale, is_causal, block_q, block_k):
        B, H, Nq, _ = q.shape
        Nk, Ev = k.shape[2], v.shape[-1]
        # Low-precision inputs accumulate in float32; float32 and float64 stay as they are.
        dtype = torch.promote_types(q.dtype, torch.float32)
        offset = Nk - Nq  # queries are the last Nq of the Nk positions
        q_blocks, k_blocks = _blocks(Nq, block_q), _blocks(Nk, block_k)
        live = _live_tiles(mask4, q_blocks, k_blocks, is_causal, offset)

        out = torch.empty(B, H, Nq, Ev, dtype=q.dtype, device=q.device)  # (B, H, Nq, Ev)
        lse = torch.empty(B, H, Nq, dtype=dtype, device=q.device)  # (B, H, Nq): L = m + log l
        for i, rows in enumerate(q_blocks):
            q_i = q[:, :, rows[0] : rows[1]]  # (B, H, bq, E)
            bq = rows[1] - rows[0]
            m = torch.full((B, H, bq, 1), float("-inf"), dtype=dtype, device=q.device)  # running max
            l = torch.zeros(B, H, bq, 1, dtype=dtype, device=q.device)  # running denominator
            acc = torch.zeros(B, H, bq, Ev, dtype=dtype, device=q.device)  # running Σ exp(S - m) V
            for j, cols in enumerate(k_blocks):
                if live[i][j] == "skip":
                    continue
                k_j = k[:, :, cols[0] : cols[1]]  # (B, H, bk, E)
                s = _scores(q_i, k_j, mask4, bias4, rows, cols, live[i][j], is_causal, offset, scale, dtype)
                m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # (B, H, bq, 1)
                # A row with no allowed key so far has m_new = -inf; subtracting 0 instead keeps
                # exp(-inf - (-inf)) = NaN out: its p and alpha are then exp(-inf) = 0.
                m_safe = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
                p = torch.exp(s - m_safe)  # (B, H, bq, bk), unnormalized probabilities
                alpha = torch.exp(m - m_safe)  # rescales what was summed under the old max
                l = alpha * l + p.sum(dim=-1, keepdim=True)
                acc = alpha * acc + p @ v[:, :, cols[0] : cols[1]].to(dtype)  # (B, H, bq, Ev)
                m = m_new
            empty = l == 0  # rows that may attend to nothing: output 0
            out[:, :, rows[0] : rows[1]] = (acc / torch.where(empty, torch.ones_like(l), l)).to(q.dtype)
            # +inf for empty rows makes the backward's P = exp(S - L) exactly 0 there.
            lse[:, :, rows[0] : rows[1]] = torch.where(empty, float("inf"), m + torch.log(l)).squeeze(-1)

        ctx.save_for_backward(q, k, v, out, lse, mask4, bias4)
        ctx.args = (scale, is_causal, block_q, block_k, live)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out):
        q, k, v, out, lse, mask4, bias4 = ctx.saved_tensors
        scale, is_causal, block_q, block_k, live = ctx.args
        Nq, Nk = q.shape[2], k.shape[2]
        dtype = lse.dtype
        offset = Nk - Nq
        q_blocks, k_blocks = _blocks(Nq, block_q), _blocks(Nk, block_k)
        want_bias = bias4 is not None and ctx.needs_input_grad[4]

        # D_i = Σ_e dO_ie O_ie = Σ_j P_ij dP_ij, the term the softmax Jacobian subtracts.
        delta = (d_out.to(dtype) * out.to(dtype)).sum(dim=-1, keepdim=True)  # (B, H, Nq, 1)
        dq = torch.zeros(q.shape, dtype=dtype, device=q.device)  # (B, H, Nq, E)
        dk = torch.zeros(k.shape, dtype=dtype, device=q.device)  # (B, H, Nk, E)
        dv = torch.zeros(v.shape, dtype=dtype, device=q.device)  # (B, H, Nk, Ev)
        dbias = torch.zeros(bias4.shape, dtype=dtype, device=q.device) if want_bias else None
        for j, cols in enumerate(k_blocks):
            k_j = k[:, :, cols[0] : cols[1]].to(dtype)  # (B, H, bk, E)
            v_j = v[:, :, cols[0] : cols[1]].to(dtype)  # (B, H, bk, Ev)
            for i, rows in enumerate(q_blocks):
                if live[i][j] == "skip":
                    continue
                r = slice(*rows)
                q_i, do_i = q[:, :, r].to(dtype), d_out[:, :, r].to(dtype)  # (B, H, bq, E|Ev)
                s = _scores(q_i, k_j, mask4, bias4, rows, cols, live[i][j], is_causal, offset, scale, dtype)
                p = torch.exp(s - lse[:, :, r, None])  # (B, H, bq, bk): the forward's softmax tile
                dv[:, :, cols[0] : cols[1]] += p.transpose(-2, -1) @ do_i  # dV = Pᵀ dO
                dp = do_i @ v_j.transpose(-2, -1)  # (B, H, bq, bk): dP = dO Vᵀ
                ds = p * (dp - delta[:, :, r])  # dS = P ∘ (dP - D), the softmax backward
                dq[:, :, r] += (ds @ k_j) * scale  # dQ = dS K · scale
                dk[:, :, cols[0] : cols[1]] += (ds.transpose(-2, -1) @ q_i) * scale  # dK = dSᵀ Q · scale
                if want_bias:
                    _tile(dbias, rows, cols).add_(_sum_to(ds, dbias.shape))

        dq, dk, dv = dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
        if want_bias:
            dbias = dbias.to(bias4.dtype)
        return dq, dk, dv, None, dbias, None, None, None, None


def _sum_to(g: Tensor, shape: torch.Size) -> Tensor:
    """Sum a ``(B, H, bq, bk)`` tile gradient over the dims where the (4-dim) input was broadcast."""
    dims = tuple(d for d in range(4) if shape[d] == 1 and g.shape[d] != 1)
    return g.sum(dim=dims, keepdim=True) if dims else g
