"""Pinned float steps: the same greedy tokens from a compiled decoding step and an eager one.

An int4 decoding copy (:func:`tokennet.layers.quantize.quantize`, the block kernel) rounds its activations to int8
before every integer product (:mod:`tokennet.layers.int8dot`). Two floats one ulp apart on either side of a
rounding boundary then become different integers, and a step later the logits differ by tenths, not by 1e-5: a
compiled step (Inductor's loops, their own order of each sum) and the eager step (PyTorch's kernels) part after a
few dozen greedy tokens where their float32 models would not (measured on SmolLM2-135M Q4_1: the first token that
differs at step 44 of 128, its eager top-2 margin 0.06).

So the float steps whose results meet such a rounding are computed by one C++ function each, with a fixed order of
every sum, called eagerly and from a compiled graph alike (there an opaque operation, its output shape declared
in :mod:`~tokennet.layers.int8dot`): the norms (:class:`PinnedRMSNorm`), RoPE's cos and sin (:class:`PinnedRotary`),
attention over the cache (:func:`pinned_attention`) and the MLP's activation (:class:`PinnedActivation`). What is
left to Inductor is one rounding per element (a residual sum, RoPE's rotation, the gate's product), which it
computes as PyTorch does (it fuses no multiply–add). Both paths then give the same floats, bit for bit, and the
same greedy tokens. :func:`pin` installs them in a copy; a compiled step keeps them (:mod:`tokennet.sampling`).

:class:`PinnedBlock` then computes a whole block with those functions and the block kernel's, in the order its
modules call them: for a step's few queries, as two C++ calls around the cache's append (``block_qkv``, ``block_rest``
in int8dot.cpp); for a longer prompt, as the PyTorch calls the modules make, without the modules. An eager decoding
step was mostly the Python around ~50 PyTorch calls per layer (bench/results/decode-step.json).

The steps are the formulas the layers they replace compute, in another order of the sums: a pinned copy's logits
differ from an unpinned one's as any two orders do, where now and then an activation rounds to the next integer.
It is not llama.cpp's order either (its activation scales and KV cache are float16): greedy text can part from
llama.cpp's at a near-tie (tests/interop/test_greedy_paths.py).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from ..attention.functional import attention
from ..attention.multihead import KVCache, MultiHeadAttention, use_kernel
from ..position.rope import RotaryEmbedding, rotate
from . import int8dot
from .block import Block
from .mlp import GatedMLP
from .norm import OffsetRMSNorm

__all__ = ["PinnedRMSNorm", "PinnedActivation", "PinnedRotary", "PinnedBlock", "pinned_attention", "pin",
           "is_pinned", "EAGER_QUERIES"]

# A prompt of more queries than this is attended by the layer's own backend (a fused kernel, faster there): it is
# eager in both paths (a compiled step takes one token, a verification a few), so the paths still agree.
EAGER_QUERIES = 64

_ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}


def _ops():
    return torch.ops.tokennet_int8dot


class PinnedRMSNorm(nn.Module):
    """``y = x / √(mean(x²) + ε) ⊙ (w + offset)`` over the last dim in float32 (the squares summed in order, in
    float64): ``nn.RMSNorm`` (offset 0) or Gemma's :class:`~tokennet.layers.norm.OffsetRMSNorm` (offset 1).

    Args:
        norm: the layer replaced (its weight is shared, not copied).
    """

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.weight = norm.weight
        self.offset = 1.0 if isinstance(norm, OffsetRMSNorm) else 0.0
        eps = norm.eps
        self.eps = float(torch.finfo(torch.float32).eps if eps is None else eps)

    def forward(self, x: Tensor) -> Tensor:
        return _norm(_Norm(self.weight.float(), self.eps, self.offset), x.float()).to(x.dtype)

    def extra_repr(self) -> str:
        return f"dim={self.weight.numel()}, eps={self.eps}, offset={self.offset}"


class PinnedActivation(nn.Module):
    """SiLU ``x σ(x)`` or GELU's tanh form, elementwise in float32.

    Args:
        kind: ``"silu"`` or ``"gelu_tanh"``.
    """

    def __init__(self, kind: str):
        super().__init__()
        if kind not in _ACTIVATIONS:
            raise ValueError(f"PinnedActivation takes {sorted(_ACTIVATIONS)}, not {kind!r}")
        self.kind, self.code = kind, _ACTIVATIONS[kind]

    def forward(self, x: Tensor) -> Tensor:
        return _ops().activation(x.float().contiguous(), self.code).to(x.dtype)

    def extra_repr(self) -> str:
        return self.kind


class PinnedRotary(RotaryEmbedding):
    """:class:`~tokennet.position.rope.RotaryEmbedding` whose cos and sin of the angles ``i·θ_j`` are taken in C++
    (the angles themselves are one product each, the same in both paths).

    Args:
        rope: the tables' module replaced (its ``inv_freq`` is shared).
    """

    def __init__(self, rope: RotaryEmbedding):
        nn.Module.__init__(self)
        self.head_dim, self.base = rope.head_dim, rope.base
        self.register_buffer("inv_freq", rope.inv_freq, persistent=False)

    def cos_sin(self, freqs: Tensor) -> tuple[Tensor, Tensor]:
        if freqs.dtype != torch.float32:
            return super().cos_sin(freqs)
        rows = freqs.reshape(-1, freqs.shape[-1]).contiguous()
        cos, sin = _ops().cos_sin(rows)
        shape = (*freqs.shape[:-1], 2 * freqs.shape[-1])
        return cos.view(shape), sin.view(shape)


def pinned_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, *, bias: Tensor | None, dropout: float,
                     return_weights: bool, is_causal: bool = False) -> Tensor | None:
    """An attention kernel (:func:`~tokennet.attention.multihead.use_kernel`): ``softmax(Q Kᵀ / √E) V`` in C++, keys
    in order (scores, their maximum, ``exp``, the weighted sum of values, then one division), for a step's few
    queries against the cache; a boolean mask ``(N, L)`` or ``(B or 1, 1, N or 1, L)`` and the causal rule (the
    queries are the last ``N`` positions) both apply; a query with no key gives 0. Float32 only. A longer prompt
    (more than :data:`EAGER_QUERIES` queries, eager in every path), a bias, dropout or the weights asked for are left
    to the layer's backend (None)."""
    if bias is not None or dropout or return_weights or q.dtype != torch.float32:
        return None
    B, H, N, _ = q.shape
    if not torch.compiler.is_compiling() and N > EAGER_QUERIES:  # (compiling, N may be symbolic: no guard on it)
        return None
    if not _takes_mask(mask):
        return None
    if q.stride(-1) != 1:
        q = q.contiguous()
    return _ops().attend(q, k, v, _keys_mask(mask, B, N, k.shape[2]), is_causal)


