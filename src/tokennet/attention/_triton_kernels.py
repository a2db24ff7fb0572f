"""The Triton kernels behind :mod:`tokennet.attention.triton_flash` (imported on its first call, never at import).

Every kernel works on one ``(B·H)`` slice (``tl.program_id(1)``) and one block of query rows or key rows
(``tl.program_id(0)``); pointers are base + ``b·stride_b + h·stride_h + n·stride_n + e`` (the last dim must be
contiguous). Scores and every sum are float32; ``tl.dot`` gets ``PRECISION="ieee"`` for float32 inputs, so they are
not rounded to TF32 (slow, for checking), and ``"tf32"`` otherwise, which bf16/fp16 operands ignore.

The algorithm, in the notation of :mod:`tokennet.attention.flash`: ``S = Q Kᵀ · scale``, running max ``m``,
denominator ``l``, unnormalized output ``acc``; the forward writes ``O = acc / l`` and ``L = m + log l``; the
backward recomputes ``P = exp(S - L)`` tile by tile.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _allowed(rows, keys, Nq, Nk, CAUSAL: tl.constexpr):
    """``(BLOCK_M, BLOCK_N)``: key exists, and (causal) key position <= query position (queries are the last Nq)."""
    ok = keys[None, :] < Nk  # (1, BLOCK_N); broadcasts against the tile
    if CAUSAL:
        ok = ok & (keys[None, :] <= rows[:, None] + (Nk - Nq))
    return ok


@triton.jit
def _load_rows(ptr, rows, n, cols, E, stride_n):
    """Rows ``rows`` (those < n) of a ``(N, E)`` matrix, E padded to the block with zeros."""
    return tl.load(ptr + rows[:, None] * stride_n + cols[None, :], mask=(rows[:, None] < n) & (cols[None, :] < E),
                   other=0.0)


@triton.jit
def _fwd_kernel(Q, K, V, O, LSE, sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n,
                H, Nq, Nk, E, scale,
                CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr,
                PRECISION: tl.constexpr):
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_E)
    q = _load_rows(Q + b * sq_b + h * sq_h, rows, Nq, cols, E, sq_n)  # (BLOCK_M, BLOCK_E)
    K, V = K + b * sk_b + h * sk_h, V + b * sv_b + h * sv_h
    # Every query row may attend to key 0 (causal queries are the last Nq of Nk >= Nq positions), so m is
    # finite after the first tile and exp(m - m_new) never meets -inf - (-inf).
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max
    l = tl.zeros([BLOCK_M], tl.float32)  # running denominator Σ exp(S - m)
    acc = tl.zeros([BLOCK_M, BLOCK_E], tl.float32)  # running Σ exp(S - m) V
    hi = Nk
    if CAUSAL:  # key tiles past the block's last query position hold only zeros of P: skipped
        hi = tl.minimum(Nk, (pid_m + 1) * BLOCK_M + (Nk - Nq))
    for start in range(0, hi, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        k = _load_rows(K, keys, Nk, cols, E, sk_n)  # (BLOCK_N, BLOCK_E)
        v = _load_rows(V, keys, Nk, cols, E, sv_n)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # (BLOCK_M, BLOCK_N)
        s = tl.where(_allowed(rows, keys, Nq, Nk, CAUSAL), s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])  # unnormalized probabilities of this tile
        alpha = tl.exp(m - m_new)  # rescales what was summed under the old max
        l = alpha * l + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new
    out = acc / l[:, None]
    o_ptr = O + b * so_b + h * so_h + rows[:, None] * so_n + cols[None, :]
    tl.store(o_ptr, out.to(O.dtype.element_ty), mask=(rows[:, None] < Nq) & (cols[None, :] < E))
    tl.store(LSE + bh * Nq + rows, m + tl.log(l), mask=rows < Nq)


@triton.jit
def _bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n,
                     sd_b, sd_h, sd_n, H, Nq, Nk, E, scale,
                     CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr,
                PRECISION: tl.constexpr):
    """One key block: ``dV = Σ_i P_iᵀ dO_i`` and ``dK = scale · Σ_i dS_iᵀ Q_i`` over the query blocks i."""
    pid_n, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    keys = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_E)
    k = _load_rows(K + b * sk_b + h * sk_h, keys, Nk, cols, E, sk_n)  # (BLOCK_N, BLOCK_E)
    v = _load_rows(V + b * sv_b + h * sv_h, keys, Nk, cols, E, sv_n)
    Q, DO = Q + b * sq_b + h * sq_h, DO + b * sd_b + h * sd_h
    dk = tl.zeros([BLOCK_N, BLOCK_E], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_E], tl.float32)
    lo = 0
    if CAUSAL:  # query blocks that end before this block's first key position see none of its keys: skipped
        lo = tl.maximum(pid_n * BLOCK_N - (Nk - Nq), 0) // BLOCK_M * BLOCK_M
    for start in range(lo, Nq, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        q = _load_rows(Q, rows, Nq, cols, E, sq_n)  # (BLOCK_M, BLOCK_E)
        do = _load_rows(DO, rows, Nq, cols, E, sd_n)
        lse = tl.load(LSE + bh * Nq + rows, mask=rows < Nq, other=0.0)
        delta = tl.load(DELTA + bh * Nq + rows, mask=rows < Nq, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # (BLOCK_M, BLOCK_N)
        ok = _allowed(rows, keys, Nq, Nk, CAUSAL) & (rows[:, None] < Nq)
        p = tl.where(ok, tl.exp(s - lse[:, None]), 0.0)  # the forward's softmax tile
        dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PRECISION)  # dV = Pᵀ dO
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)  # dP = dO Vᵀ
        ds = p * (dp - delta[:, None])  # dS = P ∘ (dP - D)
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)  # dK = dSᵀ Q (· scale below)
    out_mask = (keys[:, None] < Nk) & (cols[None, :] < E)
    offs = bh * Nk * E + keys[:, None] * E + cols[None, :]  # DK, DV: contiguous (B, H, Nk, E)
    tl.store(DK + offs, (dk * scale).to(DK.dtype.element_ty), mask=out_mask)
    tl.store(DV + offs, dv.to(DV.dtype.element_ty), mask=out_mask)


@triton.jit
def _bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n,
                   sd_b, sd_h, sd_n, H, Nq, Nk, E, scale,
                   CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr,
                PRECISION: tl.constexpr):
    """One query block: ``dQ = scale · Σ_j dS_j K_j`` over the key blocks j (no atomics: deterministic)."""
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_E)
    q = _load_rows(Q + b * sq_b + h * sq_h, rows, Nq, cols, E, sq_n)  # (BLOCK_M, BLOCK_E)
    do = _load_rows(DO + b * sd_b + h * sd_h, rows, Nq, cols, E, sd_n)
    lse = tl.load(LSE + bh * Nq + rows, mask=rows < Nq, other=0.0)
    delta = tl.load(DELTA + bh * Nq + rows, mask=rows < Nq, other=0.0)
    K, V = K + b * sk_b + h * sk_h, V + b * sv_b + h * sv_h
    dq = tl.zeros([BLOCK_M, BLOCK_E], tl.float32)
    hi = Nk
    if CAUSAL:
        hi = tl.minimum(Nk, (pid_m + 1) * BLOCK_M + (Nk - Nq))
    for start in range(0, hi, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        k = _load_rows(K, keys, Nk, cols, E, sk_n)  # (BLOCK_N, BLOCK_E)
        v = _load_rows(V, keys, Nk, cols, E, sv_n)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        ok = _allowed(rows, keys, Nq, Nk, CAUSAL) & (rows[:, None] < Nq)
        p = tl.where(ok, tl.exp(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)  # dQ = dS K (· scale below)
    offs = bh * Nq * E + rows[:, None] * E + cols[None, :]  # DQ: contiguous (B, H, Nq, E)
    tl.store(DQ + offs, (dq * scale).to(DQ.dtype.element_ty), mask=(rows[:, None] < Nq) & (cols[None, :] < E))
