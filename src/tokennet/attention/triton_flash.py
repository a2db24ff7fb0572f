"""FlashAttention-style tiled attention as Triton kernels: :mod:`tokennet.attention.flash`'s algorithm on the GPU.

Dao et al. 2022, https://arxiv.org/abs/2205.14135; loop order and the split backward of FlashAttention-2,
Dao 2023, https://arxiv.org/abs/2307.08691. :mod:`.flash` explains the online softmax for reading; here the same
three running quantities per query row (max ``m``, denominator ``l``, unnormalized output ``acc``) live in
registers, one Triton program per ``(query block, batch·head)`` (:mod:`._triton_kernels`):

- forward: for each key tile, ``S = Q Kᵀ · scale``, rescale by ``exp(m - m')``, add ``exp(S - m') V``; write
  ``O = acc / l`` and the row log-sum-exp ``L = m + log l`` (float32);
- backward: ``D = rowsum(dO ∘ O)`` (one PyTorch line), then one program per key block accumulates
  ``dV = Pᵀ dO`` and ``dK = dSᵀ Q · scale`` over the query blocks, and one program per query block
  accumulates ``dQ = dS K · scale`` over the key blocks, with ``P = exp(S - L)`` recomputed and
  ``dS = P ∘ (dO Vᵀ - D)``. Two passes instead of atomics: deterministic.

With ``is_causal`` the queries are the last ``Nq`` of ``Nk`` positions (:func:`tokennet.attention.masks.causal`)
and the tiles above the diagonal are skipped. No mask, bias or dropout: those calls go to ``functional.attention``.

The plain-formula twin is ``functional.attention(..., backend="math")``; ``tests/attention/test_triton_flash.py``
holds them equal, forward and gradients, on the CPU through Triton's interpreter (``TRITON_INTERPRET=1``, set
before ``triton`` is first imported: Triton's own library functions are decorated then). ``bench/gpu.py`` times
it against PyTorch's SDPA on a GPU.
"""

from __future__ import annotations

import math
import os

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..errors import ConfigError