def _takes_mask(mask: Tensor | None) -> bool:
    """Whether the C++ attention takes ``mask``: none, or boolean ``(N, L)`` or ``(B or 1, 1, N or 1, L)``."""
    return mask is None or (mask.dtype == torch.bool and mask.dim() in (2, 4) and
                            (mask.dim() == 2 or mask.shape[1] == 1))


def _keys_mask(mask: Tensor | None, B: int, N: int, L: int) -> Tensor | None:
    """``mask`` (one :func:`_takes_mask` takes) as the C++ attention reads it: ``(B, N, L)``, a view."""
    return None if mask is None else (mask if mask.dim() == 4 else mask[None, None]).expand(B, 1, N, L)[:, 0]


class _Product(NamedTuple):
    """What a :class:`~tokennet.layers.quantize.BlockDotLinear`'s forward passes to its kernel."""

    packed: Tensor
    code: int  # the kernel's format code
    bias: Tensor | None
    n: int  # out_features
    k: int  # in_features
    kquant: bool  # a K-quant (the kblocks kernel)


def _product(lin: nn.Module) -> _Product:
    return _Product(lin.packed, int8dot.format_code(lin.fmt), lin.bias, lin.out_features, lin.in_features,
                    lin.fmt in int8dot.KBLOCK_FORMATS)


