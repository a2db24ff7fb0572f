"""Linear layers with int8 activations and integer dot products (x86 VNNI), for decoding a few rows at a time:
int8 weights with per-channel scales (:func:`linear`), GGUF's Q8_0 / Q4_0 / Q4_1 / Q5_0 blocks (:func:`block_linear`)
and its Q4_K / Q5_K / Q6_K super-blocks (:func:`kblock_linear`).

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

GGUF blocks (:func:`block_linear`, what ``quantize(model, "int4")`` multiplies a model's Q8_0/Q4_0/Q4_1 layers
by): the activations are rounded as above, in groups of 32 that are the blocks' groups of 32 weights, and each
group's integer sum ``I_ng = Σ_{k∈g} x_q,k q_nk`` (``q`` the block's integers: Q8_0's int8, Q4's nibbles in
[0, 15]) is scaled by the block's own float16 ``d`` (and, for Q4_1, its minimum ``m`` meets ``X_g = Σ_{k∈g}
x_q,k``), as llama.cpp's ``vec_dot_q4_1_q8_1`` does; for Q4_1 (``W = d·q + m``)::

    y_n = Σ_g ((d_ng · s_g) · I_ng + m_ng · (s_g · X_g))   (+ b_n)

(:func:`block_reference`; Q4_0: ``(d_ng · s_g) · (I_ng − 8 X_g)``; Q8_0: ``(d_ng · s_g) · I_ng``). The blocks
are repacked once (:func:`pack_blocks`) into chunks of 16 output rows × 32 weights with their scales, the file's
bytes per weight, read in order: a 64-byte load holds eight 4-bit weights of 16 rows, split into two
``vpdpbusd`` operands by a mask and a shift (the nibbles are its unsigned bytes, ``x_q`` its signed ones); Q8_0
feeds ``x_q + 128`` as the unsigned bytes and subtracts ``128 Σ q`` (so −128 in a file's blocks is fine).
Measured on SmolLM2-135M-Instruct's Q4_1 file (the slow test in ``tests/layers/test_int8dot_blocks.py``):
next-token loss on 1,024 tokens of Python source 2.6547 against 2.6498 for the same blocks with float32
activations (int8 per-channel: 2.6609); teacher-forced top-1 equal to llama.cpp's on the same file at 97.3% of
positions (float32 activations 97.5%, int8 94.6%). A decoding step reads 96.6 MB of weights per token, as
llama.cpp does (int8: 135.4 MB). ``TOKENNET_BLOCKDOT=0`` switches the block kernel off alone.

Q5_0 (``W = d·(q − 16)``, ``q`` ∈ [0, 31]) is packed as Q4_0 plus a 64-byte plane of fifth bits per chunk (the
file's 22 bytes per 32 weights): ``(d_ng · s_g) · (I_ng − 16 X_g)``. The K-quants (:func:`kblock_linear`, ggml's
256-weight super-blocks: Q4_K/Q5_K ``W = d·sc_j·q − dmin·m_j`` with 6-bit ``sc``, ``m`` per 32 weights, Q6_K
``W = d·sc_j·(q − 32)`` with int8 ``sc`` per 16) are packed per 16 rows and super-block: ``d`` (and ``dmin``), then
per group of 32 the nibbles as Q4_0's, the high bits in planes, the scales a byte each (Q4_K: 148 bytes per 256
weights against the file's 144; Q5_K 180/176; Q6_K 210/210). Each group's integer sum is scaled by its sub-block
scale in integers (``J = sc · I``; Q6_K ``sc_a (I_a − 32 X_a) + sc_b (I_b − 32 X_b)``, exact, |J| < 2²⁴), and
each super-block adds ``d · Σ_g s_g · J_g − dmin · Σ_g m_g · (s_g · X_g)`` in float32
(:func:`kblock_reference`, bit for bit). Gemma 3 270M's Q4_K_M file decodes from its own Q4_K, Q6_K, Q5_0 and
Q8_0 blocks this way, 249.7 MB of weights per token (llama.cpp: 246.6); ``bench/gemma_kquants.py`` times it.

The kernel is C++ (``int8dot.cpp``, beside this file), built when tokennet is installed (``setup.py``, where the
install sees torch, as ``scripts/install.sh`` installs) into ``_int8dot.so`` beside this file. Where there is none,
or it was built against another torch (``TOKENNET_INT8DOT_PREBUILT=0`` ignores it), it is built at first use by
``torch.utils.cpp_extension`` with the C++ compiler torch.compile needs anyway, into ``$TOKENNET_CACHE/extensions``
(``~/.cache/tokennet/extensions``), once per machine (about 30 s). It registers
``torch.ops.tokennet_int8dot.linear`` (and ``blocks``, ``kblocks``; and the float steps of
:mod:`tokennet.layers.pinned`: ``rms_norm``, ``cos_sin``, ``activation``, ``attend``), which torch.compile calls
from a compiled graph as opaque operations (their output shapes are declared to it here). :func:`available` says
whether it can run here (an x86 CPU with AVX-512 VNNI, a compiler, ``TOKENNET_INT8DOT`` not ``0``) and
:func:`unavailable_reason` why not.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
from pathlib import Path

import torch
from torch import Tensor

from ..device import cpu_flags
from .blockquant import _BYTES, QK_K, _k_scales, _nibbles, pack4, unpack4, widen_to_q8_0

__all__ = ["GROUP", "BLOCK_FORMATS", "available", "unavailable_reason", "blocks_available", "blocks_unavailable_reason",
           "pack", "unpack", "linear", "quantize_groups", "reference", "pack_blocks", "unpack_blocks", "block_linear",
           "block_reference", "block_chunk_bytes", "KBLOCK_FORMATS", "kblock_parts", "pack_kblocks", "unpack_kblocks",
           "kblock_dequantize", "kblock_linear", "kblock_reference"]

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
    # the source's hash in the name: checkouts with different sources never rebuild over each other's library
    digest = hashlib.sha256(_SOURCE.read_bytes()).hexdigest()[:12]
    d = os.path.join(root, "extensions", f"int8dot-torch{torch.__version__.replace('+', '_')}-{digest}")
    os.makedirs(d, exist_ok=True)
    # torch's build takes a lock file (FileBaton) in this directory and waits while one exists: a build killed
    # mid-way leaves it, and every later first use would wait forever. A build takes a minute; one older than
    # STALE_BUILD_LOCK_S is a dead builder's.
    lock = os.path.join(d, "lock")
    with contextlib.suppress(OSError):
        if time.time() - os.path.getmtime(lock) > STALE_BUILD_LOCK_S:
            os.remove(lock)
            logger.info("removed a stale build lock (a killed build's): %s", lock)
    return d


STALE_BUILD_LOCK_S = 900.0

# The build's flags (setup.py's are these and -g0). -ffp-contract=off: no fused multiply–add, so every product and
# sum is rounded on its own, as PyTorch's kernels and Inductor's loops round them: the kernel's scaling is the
# formula's and the pinned steps (tokennet.layers.pinned) are PyTorch's, bit for bit, on any CPU.
CFLAGS = ["-O3", "-ffp-contract=off", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-fopenmp"]


def _load() -> None:
    """Build (once per machine) and load the kernel; sets ``_STATE``."""
    if os.environ.get("TOKENNET_INT8DOT", "1").strip().lower() in ("0", "false", "no", "off"):
        _STATE.update(ok=False, reason="TOKENNET_INT8DOT=0")
        return
    missing = [f for f in _CPU_FLAGS if f not in _cpu_flags()]
    if missing:
        _STATE.update(ok=False, reason=f"this CPU lacks {', '.join(missing)}")
        return
    if _load_prebuilt():
        _register_fakes()
        _STATE.update(ok=True, reason="")
        return
    t0 = time.perf_counter()
    try:
        from torch.utils import cpp_extension

        cpp_extension.load(name="tokennet_int8dot", sources=[str(_SOURCE)], build_directory=_build_dir(),
                           extra_cflags=CFLAGS,
                           extra_ldflags=["-fopenmp"], is_python_module=False, verbose=False)
    except Exception as e:  # noqa: BLE001 — no compiler, no ninja, a failed build: say why, fall back
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        _STATE.update(ok=False, reason=f"the int8dot kernel did not build ({first[:200]})")
        return

    took = time.perf_counter() - t0
    if took > 2:  # a build, not a load of the built library
        logger.info("built the int8 integer-dot kernel in %.1f s (once per machine: %s)", took, _build_dir())
    _register_fakes()
    _STATE.update(ok=True, reason="")


_PREBUILT = Path(__file__).with_name("_int8dot.so")  # built when tokennet was installed (setup.py)


def _load_prebuilt() -> bool:
    """Load the kernel built at install time (``setup.py``); False where there is none or it does not load here
    (built against another torch: its symbols differ), and the build at first use takes over."""
    if os.environ.get("TOKENNET_INT8DOT_PREBUILT", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if not _PREBUILT.is_file():
        return False
    stamp = _PREBUILT.with_name(_PREBUILT.name + ".stamp")  # setup.py: the source's and torch's hash it was built of
    want = hashlib.sha256(_SOURCE.read_bytes() + torch.__version__.encode()).hexdigest()
    if not stamp.is_file() or stamp.read_text().strip() != want:
        logger.info("the int8dot kernel built at install is of another source or torch; building it here")
        return False
    try:
        torch.ops.load_library(str(_PREBUILT))
    except (OSError, RuntimeError) as e:
        logger.info("the int8dot kernel built at install does not load (%s); building it here", e)
        return False
    return hasattr(torch.ops.tokennet_int8dot, "linear")


def _register_fakes() -> None:
    """The output shapes of the kernel's operations, for torch.compile (which calls them as opaque operations).

    Registered as Meta kernels, which fake tensors run: ``torch.library.register_fake`` would say the same, but it
    looks up its caller's source line with :mod:`inspect` (~7 ms a registration, paid by every process)."""
    lib = torch.library.Library("tokennet_int8dot", "IMPL")
    _FAKE_LIBS.append(lib)  # a registration lasts as long as its Library object
    shapes = {
        "linear": lambda x, packed, scale, bias, n: x.new_empty(x.shape[0], n, dtype=torch.float32),
        "blocks": lambda x, packed, fmt, bias, n: x.new_empty(x.shape[0], n, dtype=torch.float32),
        "kblocks": lambda x, packed, fmt, bias, n: x.new_empty(x.shape[0], n, dtype=torch.float32),
        "rms_norm": lambda x, w, eps, offset: torch.empty_like(x),
        "cos_sin": lambda freqs: (freqs.new_empty(freqs.shape[0], 2 * freqs.shape[1]),
                                  freqs.new_empty(freqs.shape[0], 2 * freqs.shape[1])),
        "activation": lambda x, kind: torch.empty_like(x),
        "attend": lambda q, k, v, mask, causal: q.new_empty(q.shape),
        "block_qkv": _block_qkv_shapes,
        "block_rest": lambda x, *rest: torch.empty_like(x),
    }
    for name, shape in shapes.items():
        lib.impl(name, shape, "Meta")