__all__ = ["triton_flash_attention", "unavailable_reason"]

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256
# (block_m, block_n, num_warps, num_stages): forward, backward. Chosen from the Triton tutorial's fused attention
# for head width 64 on Hopper, not tuned here (bench/gpu.py times the forward with a few others).
FWD_CONFIG = (128, 64, 4, 3)
BWD_CONFIG = (64, 64, 4, 2)


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def unavailable_reason(device: torch.device | str = "cuda") -> str | None:
    """Why the kernels cannot run on ``device`` (None when they can): Triton missing, or a CPU without the
    interpreter, or a CUDA device that is not there."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed (pip install triton; it ships with CUDA builds of PyTorch)"
    kind = torch.device(device).type
    if kind == "cpu" and not _interpreted():
        return ("on the CPU the Triton kernels run only in Triton's interpreter: set TRITON_INTERPRET=1 before triton "
                "is imported")
    if kind == "cuda" and not (torch.cuda.is_available() or _interpreted()):
        return "no CUDA device"
    if kind not in ("cpu", "cuda"):
        return f"the Triton kernels run on CUDA (or the CPU interpreter), not on {kind}"
    return None


def triton_flash_attention(q: Tensor, k: Tensor, v: Tensor, *, is_causal: bool = False, scale: float | None = None,
                           fwd_config: tuple[int, int, int, int] | None = None,
                           bwd_config: tuple[int, int, int, int] | None = None) -> Tensor:
    """``O = softmax(Q Kᵀ · scale) V`` with Triton kernels, forward and backward (FlashAttention-2's recomputation).

    Args:
        q: queries ``(B, H, Nq, E)``, float16, bfloat16 or float32, on CUDA (or the CPU under ``TRITON_INTERPRET=1``).
        k, v: keys and values ``(B, H, Nk, E)`` (expand grouped key/value heads first), same dtype and device.
        is_causal: queries are the last ``Nq`` of ``Nk`` positions and see keys up to their own.
        scale: score scale, default ``1/√E``.
        fwd_config, bwd_config: ``(block_m, block_n, num_warps, num_stages)`` (defaults :data:`FWD_CONFIG`,
            :data:`BWD_CONFIG`); blocks are powers of two (16 or more for the GPU's ``tl.dot``).

    Returns:
        ``O`` ``(B, H, Nq, E)`` in the inputs' dtype; gradients flow to ``q``, ``k``, ``v`` (not twice).
    """
    _check(q, k, v, is_causal)
    for cfg in (fwd_config, bwd_config):
        if cfg is not None and not (len(cfg) == 4 and all(isinstance(c, int) and c > 0 for c in cfg)
                                    and all(c & (c - 1) == 0 for c in cfg[:2])):
            raise ConfigError(f"a kernel config is (block_m, block_n, num_warps, num_stages), blocks powers of two; "
                              f"got {cfg!r}")
    reason = unavailable_reason(q.device)
    if reason is not None:
        raise ConfigError(f"triton_flash_attention: {reason}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return _TritonFlash.apply(q, k, v, scale, bool(is_causal), fwd_config or FWD_CONFIG, bwd_config or BWD_CONFIG)


def _check(q: Tensor, k: Tensor, v: Tensor, is_causal: bool) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ConfigError(f"{name} must have shape (B, H, N, E), got {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in DTYPES:
        raise ConfigError(f"q, k, v must share one of float16, bfloat16, float32; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ConfigError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape or k.shape[:2] != q.shape[:2] or k.shape[-1] != q.shape[-1]:
        raise ConfigError(f"expected k and v (B, H, Nk, E) matching q {tuple(q.shape)}, got k {tuple(k.shape)} and "
                          f"v {tuple(v.shape)} (expand grouped key/value heads first; values as wide as keys)")
    if not 1 <= q.shape[-1] <= MAX_HEAD_DIM:
        raise ConfigError(f"head width E must be 1..{MAX_HEAD_DIM}, got {q.shape[-1]}")
    if q.shape[2] == 0 or k.shape[2] == 0:
        raise ConfigError(f"q and k need at least one position, got Nq={q.shape[2]}, Nk={k.shape[2]}")
    if is_causal and k.shape[2] < q.shape[2]:
        raise ConfigError(f"is_causal with fewer keys ({k.shape[2]}) than queries ({q.shape[2]}) is ambiguous")


def _rows(t: Tensor) -> Tensor:
    """``t`` with a contiguous last dim (the kernels read rows; other strides are passed as they are)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _block_e(E: int) -> int:
    """The head width padded to a power of two, at least 16 (``tl.dot``'s smallest on the GPU)."""
    return max(16, 1 << (E - 1).bit_length())


def _launch(kernel, grid, tensors, strided, B, H, Nq, Nk, E, scale, is_causal, cfg) -> None:
    block_m, block_n, warps, stages = cfg
    strides = [s for t in strided for s in t.stride()[:3]]  # (b, h, n) strides of each strided input
    kernel[grid](*tensors, *strides, H, Nq, Nk, E, scale, CAUSAL=is_causal, BLOCK_M=block_m, BLOCK_N=block_n,
                 BLOCK_E=_block_e(E), PRECISION="ieee" if tensors[0].dtype == torch.float32 else "tf32",
                 num_warps=warps, num_stages=stages)


class _TritonFlash(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, is_causal, fwd_config, bwd_config):
        from . import _triton_kernels as kern

        q, k, v = _rows(q), _rows(k), _rows(v)
        B, H, Nq, E = q.shape
        Nk = k.shape[2]
        out = torch.empty(B, H, Nq, E, dtype=q.dtype, device=q.device)  # (B, H, Nq, E)
        lse = torch.empty(B, H, Nq, dtype=torch.float32, device=q.device)  # (B, H, Nq): L = m + log l
        grid = (triton_cdiv(Nq, fwd_config[0]), B * H)
        _launch(kern._fwd_kernel, grid, (q, k, v, out, lse), (q, k, v, out), B, H, Nq, Nk, E, scale, is_causal,
                fwd_config)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (scale, is_causal, bwd_config)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out):
        from . import _triton_kernels as kern

        q, k, v, out, lse = ctx.saved_tensors
        scale, is_causal, cfg = ctx.args
        d_out = _rows(d_out)
        B, H, Nq, E = q.shape
        Nk = k.shape[2]
        # D_i = Σ_e dO_ie O_ie = Σ_j P_ij dP_ij, the term the softmax Jacobian subtracts.
        delta = (d_out.float() * out.float()).sum(dim=-1).contiguous()  # (B, H, Nq)
        dq = torch.empty(B, H, Nq, E, dtype=q.dtype, device=q.device)
        dk = torch.empty(B, H, Nk, E, dtype=k.dtype, device=k.device)
        dv = torch.empty(B, H, Nk, E, dtype=v.dtype, device=v.device)
        strided = (q, k, v, d_out)
        _launch(kern._bwd_dkdv_kernel, (triton_cdiv(Nk, cfg[1]), B * H), (q, k, v, d_out, lse, delta, dk, dv),
                strided, B, H, Nq, Nk, E, scale, is_causal, cfg)
        _launch(kern._bwd_dq_kernel, (triton_cdiv(Nq, cfg[0]), B * H), (q, k, v, d_out, lse, delta, dq),
                strided, B, H, Nq, Nk, E, scale, is_causal, cfg)
        return dq, dk, dv, None, None, None, None


def triton_cdiv(a: int, b: int) -> int:
    """``⌈a / b⌉`` (``triton.cdiv``, without importing Triton here)."""
    return -(-a // b)