def _dot(p: _Product, x: Tensor) -> Tensor:
    """The layer's product, ``(..., K) → (..., N)`` float32: the kernel call its forward makes, without the module."""
    kernel = _ops().kblocks.default if p.kquant else _ops().blocks.default
    return kernel(x.reshape(-1, p.k), p.packed, p.code, p.bias, p.n).view(*x.shape[:-1], p.n)


class _Norm(NamedTuple):
    weight: Tensor
    eps: float
    offset: float


def _norm(p: _Norm, x: Tensor) -> Tensor:
    """:class:`PinnedRMSNorm`'s forward on float32 ``x``, without the module call."""
    return _ops().rms_norm.default(x.reshape(-1, x.shape[-1]).contiguous(), p.weight, p.eps, p.offset).view(x.shape)


class PinnedBlock(Block):
    """A transformer block of an int4 copy whose forward computes the block's own formulas with the same kernels, in
    the same order, as its sublayers' modules do, without calling them: for up to :data:`EAGER_QUERIES` queries (a
    decoding step, a verification), two C++ calls around the cache's append (:meth:`_in_two_calls`); else the
    PyTorch calls the modules make. The Python around ~50 calls per layer was most of what an eager step spent
    outside the kernels (``bench/results/decode-step.json``: the step before and after).

    The same floats, bit for bit, as :class:`~tokennet.layers.block.Block`'s forward on the same copy (tested): the
    pinned float steps, the block kernel, RoPE's rotation and the residual sums are the operations the modules
    call. Made by :func:`pin` (the block's class is changed in place) where every part is one it knows: pre or
    sandwich norms that are :class:`PinnedRMSNorm`, self-attention whose projections are block-kernel layers, a
    gated MLP with a pinned activation, dropout off. Any other call (attention weights asked for, a bias, a
    context) is the block's own forward."""

    def forward(self, x: Tensor, context: Tensor | None = None, *, mask: Tensor | None = None,
                is_causal: bool = False, context_mask: Tensor | None = None, rope=None, bias: Tensor | None = None,
                cache: KVCache | None = None, cross_cache: KVCache | None = None, return_weights: bool = False):
        if (context is not None or bias is not None or return_weights or self.training or x.dtype != torch.float32
                or x.dim() != 3):
            return super().forward(x, context, mask=mask, is_causal=is_causal, context_mask=context_mask, rope=rope,
                                   bias=bias, cache=cache, cross_cache=cross_cache, return_weights=return_weights)
        lean = self.lean
        if lean.one_norm is not None and (torch.compiler.is_compiling() or x.shape[1] <= EAGER_QUERIES):
            whole = self._in_two_calls(x, mask, is_causal, rope, cache)
            if whole is not None:
                return whole
        out = self._attention(_norm(lean.norm1, x), mask, is_causal, rope, cache)
        x = x + (_norm(lean.post_attn_norm, out) if lean.sandwich else out)
        normed = _norm(lean.norm2, x)
        hidden = _ops().activation.default(_dot(lean.gate, normed), lean.act) * _dot(lean.fc1, normed)
        out = _dot(lean.fc2, hidden)
        return x + (_norm(lean.post_mlp_norm, out) if lean.sandwich else out)

    def _in_two_calls(self, x: Tensor, mask: Tensor | None, is_causal: bool, rope, cache: KVCache | None):
        """The block as two C++ calls around the cache's append, where its norms share one ε and offset and the mask
        (if any) is a boolean one: ``block_qkv`` (norm, the QKV product, heads, Q/K norms, RoPE) and ``block_rest``
        (attention, the output product, residual, norm, gated MLP, residual): the steps below, in their order, ~45
        PyTorch calls fewer a layer. None where it does not apply (the steps below then run)."""
        if rope is not None and (rope[0].dtype != torch.float32 or rope[1].dtype != torch.float32):
            return None
        if not _takes_mask(mask):
            return None
        lean, ops = self.lean, _ops()
        eps, offset = lean.one_norm
        qk_norm = lean.q_norm or _Norm(None, 0.0, 0.0)
        cos, sin = rope if rope is not None else (None, None)
        q, k, v = ops.block_qkv.default(x, lean.norm1.weight, eps, offset, lean.qkv.packed, lean.qkv.code,
                                        lean.qkv.bias, lean.heads, cos, sin, qk_norm.weight,
                                        None if lean.k_norm is None else lean.k_norm.weight, qk_norm.eps,
                                        qk_norm.offset)
        if cache is not None:
            k, v = cache.append(k, v)
        B, N, _ = x.shape
        post_attn, post_mlp = ((lean.post_attn_norm.weight, lean.post_mlp_norm.weight) if lean.sandwich else
                               (None, None))
        keys_mask = _keys_mask(mask, B, N, k.shape[2])
        return ops.block_rest.default(x, q, k, v, keys_mask, is_causal, lean.out.packed, lean.out.code, lean.out.bias,
                                      post_attn, lean.norm2.weight, lean.gate.packed, lean.gate.code, lean.gate.bias,
                                      lean.fc1.packed, lean.fc1.code, lean.fc1.bias, lean.fc2.packed, lean.fc2.code,
                                      lean.fc2.bias, post_mlp, lean.gate.n, eps, offset, lean.act)

    def _attention(self, normed: Tensor, mask: Tensor | None, is_causal: bool, rope, cache: KVCache | None) -> Tensor:
        """:class:`~tokennet.attention.multihead.MultiHeadAttention`'s self-attention of ``normed``, projected."""
        lean = self.lean
        B, N, _ = normed.shape
        H, Hkv, E = lean.heads
        if rope is not None and lean.q_norm is None:  # Q and K turned by one rotation, as the layer does
            q_and_k, v = _dot(lean.qkv, normed).split([(H + Hkv) * E, Hkv * E], -1)
            q_and_k = rotate(q_and_k.reshape(B, N, H + Hkv, E).transpose(1, 2), *rope)
            q, k = q_and_k.split([H, Hkv], 1)
        else:
            q, k, v = _dot(lean.qkv, normed).split([H * E, Hkv * E, Hkv * E], -1)
            q, k = q.reshape(B, N, H, E).transpose(1, 2), k.reshape(B, N, Hkv, E).transpose(1, 2)
            if lean.q_norm is not None:
                q, k = _norm(lean.q_norm, q), _norm(lean.k_norm, k)
            if rope is not None:
                q, k = rotate(q, *rope), rotate(k, *rope)
        v = v.reshape(B, N, Hkv, E).transpose(1, 2)
        if cache is not None:
            k, v = cache.append(k, v)
        out = pinned_attention(q, k, v, mask, bias=None, dropout=0.0, return_weights=False, is_causal=is_causal)
        if out is None:
            out = attention(q, k, v, mask, is_causal=is_causal, dropout=0.0, backend=lean.backend)
        return _dot(lean.out, out.transpose(1, 2).reshape(B, N, H * E))