_FAKE_LIBS: list = []


def _block_qkv_shapes(x, norm_w, eps, offset, packed, fmt, bias, heads, *rest):
    """``block_qkv``'s outputs: Q ``(B, H, N, E)``, K and V ``(B, Hkv, N, E)``."""
    (B, N, _), (H, Hkv, E) = x.shape, heads
    return x.new_empty(B, H, N, E), x.new_empty(B, Hkv, N, E), x.new_empty(B, Hkv, N, E)


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


# ---- GGUF blocks × int8 activations ------------------------------------------------------------------------------

BLOCK_FORMATS = ("q8_0", "q4_0", "q4_1", "q5_0")  # the block formats the kernel multiplies (32-weight blocks)
_FMT = {"q8_0": 0, "q4_0": 1, "q4_1": 2, "q5_0": 6}  # the C++ kernel's codes
_ROWS = 16  # output rows per packed block
_STEPS = {"q8_0": 8, "q4_0": 4, "q4_1": 4, "q5_0": 4}  # 64-byte weight loads per block of 16 rows and group of 32
_BLOCKS_OFF = ("0", "false", "no", "off")


def block_chunk_bytes(fmt: str) -> int:
    """Bytes of one packed chunk (16 rows × 32 weights with their scales): 544 (Q8_0), 288 (Q4_0), 320 (Q4_1),
    352 (Q5_0: 64 bytes of fifth bits)."""
    return 64 * _STEPS[fmt] + (64 if fmt == "q5_0" else 0) + 32 * (2 if fmt == "q4_1" else 1)


