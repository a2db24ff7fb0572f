"""An int8 × int8 linear layer with integer dot products (x86 VNNI), for decoding a few rows at a time.

``y = x Wᵀ`` with the weight held as int8 with one scale per output channel (``W ≈ s_w ⊙ Q``, see
:func:`tokennet.layers.quantize.quantize_int8`) and the activations rounded to int8 per row, as llama.cpp does
before its integer dot products::

    s_x = max_k |x_k| / 127   (1 for an all-zero row),   x_q = round(x / s_x) ∈ [−127, 127]  (ties to even)
    y_n = float32(Σ_k x_q,k Q_nk) · (s_x · s_w,n) + b_n

The sum is exact (int32; |Σ| ≤ 127² K). On the CPU it is AVX-512 VNNI's ``vpdpbusd`` (unsigned × signed bytes,
four products per 32-bit lane): the kernel feeds ``x_q + 128`` and subtracts ``128 Σ_k Q_nk``, kept per row at
packing. The weight is packed in blocks of 16 output rows, ``(⌈N/16⌉, K/4, 16, 4)``: one 64-byte load holds four
consecutive weights of 16 rows, and one instruction adds their products with four activations into 16 sums, so
a block's weights are read once, in order, with no horizontal sums. A step reads each weight byte once (the int8
weight-only path reads the same bytes; this one spends far fewer instructions per byte: no int8 → float
conversion, 64 multiply–adds per instruction).

The kernel is C++ (``int8dot.cpp``, beside this file), built at first use by ``torch.utils.cpp_extension`` with the
C++ compiler torch.compile needs anyway, into ``$TOKENNET_CACHE/extensions`` (``~/.cache/tokennet/extensions``),
once per machine; it registers ``torch.ops.tokennet_int8dot.linear``, which torch.compile calls from a compiled
graph as an opaque operation (its output shape is declared to it here). :func:`available` says whether it can run
here (an x86 CPU with AVX-512 VNNI, a compiler, ``TOKENNET_INT8DOT`` not ``0``) and :func:`unavailable_reason` why
not.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["available", "unavailable_reason", "pack", "unpack", "linear", "quantize_rows", "reference"]

logger = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("int8dot.cpp")
_CPU_FLAGS = ("avx512f", "avx512bw", "avx512_vnni")
_LOCK = threading.Lock()
_STATE: dict[str, object] = {}  # "ok": bool, "reason": str


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _build_dir() -> str:
    root = os.environ.get("TOKENNET_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tokennet")
    d = os.path.join(root, "extensions", f"int8dot-torch{torch.__version__.replace('+', '_')}")
    os.makedirs(d, exist_ok=True)
    return d


def _load() -> None:
    """Build (once per machine) and load the kernel; sets ``_STATE``."""
    if os.environ.get("TOKENNET_INT8DOT", "1").strip().lower() in ("0", "false", "no", "off"):
        _STATE.update(ok=False, reason="TOKENNET_INT8DOT=0")
        return
    missing = [f for f in _CPU_FLAGS if f not in _cpu_flags()]
    if missing:
        _STATE.update(ok=False, reason=f"this CPU lacks {', '.join(missing)}")
        return
    try:
        from torch.utils import cpp_extension

        # -ffp-contract=off: no fused multiply–add in the scaling, so the result is the formula's, bit for bit
        flags = ["-O3", "-ffp-contract=off", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-fopenmp"]
        cpp_extension.load(name="tokennet_int8dot", sources=[str(_SOURCE)], build_directory=_build_dir(),
                           extra_cflags=flags,
                           extra_ldflags=["-fopenmp"], is_python_module=False, verbose=False)
    except Exception as e:  # noqa: BLE001 — no compiler, no ninja, a failed build: say why, fall back
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        _STATE.update(ok=False, reason=f"the int8dot kernel did not build ({first[:200]})")
        return

    @torch.library.register_fake("tokennet_int8dot::linear")
    def _(x, packed, corr, scale, bias, n):
        return x.new_empty(x.shape[0], n, dtype=torch.float32)

    _STATE.update(ok=True, reason="")


def available() -> bool:
    """Whether the kernel runs here (built and loaded at the first call; False with a reason otherwise)."""
    if "ok" not in _STATE:
        with _LOCK:
            if "ok" not in _STATE:
                _load()
                if not _STATE["ok"]:
                    logger.info("int8 integer-dot kernel unavailable: %s", _STATE["reason"])
    return bool(_STATE["ok"])


def unavailable_reason() -> str:
    """Why :func:`available` is False ('' when it is True)."""
    available()
    return str(_STATE["reason"])


def pack(q: Tensor) -> tuple[Tensor, Tensor]:
    """int8 weights ``Q (N, K)`` (K a multiple of 4) → ``packed (⌈N/16⌉, K/4, 16, 4)`` int8 and ``128 Σ_k Q_nk``
    ``(N,)`` int32."""
    packed, corr = torch.ops.tokennet_int8dot.pack(q)
    return packed, corr


def unpack(packed: Tensor, n: int) -> Tensor:
    """:func:`pack`'s layout back to ``Q (n, K)`` int8 (a copy)."""
    nb, steps = packed.shape[:2]
    return packed.permute(0, 2, 1, 3).reshape(nb * 16, steps * 4)[:n].contiguous()


def linear(x: Tensor, packed: Tensor, corr: Tensor, scale: Tensor, bias: Tensor | None, n: int) -> Tensor:
    """``x (M, K)`` (any float dtype) → ``y (M, N)`` float32 by the formula of the module docstring."""
    return torch.ops.tokennet_int8dot.linear(x, packed, corr, scale, bias, n)


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """The kernel's activation rounding in PyTorch: ``x (M, K)`` → ``(x_q (M, K) int8, s_x (M,) float32)``."""
    x = x.float()
    amax = x.abs().amax(-1)
    s = torch.where(amax == 0, torch.ones_like(amax), amax / 127.0)
    return torch.round(x / s[:, None]).clamp(-127, 127).to(torch.int8), s


def reference(x: Tensor, q: Tensor, scale: Tensor, bias: Tensor | None = None) -> Tensor:
    """The formula, computed plainly: the integer sums in int64, then the same float32 scaling as the kernel."""
    xq, s = quantize_rows(x)
    acc = (xq.long() @ q.long().T).float()  # exact: every |sum| < 2^24 for K < 1040, and float32 of an int32 after
    y = acc * (s[:, None] * scale.float()[None, :])
    return y if bias is None else y + bias.float()