class _Lean(NamedTuple):
    """A :class:`PinnedBlock`'s parts, read once (a module's attribute lookups cost more than a step's arithmetic)."""

    norm1: _Norm
    norm2: _Norm
    post_attn_norm: _Norm | None
    post_mlp_norm: _Norm | None
    sandwich: bool
    q_norm: _Norm | None
    k_norm: _Norm | None
    heads: tuple[int, int, int]  # H, Hkv, E
    qkv: _Product
    out: _Product
    backend: str
    gate: _Product
    fc1: _Product
    fc2: _Product
    act: int  # the activation's kernel code
    one_norm: tuple[float, float] | None  # the (ε, offset) every block norm shares (Q's and K's: theirs); else None


def _lean_parts(block: Block) -> _Lean:
    attn, mlp = block.attn, block.mlp

    def norm(m: nn.Module | None) -> _Norm | None:
        return None if m is None else _Norm(m.weight, m.eps, m.offset)

    norms = [norm(block.norm1), norm(block.norm2), norm(getattr(block, "post_attn_norm", None)),
             norm(getattr(block, "post_mlp_norm", None))]
    q_norm, k_norm = norm(attn.q_norm), norm(attn.k_norm)
    shared = {(n.eps, n.offset) for n in norms[:2] + (norms[2:] if block.sandwich else [])}
    shared_qk = q_norm is None or (q_norm.eps, q_norm.offset) == (k_norm.eps, k_norm.offset)
    return _Lean(*norms, block.sandwich, q_norm, k_norm, (attn.num_heads, attn.num_kv_heads, attn.head_dim),
                 _product(attn.qkv_proj), _product(attn.out_proj), attn.backend, _product(mlp.gate),
                 _product(mlp.fc1), _product(mlp.fc2), mlp.act.code,
                 next(iter(shared)) if len(shared) == 1 and shared_qk else None)


