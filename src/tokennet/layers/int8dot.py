"""An int8 × int8 linear layer with integer dot products (x86 VNNI), for decoding a few rows at a time.

``y = x Wᵀ`` with the weight held as int8 with one scale per output channel (``W ≈ s_w ⊙ Q``, see
:func:`tokennet.layers.quantize.quantize_int8`) and the activations rounded to int8 in groups of 32 along K with
one scale each, as llama.cpp rounds them (its Q8_0 blocks) before its integer dot products::

    s_g = max_{k∈g} |x_k| / 127   (1 for an all-zero group),   x_q,k = round(x_k / s_g) ∈ [−127, 127]  (ties to even)
    y_n = s_w,n · Σ_g s_g · float32(Σ_{k∈g} x_q,k Q_nk)   (+ b_n)

Each group's sum is exact (int32; |Σ| ≤ 127² · 32); the groups are added in order in float32. One scale per group
rather than per row keeps an outlier activation (a few channels of a language model's hidden state are tens of
times larger than the rest) from flattening the other 575 of its row to a few levels. Measured, next-token loss
teacher-forced (every row rounded as in decoding): SmolLM2-135M on 2,048 tokens of Tiny Shakespeare and this
README, float32 4.0902, int8 weight-only 4.0975, per-row activation scales 4.1375 (+1.2%), groups of 32 4.0989;
on 1,024 tokens of Python source (the slow test in ``tests/layers/test_int8dot.py``) 2.6498, 2.6578, —, 2.6609;
Gemma 3 270M on the same source, 3.4208, 3.4319, —, 3.4339.

On the CPU the sums are AVX-512 VNNI's ``vpdpbusd`` (unsigned × signed bytes, four products per 32-bit lane): the
kernel feeds ``|x_q|`` and moves each activation's sign onto the weights it meets (one masked byte subtraction).
The weight is packed in blocks of 16 output rows, ``(⌈N/16⌉, K/4, 16, 4)``: one 64-byte load holds four
consecutive weights of 16 rows, and one instruction adds their products with four activations into 16 sums, so
a block's weights are read once, in order, with no horizontal sums. A step reads each weight byte once, as the
int8 weight-only path does, with far fewer instructions per byte (no int8 → float conversion, 64 multiply–adds
per instruction), so it runs at the memory's speed.

The kernel is C++ (``int8dot.cpp``, beside this file), built at first use by ``torch.utils.cpp_extension`` with the
C++ compiler torch.compile needs anyway, into ``$TOKENNET_CACHE/extensions`` (``~/.cache/tokennet/extensions``),
once per machine (about 30 s); it registers ``torch.ops.tokennet_int8dot.linear``, which torch.compile calls from a
compiled graph as an opaque operation (its output shape is declared to it here). :func:`available` says whether it
can run here (an x86 CPU with AVX-512 VNNI, a compiler, ``TOKENNET_INT8DOT`` not ``0``) and
:func:`unavailable_reason` why not.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import torch
from torch import Tensor

from ..device import cpu_flags

__all__ = ["GROUP", "available", "unavailable_reason", "pack", "unpack", "linear", "quantize_groups", "reference"]

logger = logging.getLogger(__name__)

GROUP = 32  # activations per scale

_SOURCE = Path(__file__).with_name("int8dot.cpp")
_CPU_FLAGS = ("avx512f", "avx512bw", "avx512_vnni")
_LOCK = threading.Lock()
_STATE: dict[str, object] = {}  # "ok": bool, "reason": str


def _cpu_flags() -> set[str]:
    return set(cpu_flags())


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
    t0 = time.perf_counter()
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

    took = time.perf_counter() - t0
    if took > 2:  # a build, not a load of the built library
        logger.info("built the int8 integer-dot kernel in %.1f s (once per machine: %s)", took, _build_dir())

    @torch.library.register_fake("tokennet_int8dot::linear")
    def _(x, packed, scale, bias, n):
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


def pack(q: Tensor) -> Tensor:
    """int8 weights ``Q (N, K)`` in [−127, 127] (K a multiple of 4) → the kernel's layout ``(⌈N/16⌉, K/4, 16, 4)``."""
    if q.numel() and int(q.min()) < -127:  # −(−128) does not fit a byte: the sign would not move onto it
        raise ValueError("int8dot.pack: weights must lie in [-127, 127]")
    return torch.ops.tokennet_int8dot.pack(q)


def unpack(packed: Tensor, n: int) -> Tensor:
    """:func:`pack`'s layout back to ``Q (n, K)`` int8 (a copy)."""
    nb, steps = packed.shape[:2]
    return packed.permute(0, 2, 1, 3).reshape(nb * 16, steps * 4)[:n].contiguous()


def linear(x: Tensor, packed: Tensor, scale: Tensor, bias: Tensor | None, n: int) -> Tensor:
    """``x (M, K)`` (any float dtype, K a multiple of 32) → ``y (M, N)`` float32 by the module docstring's formula."""
    return torch.ops.tokennet_int8dot.linear(x, packed, scale, bias, n)


def quantize_groups(x: Tensor) -> tuple[Tensor, Tensor]:
    """The kernel's activation rounding in PyTorch: ``x (M, K)`` → ``(x_q (M, K) int8, s (M, K/32) float32)``."""
    x = x.float()
    M, K = x.shape
    xg = x.reshape(M, K // GROUP, GROUP)
    amax = xg.abs().amax(-1)
    s = torch.where(amax == 0, torch.ones_like(amax), amax / 127.0)
    return torch.round(xg / s[..., None]).clamp(-127, 127).to(torch.int8).reshape(M, K), s


def reference(x: Tensor, q: Tensor, scale: Tensor, bias: Tensor | None = None) -> Tensor:
    """The formula, computed plainly: each group's integer sum in int64, then the kernel's float32 steps in order."""
    xq, s = quantize_groups(x)
    M, K = xq.shape
    G = K // GROUP
    sums = torch.einsum("mgk,ngk->mng", xq.long().view(M, G, GROUP), q.long().view(-1, G, GROUP))  # exact
    acc = torch.zeros(M, q.shape[0])
    for g in range(G):  # in order, a product then a sum (the kernel fuses no multiply–add)
        acc = acc + sums[:, :, g].float() * s[:, g : g + 1]
    y = acc * scale.float()
    return y if bias is None else y + bias.float()
