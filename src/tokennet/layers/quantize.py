"""Low-precision inference copies of a model: bf16 weights, or int8 weights with per-channel scales.

Decoding one token at a time reads every weight once per token and does little arithmetic with it, so
its speed is set by the bytes of weights read: fp32 → bf16 halves them, int8 quarters them.

- ``"bf16"``: every floating-point parameter and buffer in bfloat16 (activations follow);
- ``"int8"``: as ``"bf16"``, and every ``nn.Linear`` (the LM head too, also when tied to the embedding)
  becomes an :class:`Int8Linear`: weight-only int8 with one scale per output channel,
  ``W ≈ s ⊙ Q``, ``s_n = max_k |W_nk| / 127``, ``Q = round(W / s)``, multiplied by PyTorch's
  ``_weight_int8pack_mm`` (bf16 activations × int8 weights, dequantized inside the kernel);
- ``"none"``: the model itself, unchanged.

:func:`quantize` never touches the model it is given and keeps no weights derived from it anywhere
else: it returns a separate inference copy, to be built again after the model's parameters change
(an optimizer updates them in place; a stale copy would silently decode with old weights).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ConfigError

__all__ = ["QUANTIZE_MODES", "Int8Linear", "quantize", "quantize_int8", "check_mode"]

QUANTIZE_MODES = ("none", "bf16", "int8")

# _weight_int8pack_mm reads its input in blocks of 8 along K; other widths crash the CPU kernel
# (PyTorch 2.13), so such a layer stays bf16.
_K_ALIGN = 8
_ROWS = 2048  # rows quantized at a time (a block of a 384-wide matrix is 3 MiB)


def check_mode(mode: str) -> str:
    """Validate a quantization mode name; returns it."""
    if mode not in QUANTIZE_MODES:
        raise ConfigError(f"quantize must be one of {', '.join(QUANTIZE_MODES)}, got {mode!r}")
    return mode


def quantize_int8(w: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric per-output-channel int8: ``W (N, K) → (Q (N, K) int8, s (N,) float32)`` with ``W ≈ s[:, None] Q``."""
    w = w.detach().float()
    N, K = w.shape
    q = torch.empty(N, K, dtype=torch.int8, device=w.device)
    s = torch.empty(N, device=w.device)
    buf = torch.empty(min(N, _ROWS), K, device=w.device)
    # In blocks of rows that stay in cache: one pass over W instead of one per elementwise step.
    for i in range(0, N, _ROWS):
        rows = w[i : i + _ROWS]
        torch.div(torch.linalg.vector_norm(rows, ord=float("inf"), dim=1), 127.0, out=s[i : i + _ROWS])
        inv = 1.0 / s[i : i + _ROWS].clamp_min(torch.finfo(torch.float32).tiny)  # an all-zero row stays 0
        b = torch.mul(rows, inv[:, None], out=buf[: rows.shape[0]]).round_()  # |W_nk / s_n| <= 127
        q[i : i + _ROWS].copy_(b)
    return q, s


class Int8Linear(nn.Module):
    """``y = x (s ⊙ Q)ᵀ + b`` with int8 weights ``Q (N, K)`` and per-channel scales ``s (N,)``; for inference.

    Computes in bf16 (the input is cast): PyTorch's CPU kernel is fast for bf16 activations and several
    times slower for fp32 ones. Elsewhere than on the CPU the weights are dequantized at each call.

    Args:
        linear: the layer to quantize (read, not modified).
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        if linear.in_features % _K_ALIGN:
            raise ValueError(f"Int8Linear needs in_features divisible by {_K_ALIGN}, got {linear.in_features}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        q, s = quantize_int8(linear.weight)
        self.register_buffer("qweight", q)  # (N, K) int8
        self.register_buffer("scale", s.to(torch.bfloat16))  # (N,)
        b = linear.bias
        self.register_buffer("bias", None if b is None else b.detach().to(torch.bfloat16))

    def dequantized_weight(self) -> Tensor:
        """``s ⊙ Q`` ``(N, K)`` in float32 (the reference the kernel is tested against)."""
        return self.qweight.float() * self.scale.float()[:, None]

    def forward(self, x: Tensor) -> Tensor:
        """``(..., K) → (..., N)`` in bf16."""
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).to(torch.bfloat16)  # (M, K)
        if x2.device.type == "cpu":
            y = torch.ops.aten._weight_int8pack_mm(x2, self.qweight, self.scale)  # (M, N)
            if self.bias is not None:
                y += self.bias
        else:  # no int8 kernel on every accelerator: dequantize (correct, not faster)
            y = F.linear(x2, self.qweight.to(x2.dtype) * self.scale[:, None], self.bias)
        return y.view(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def _share_tensors(model: nn.Module) -> dict[int, object]:
    # deepcopy memo that maps every parameter and buffer to itself: the copy's structure is new, its
    # tensors are the original's until replaced below (no transient fp32 duplicate of the weights).
    memo: dict[int, object] = {}
    for t in list(model.parameters()) + list(model.buffers()):
        memo[id(t)] = t
    return memo


def quantize(model: nn.Module, mode: str = "int8") -> nn.Module:
    """An inference copy of ``model`` in ``mode`` (``"none"``: the model itself); the model is not modified.

    Args:
        model: any module; its ``nn.Linear`` layers are quantized in ``"int8"`` mode.
        mode: ``"none"``, ``"bf16"`` or ``"int8"`` (see the module docstring).
    """
    check_mode(mode)
    if mode == "none":
        return model
    out = copy.deepcopy(model, _share_tensors(model))
    out.eval()
    if mode == "int8":
        for m in list(out.modules()):
            for child_name, child in list(m.named_children()):
                if type(child) is nn.Linear and child.in_features % _K_ALIGN == 0:
                    setattr(m, child_name, Int8Linear(child))
    converted: dict[int, Tensor] = {}  # tied tensors (embedding = LM head) stay tied in the copy

    def low(t: Tensor) -> Tensor:
        if id(t) not in converted:
            converted[id(t)] = t.detach().to(torch.bfloat16) if t.is_floating_point() else t
        return converted[id(t)]

    for m in out.modules():
        if isinstance(m, Int8Linear):
            continue
        for k, p in m._parameters.items():
            if p is not None:
                m._parameters[k] = nn.Parameter(low(p), requires_grad=False)
        for k, b in m._buffers.items():
            if b is not None:
                m._buffers[k] = low(b)
    return out