def _lean(block: nn.Module, product: type) -> bool:
    """Whether :class:`PinnedBlock` computes ``block`` (after its norms and activation are pinned), its linear layers
    all of class ``product``."""
    if type(block) is not Block or not block.pre or block.cross_attn is not None or type(block.drop) is not nn.Identity:
        return False
    attn, mlp = block.attn, block.mlp
    norms = [block.norm1, block.norm2] + ([block.post_attn_norm, block.post_mlp_norm] if block.sandwich else [])
    if not isinstance(attn, MultiHeadAttention) or attn.is_cross or not attn.value_proj or attn.dropout:
        return False
    if attn.k_norm is not None:
        norms += [attn.q_norm, attn.k_norm]
    if type(attn.out_drop) is not nn.Identity or type(mlp) is not GatedMLP or type(mlp.drop) is not nn.Identity:
        return False
    return (all(type(n) is PinnedRMSNorm for n in norms) and type(mlp.act) is PinnedActivation
            and all(type(lin) is product for lin in (attn.qkv_proj, attn.out_proj, mlp.gate, mlp.fc1, mlp.fc2)))


def is_pinned(net: nn.Module) -> bool:
    """Whether :func:`pin` installed the pinned steps in ``net``."""
    return bool(getattr(net, "_pinned_float_steps", False))


def pin(net: nn.Module, product: type | None = None) -> nn.Module:
    """Install the pinned float steps in ``net`` (a decoding copy, modified in place) and return it: every RMSNorm,
    the RoPE tables, every self-attention's kernel and the SiLU / GELU-tanh activations; and, where ``product`` is
    given (the block kernel's layer class, :class:`~tokennet.layers.quantize.BlockDotLinear`), every block whose
    linear layers are all of it becomes a :class:`PinnedBlock`. Layers of other kinds stay as they are. A no-op
    where the C++ library does not run (:func:`tokennet.layers.int8dot.available`)."""
    if not int8dot.available():
        return net
    for m in list(net.modules()):
        for name, child in list(m.named_children()):
            if type(child) in (nn.RMSNorm, OffsetRMSNorm):
                setattr(m, name, PinnedRMSNorm(child))
            elif type(child) is RotaryEmbedding:
                setattr(m, name, PinnedRotary(child))
            elif type(child) is nn.SiLU:
                setattr(m, name, PinnedActivation("silu"))
            elif type(child) is nn.GELU and child.approximate == "tanh":
                setattr(m, name, PinnedActivation("gelu_tanh"))
    if any(isinstance(m, MultiHeadAttention) for m in net.modules()):
        use_kernel(net, pinned_attention)
    for m in net.modules():
        if product is not None and _lean(m, product):
            m.lean = _lean_parts(m)
            m.__class__ = PinnedBlock
    net._pinned_float_steps = True
    return net