def blocks_available() -> bool:
    """Whether :func:`block_linear` runs here: :func:`available`, and ``TOKENNET_BLOCKDOT`` is not ``0``."""
    return os.environ.get("TOKENNET_BLOCKDOT", "1").strip().lower() not in _BLOCKS_OFF and available()


def blocks_unavailable_reason() -> str:
    """Why :func:`blocks_available` is False ('' when it is True)."""
    if os.environ.get("TOKENNET_BLOCKDOT", "1").strip().lower() in _BLOCKS_OFF:
        return "TOKENNET_BLOCKDOT=0"
    return unavailable_reason()


_PACK_SLICE = 65536  # rows packed at a time (a multiple of 16): a large table's temporaries stay ~45 MB each


def _in_slices(pack_rows, N: int) -> Tensor:
    """``pack_rows(a, b)`` (the packed rows ``a … b − 1``) over slices of :data:`_PACK_SLICE` rows, into one tensor."""
    first = pack_rows(0, _PACK_SLICE)
    out = first.new_empty(-(-N // _ROWS), *first.shape[1:])
    out[: _PACK_SLICE // _ROWS] = first
    for a in range(_PACK_SLICE, N, _PACK_SLICE):
        part = pack_rows(a, min(a + _PACK_SLICE, N))
        out[a // _ROWS : a // _ROWS + part.shape[0]] = part
    return out


def pack_blocks(fmt: str, qs: Tensor, d: Tensor | None = None, m: Tensor | None = None) -> Tensor:
    """A :class:`~tokennet.layers.blockquant.BlockLinear`'s GGUF blocks → the kernel's layout ``(⌈N/16⌉, G, C)`` uint8.

    ``qs``: ``(N, K)`` int8 (Q8_0), ``(N, K/2)`` uint8 of GGUF's nibbles (Q4_0, Q4_1) or Q5_0's 22-byte blocks
    ``(N, G·22)`` (``d`` None: it is in them); ``d``, ``m``: ``(N, G)`` float16. Q5_0 is packed as Q4_0 (the low 4
    bits of ``q`` ∈ [0, 31]) with a 64-byte plane of fifth bits before ``d`` (bit ``j`` of byte ``4r + c``: step
    ``j``'s low-nibble weight, bit ``4 + j``: its high-nibble one). Chunk ``[b, g]`` holds rows ``16b … 16b + 15``,
    weights ``32g … 32g + 31``, in the order the kernel reads them: 64-byte steps whose byte ``4r + c`` feeds one
    ``vpdpbusd`` lane ``r`` — in Q8_0, step ``j`` holds
    ``q[16b + r, 32g + 4j + c]`` (8 steps); in Q4, step ``j`` holds ``q[16b + r, 32g + 8j + c]`` in the low nibble
    and ``q[16b + r, 32g + 8j + 4 + c]`` in the high one (4 steps); then the 16 rows' ``d`` and (Q4_1) ``m`` as
    float16. The bytes per weight are the file's (a GGUF Q4_1 block is 20 bytes per 32 weights, a chunk 16 × 20);
    rows past N are zero.
    """
    if fmt not in BLOCK_FORMATS:
        raise ValueError(f"int8dot.pack_blocks: {fmt} is not one of {BLOCK_FORMATS}")
    if fmt != "q5_0" and qs.device.type == "cpu" and available():  # the same bytes, in one pass in C++
        return torch.ops.tokennet_int8dot.pack_blocks(qs, d, m, _FMT[fmt])
    return pack_blocks_formula(fmt, qs, d, m)


def pack_blocks_formula(fmt: str, qs: Tensor, d: Tensor | None = None, m: Tensor | None = None) -> Tensor:
    """:func:`pack_blocks` as tensor operations (its layout's formula; the C++ packer gives these bytes)."""
    if qs.shape[0] > _PACK_SLICE:
        return _in_slices(lambda a, b: pack_blocks_formula(fmt, qs[a:b], None if d is None else d[a:b],
                                                   None if m is None else m[a:b]), qs.shape[0])
    if fmt == "q5_0":  # the file's 22-byte blocks: q in [0, 31] (as Q8_0's q − 16) and d
        q, d = widen_to_q8_0(fmt, qs)
        q = (q.to(torch.int16) + 16).to(torch.uint8)
    else:
        q = qs.view(torch.uint8) if fmt == "q8_0" else unpack4(qs)  # (N, K): the weights' integers (Q8_0's bits)
    N, G = d.shape
    nb = -(-N // _ROWS)
    pad = nb * _ROWS - N
    q = torch.nn.functional.pad(q, (0, 0, 0, pad)) if pad else q
    if fmt == "q8_0":
        w = q.reshape(nb, _ROWS, G, 8, 4).permute(0, 2, 3, 1, 4).reshape(nb, G, 512)  # (b, g, j, r, c)
    else:
        v = q.reshape(nb, _ROWS, G, 4, 2, 4).permute(0, 2, 3, 1, 5, 4)  # (b, g, j, r, c, half)
        w = ((v[..., 0] & 15) | ((v[..., 1] & 15) << 4)).reshape(nb, G, 256)
    parts = [w]
    if fmt == "q5_0":  # bit j: step j's low-nibble weight's fifth bit, bit 4 + j: its high-nibble one's
        j = torch.arange(4, dtype=torch.uint8)[:, None]
        hb = ((v >> 4) & 1).permute(0, 1, 3, 4, 2, 5)  # (b, g, r, c, j, half)
        parts.append((hb << torch.cat([j, j + 4], 1)).sum((-2, -1), dtype=torch.uint8).reshape(nb, G, 64))
    for t in (d, m) if fmt == "q4_1" else (d,):
        t = t.to(torch.float16).contiguous().view(torch.uint8).view(N, G, 2)
        t = torch.nn.functional.pad(t, (0, 0, 0, 0, 0, pad)) if pad else t
        parts.append(t.reshape(nb, _ROWS, G, 2).permute(0, 2, 1, 3).reshape(nb, G, 32))
    return torch.cat(parts, dim=-1).contiguous()


def unpack_blocks(fmt: str, packed: Tensor, n: int) -> tuple[Tensor, Tensor, Tensor | None]:
    """:func:`pack_blocks`'s layout back to GGUF's blocks ``(qs, d, m)`` of ``n`` rows (copies)."""
    nb, G, _ = packed.shape
    w = 64 * _STEPS[fmt] + (64 if fmt == "q5_0" else 0)
    scales = [packed[..., w + 32 * i : w + 32 * (i + 1)].reshape(nb, G, _ROWS, 2).permute(0, 2, 1, 3)
              .reshape(nb * _ROWS, G, 2)[:n].contiguous().view(torch.float16)[..., 0]
              for i in range(2 if fmt == "q4_1" else 1)]
    if fmt == "q8_0":
        qs = packed[..., :w].reshape(nb, G, 8, _ROWS, 4).permute(0, 3, 1, 2, 4).reshape(nb * _ROWS, G * 32)[:n]
        qs = qs.contiguous().view(torch.int8)
    else:
        b = packed[..., :256].reshape(nb, G, 4, _ROWS, 4)  # (b, g, j, r, c)
        v = torch.stack([b & 15, b >> 4], dim=-1)  # (b, g, j, r, c, half)
        if fmt == "q5_0":
            j = torch.arange(4, dtype=torch.uint8)
            h = packed[..., 256:320].reshape(nb, G, 1, _ROWS, 4, 1)
            v = v | (((h >> torch.stack([j, j + 4], -1)[:, None, None, :]) & 1) << 4)
        q = v.permute(0, 3, 1, 2, 5, 4).reshape(nb * _ROWS, G * 32)[:n].contiguous()  # (b, r, g, j, half, c)
        if fmt == "q5_0":
            return _q5_0_bytes(q, scales[0]), None, None
        qs = pack4(q)
    return qs, scales[0], scales[1] if fmt == "q4_1" else None


def _q5_0_bytes(q: Tensor, d: Tensor) -> Tensor:
    """Integers ``q (N, K)`` in [0, 31] and ``d (N, G)`` float16 → GGUF's Q5_0 blocks ``(N, G·22)``: d, then the
    fifth bits (bit i of a little-endian uint32 for weight i), then the low nibbles (:func:`pack4`'s)."""
    N, K = q.shape
    G = K // GROUP
    bits = ((q >> 4) & 1).to(torch.int64).view(N, G, 4, 8) << torch.arange(8)  # (N, G, byte, bit)
    qh = bits.sum(-1).to(torch.uint8)  # (N, G, 4)
    lo = pack4(q & 15).view(N, G, 16)
    return torch.cat([d.contiguous().view(torch.uint8).view(N, G, 2), qh, lo], -1).reshape(N, G * 22)


def format_code(fmt: str) -> int:
    """The C++ kernel's code of a block format (:data:`BLOCK_FORMATS`: ``blocks``; :data:`KBLOCK_FORMATS`:
    ``kblocks``)."""
    return _KFMT[fmt] if fmt in _KFMT else _FMT[fmt]


def block_linear(x: Tensor, packed: Tensor, fmt: str, bias: Tensor | None, n: int) -> Tensor:
    """``x (M, K)`` (any float dtype) → ``y (M, n)`` float32 by :func:`block_reference`'s formula."""
    return torch.ops.tokennet_int8dot.blocks(x, packed, _FMT[fmt], bias, n)


def block_reference(x: Tensor, fmt: str, qs: Tensor, d: Tensor | None = None, m: Tensor | None = None,
                    bias: Tensor | None = None) -> Tensor:
    """The block kernel's formula, computed plainly, for GGUF blocks ``qs``, ``d``, ``m`` (as ``BlockLinear`` holds).

    With ``x_q``, ``s_g`` the activations rounded as in :func:`quantize_groups`, ``q_nk`` the blocks' integers
    (Q8_0's int8, Q4's nibbles in [0, 15]), ``I_ng = Σ_{k∈g} x_q,k q_nk`` and ``X_g = Σ_{k∈g} x_q,k`` (exact),
    the groups added in order in float32, a product then a sum (no fused multiply–add)::

        Q8_0:  y_n = Σ_g (d_ng · s_g) · I_ng                          W_nk = d_ng · q_nk
        Q4_0:  y_n = Σ_g (d_ng · s_g) · (I_ng − 8 X_g)                W_nk = d_ng · (q_nk − 8)
        Q5_0:  y_n = Σ_g (d_ng · s_g) · (I_ng − 16 X_g)               W_nk = d_ng · (q_nk − 16)
        Q4_1:  y_n = Σ_g ((d_ng · s_g) · I_ng + m_ng · (s_g · X_g))   W_nk = d_ng · q_nk + m_ng

    (``+ b_n``): each group's term is ``s_g Σ_{k∈g} x_q,k W_nk`` exactly in real numbers, as llama.cpp's
    ``vec_dot_q4_1_q8_1`` computes it.
    """
    xq, s = quantize_groups(x)
    M, K = xq.shape
    G = K // GROUP
    if fmt == "q5_0":  # qs: the file's blocks, d in them
        q, d = widen_to_q8_0(fmt, qs)
        q = q.long() + 16
    else:
        q = qs.long() if fmt == "q8_0" else unpack4(qs).long()
    xg = xq.long().view(M, G, GROUP)
    sums = torch.einsum("mgk,ngk->mng", xg, q.view(-1, G, GROUP))  # I (M, N, G), exact
    X = xg.sum(-1)  # (M, G)
    if fmt in ("q4_0", "q5_0"):
        sums = sums - (8 if fmt == "q4_0" else 16) * X[:, None, :]
    df = d.float()
    acc = torch.zeros(M, q.shape[0])
    for g in range(G):
        t = (df[None, :, g] * s[:, g : g + 1]) * sums[:, :, g].float()
        if fmt == "q4_1":
            t = t + m.float()[None, :, g] * (s[:, g : g + 1] * X[:, g : g + 1].float())
        acc = acc + t
    return acc if bias is None else acc + bias.float()


# ---- GGUF K-quants (Q4_K, Q5_K, Q6_K) × int8 activations -------------------------------------------------------

KBLOCK_FORMATS = ("q4_k", "q5_k", "q6_k")  # the K-quants the kernel multiplies (256-weight super-blocks)
_KFMT = {"q4_k": 3, "q5_k": 4, "q6_k": 5}  # the C++ kernel's codes
_KCHUNK = {"q4_k": 288, "q5_k": 352, "q6_k": 416}  # bytes per 16 rows × 32 weights (scales included)
_KHEAD = {"q4_k": 64, "q5_k": 64, "q6_k": 32}  # bytes of d (and dmin) per 16 rows × 256 weights


def kblock_super_bytes(fmt: str) -> int:
    """Bytes of one packed super-chunk (16 rows × 256 weights): 2368 (Q4_K), 2880 (Q5_K), 3360 (Q6_K)."""
    return _KHEAD[fmt] + 8 * _KCHUNK[fmt]


def kblock_parts(fmt: str, raw: Tensor) -> tuple[Tensor, Tensor, Tensor | None, Tensor, Tensor | None]:
    """A row's GGUF K-quant bytes ``raw (N, T·B)`` → ``(q, sc, m, d, dmin)``: ``q (N, K)`` uint8 the weights'
    unsigned integers (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63), ``sc`` the sub-block scales (Q4_K/Q5_K ``(N, K/32)``
    uint8 0..63, Q6_K ``(N, K/16)`` int8), ``m`` Q4_K/Q5_K's mins ``(N, K/32)`` uint8, ``d`` and ``dmin`` ``(N, T)``
    float16 — ggml's layout, decoded as :func:`~tokennet.layers.blockquant.raw_dequantize` decodes it."""
    N = raw.shape[0]
    b = raw.reshape(N, -1, _BYTES[fmt])  # (N, T, B)
    T = b.shape[1]
    f16 = lambda t: t.contiguous().view(torch.float16)[..., 0]  # noqa: E731 — (N, T, 2) bytes → (N, T)
    if fmt == "q6_k":
        ql = _nibbles(b[..., 0:128].reshape(N * T, 128), 64).reshape(N * T, 8, 32)
        shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8)[:, None]
        qh = ((b[..., 128:192].reshape(N * T, 2, 1, 32) >> shifts) & 3).reshape(N * T, 8, 32)
        q = (ql | (qh << 4)).reshape(N, T * QK_K)
        return q, b[..., 192:208].reshape(N, T * 16).contiguous().view(torch.int8), None, f16(b[..., 208:210]), None
    sc, mn = _k_scales(b[..., 4:16].reshape(N * T, 12))
    q = _nibbles((b[..., 16:144] if fmt == "q4_k" else b[..., 48:176]).reshape(N * T, 128), 32)  # (N·T, 8, 32)
    if fmt == "q5_k":
        qh = b[..., 16:48].reshape(N * T, 1, 32) >> torch.arange(8, dtype=torch.uint8)[:, None]
        q = q | ((qh & 1) << 4)
    u8 = lambda t: t.to(torch.uint8).reshape(N, T * 8)  # noqa: E731
    return q.reshape(N, T * QK_K), u8(sc), u8(mn), f16(b[..., 0:2]), f16(b[..., 2:4])


def kblock_dequantize(fmt: str, q: Tensor, sc: Tensor, m: Tensor | None, d: Tensor, dmin: Tensor | None) -> Tensor:
    """:func:`kblock_parts` → the float32 weights ``(N, K)``, the ``gguf`` package's operations in its order."""
    N, K = q.shape
    sub = 16 if fmt == "q6_k" else 32
    per = QK_K // sub  # sub-blocks per super-block
    ds = (d.float()[..., None] * sc.float().view(N, -1, per)).reshape(N, -1, 1)  # (N, K/sub, 1)
    if fmt == "q6_k":
        return (ds * (q.float().view(N, -1, sub) - 32)).reshape(N, K)
    dm = (dmin.float()[..., None] * m.float().view(N, -1, per)).reshape(N, -1, 1)
    return (ds * q.float().view(N, -1, sub) - dm).reshape(N, K)


def _rows16(t: Tensor, nb: int) -> Tensor:
    """``(N, …)`` → ``(nb·16, …)`` with zero rows appended."""
    pad = nb * _ROWS - t.shape[0]
    return torch.cat([t, t.new_zeros(pad, *t.shape[1:])]) if pad else t


def pack_kblocks(fmt: str, raw: Tensor) -> Tensor:
    """A K-quant :class:`~tokennet.layers.blockquant.BlockLinear`'s bytes ``raw (N, T·B)`` → the kernel's layout
    ``(⌈N/16⌉, T, S)`` uint8 (``int8dot.cpp``, kblocks): per 16 rows and super-block, a header of ``d`` (and
    ``dmin``) as float16, then 8 chunks of 32 weights: four 64-byte steps of nibbles as :func:`pack_blocks`'s Q4,
    the high bits (Q5_K: one 64-byte plane, bit ``j`` for step ``j``'s low nibble and ``4 + j`` for its high one;
    Q6_K: two planes, bits ``2j, 2j+1``), then the 16 rows' sub-block scales and mins (Q6_K: the scales of weights
    0–15, then of 16–31). Rows past N are zero."""
    if fmt not in KBLOCK_FORMATS:
        raise ValueError(f"int8dot.pack_kblocks: {fmt} is not one of {KBLOCK_FORMATS}")
    if raw.shape[0] > _PACK_SLICE:
        return _in_slices(lambda a, b: pack_kblocks(fmt, raw[a:b]), raw.shape[0])
    q, sc, m, d, dmin = kblock_parts(fmt, raw)
    N, K = q.shape
    nb, T = -(-N // _ROWS), K // QK_K
    v = _rows16(q, nb).view(nb, _ROWS, T, 8, 4, 2, 4).permute(0, 2, 3, 4, 1, 6, 5)  # (b, t, g, j, r, c, half)
    parts = [((v[..., 0] & 15) | ((v[..., 1] & 15) << 4)).reshape(nb, T, 8, 256)]
    hb = (v >> 4).permute(0, 1, 2, 4, 5, 3, 6)  # (b, t, g, r, c, j, half): the bits above the nibble
    j = torch.arange(4, dtype=torch.uint8)[:, None]
    if fmt == "q5_k":
        parts.append(((hb & 1) << torch.cat([j, j + 4], 1)).sum((-2, -1), dtype=torch.uint8).reshape(nb, T, 8, 64))
    elif fmt == "q6_k":
        for half in (0, 1):
            parts.append(((hb[..., half] & 3) << (2 * j[:, 0])).sum(-1, dtype=torch.uint8).reshape(nb, T, 8, 64))
    per = 16 if fmt == "q6_k" else 8
    s = _rows16(sc.view(torch.uint8), nb).view(nb, _ROWS, T, 8, per // 8).permute(0, 2, 3, 4, 1)  # (b, t, g, h, r)
    parts.append(s.reshape(nb, T, 8, 2 * per))
    if m is not None:
        parts.append(_rows16(m, nb).view(nb, _ROWS, T, 8).permute(0, 2, 3, 1))
    head = [t.contiguous().view(torch.uint8).view(N, T, 2) for t in ((d,) if dmin is None else (d, dmin))]
    head = [_rows16(t, nb).view(nb, _ROWS, T, 2).permute(0, 2, 1, 3).reshape(nb, T, 32) for t in head]
    chunks = torch.cat([p.reshape(nb, T, 8, -1) for p in parts], -1).reshape(nb, T, -1)
    return torch.cat([*head, chunks], -1).contiguous()


def unpack_kblocks(fmt: str, packed: Tensor, n: int) -> tuple[Tensor, Tensor, Tensor | None, Tensor, Tensor | None]:
    """:func:`pack_kblocks`'s layout back to :func:`kblock_parts`' ``(q, sc, m, d, dmin)`` of ``n`` rows (copies)."""
    nb, T, _ = packed.shape
    H, C = _KHEAD[fmt], _KCHUNK[fmt]
    f16 = [packed[..., 32 * i : 32 * (i + 1)].reshape(nb, T, _ROWS, 2).permute(0, 2, 1, 3).reshape(nb * _ROWS, T, 2)
           [:n].contiguous().view(torch.float16)[..., 0] for i in range(H // 32)]
    c = packed[..., H:].reshape(nb, T, 8, C)
    w = c[..., :256].reshape(nb, T, 8, 4, _ROWS, 4)  # (b, t, g, j, r, c)
    v = torch.stack([w & 15, w >> 4], -1)  # (b, t, g, j, r, c, half)
    if fmt != "q4_k":
        j = torch.arange(4, dtype=torch.uint8)
        if fmt == "q5_k":
            h = c[..., 256:320].reshape(nb, T, 8, 1, _ROWS, 4, 1)
            hi = (h >> torch.stack([j, j + 4], -1)[:, None, None, :]) & 1  # (b, t, g, j, r, c, half)
            v = v | (hi << 4)
        else:
            h = torch.stack([c[..., 256:320], c[..., 320:384]], -1).reshape(nb, T, 8, 1, _ROWS, 4, 2)
            v = v | (((h >> (2 * j)[:, None, None, None]) & 3) << 4)
    q = v.permute(0, 4, 1, 2, 3, 6, 5).reshape(nb * _ROWS, T * QK_K)[:n].contiguous()  # (b, r, t, g, j, half, c)
    per = 16 if fmt == "q6_k" else 8
    s = c[..., C - 32 : C - 32 + 2 * per].reshape(nb, T, 8, per // 8, _ROWS).permute(0, 4, 1, 2, 3)
    sc = s.reshape(nb * _ROWS, T * per)[:n].contiguous()
    if fmt == "q6_k":
        return q, sc.view(torch.int8), None, f16[0], None
    m = c[..., C - 16 :].reshape(nb, T, 8, _ROWS).permute(0, 3, 1, 2).reshape(nb * _ROWS, T * 8)[:n].contiguous()
    return q, sc, m, f16[0], f16[1]


def kblock_linear(x: Tensor, packed: Tensor, fmt: str, bias: Tensor | None, n: int) -> Tensor:
    """``x (M, K)`` (any float dtype, K a multiple of 256) → ``y (M, n)`` float32 by :func:`kblock_reference`'s
    formula."""
    return torch.ops.tokennet_int8dot.kblocks(x, packed, _KFMT[fmt], bias, n)


def kblock_reference(x: Tensor, fmt: str, raw: Tensor, bias: Tensor | None = None) -> Tensor:
    """The K-quant kernel's formula, computed plainly, for a row's GGUF bytes ``raw (N, T·B)``.

    With ``x_q``, ``s_g`` as in :func:`quantize_groups`, ``q``, ``sc``, ``m``, ``d``, ``dmin`` as in
    :func:`kblock_parts`, per output ``n``: ``I_ng = Σ_{k∈g} x_q,k q_nk`` and ``X_g = Σ_{k∈g} x_q,k`` exact (for
    Q6_K over each half ``a``, ``b`` of 16 weights), ``J_ng = sc_ng · I_ng`` (Q4_K, Q5_K) or ``sc_na (I_na − 32 X_a)
    + sc_nb (I_nb − 32 X_b)`` (Q6_K), exact (|J| < 2²⁴); then over the super-blocks ``t`` in order, in float32, a
    product then a sum::

        A_nt = Σ_{g∈t} s_g · J_ng,   B_nt = Σ_{g∈t} m_ng · (s_g · X_g)      (each from 0, in order)
        y_n = Σ_t (d_nt · A_nt − dmin_nt · B_nt)    (Q6_K: Σ_t d_nt · A_nt)    (+ b_n)

    which is ``Σ_g s_g Σ_{k∈g} x_q,k W_nk`` in real numbers for ggml's ``W = d·sc·q − dmin·m`` (Q6_K ``d·sc·(q − 32)``).
    """
    q, sc, m, d, dmin = kblock_parts(fmt, raw)
    xq, s = quantize_groups(x)
    M, K = xq.shape
    N, G, T = q.shape[0], K // GROUP, K // QK_K
    x16 = xq.long().view(M, 2 * G, 16)
    I16 = torch.einsum("mhk,nhk->mnh", x16, q.long().view(N, 2 * G, 16))  # (M, N, 2G) exact
    X16 = x16.sum(-1)  # (M, 2G)
    if fmt == "q6_k":
        J = ((I16 - 32 * X16[:, None, :]) * sc.long()).view(M, N, G, 2).sum(-1)
    else:
        J = I16.view(M, N, G, 2).sum(-1) * sc.long()
    cx = s * X16.view(M, G, 2).sum(-1).float()  # (M, G)
    acc = torch.zeros(M, N)
    for t in range(T):
        A, B = torch.zeros(M, N), torch.zeros(M, N)
        for g in range(8 * t, 8 * t + 8):
            A = A + s[:, g : g + 1] * J[:, :, g].float()
            if m is not None:
                B = B + m.float()[None, :, g] * cx[:, g : g + 1]
        u = d.float()[None, :, t] * A
        if dmin is not None:
            u = u - dmin.float()[None, :, t] * B
        acc = acc + u
    return acc if bias is None else acc + bias.float()
