"""The numbers the explore page draws, all from the model: its attention maps, the rollout, and the output with
one head ablated.

- **Attention** is ``model.attention_maps(inputs)`` — the data ``tokennet viz`` draws — stacked per kind into
  ``(L, H, Nq, Nk)``: row ``i`` of layer ``ℓ``, head ``h`` is ``softmax(Q Kᵀ / √E)`` for query token ``i``.
- **Rollout** (Abnar & Zuidema 2020): ``R = Â_L ⋯ Â_1`` with ``Â = ½ mean_h A + ½ I``
  (:func:`~tokennet.viz.attention_maps.attention_rollout`), for self-attention (``self``, ``encoder``,
  ``decoder``; not across a cross-attention, whose rows and columns are different tokens).
- **Ablating a head**: the head's output is zeroed where the heads are concatenated, just before the
  attention's output projection ``out_proj`` (a forward pre-hook, removed afterwards), so the rest of the model
  sees the layer without that head — Michel et al. 2019, "Are Sixteen Heads Really Better than One?".
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from ...attention.multihead import MultiHeadAttention
from ...errors import DataError
from ..attention_maps import attention_rollout

__all__ = ["Inspection", "attention_layers", "ablated_head", "SELF_KINDS"]

SELF_KINDS = ("self", "encoder", "decoder")  # kinds whose queries and keys are the same tokens


class Inspection:
    """One input's attention, per kind ``(L, H, Nq, Nk)`` float32 on the CPU, and its rollout (self-attention)."""

    def __init__(self, maps: dict[str, list[torch.Tensor]]):
        self.maps = {kind: torch.stack([layer[0].float().cpu() for layer in layers])  # (L, H, Nq, Nk)
                     for kind, layers in maps.items() if layers}
        self._rollouts: dict[str, torch.Tensor] = {}

    def shape(self, kind: str) -> tuple[int, int, int, int]:
        return tuple(self.tensor(kind).shape)

    def tensor(self, kind: str) -> torch.Tensor:
        if kind not in self.maps:
            raise DataError(f"no {kind!r} attention in this run; it has: {', '.join(self.maps)}")
        return self.maps[kind]

    def row(self, kind: str, query: int) -> torch.Tensor:
        """Query token ``query``'s attention in every layer and head ``(L, H, Nk)``."""
        maps = self.tensor(kind)
        if not 0 <= query < maps.shape[2]:
            raise DataError(f"token {query} out of range: 0..{maps.shape[2] - 1}")
        return maps[:, :, query]

    def matrix(self, kind: str, layer: int, head: int) -> torch.Tensor:
        """One head's whole attention matrix ``(Nq, Nk)``."""
        maps = self.tensor(kind)
        if not 0 <= layer < maps.shape[0]:
            raise DataError(f"layer {layer} out of range: 0..{maps.shape[0] - 1}")
        if not 0 <= head < maps.shape[1]:
            raise DataError(f"head {head} out of range: 0..{maps.shape[1] - 1}")
        return maps[layer, head]

    def rollout_row(self, kind: str, query: int) -> torch.Tensor | None:
        """Row ``query`` of the rollout of a self-attention kind ``(N,)`` (None for cross-attention)."""
        maps = self.tensor(kind)
        if kind not in SELF_KINDS or maps.shape[2] != maps.shape[3]:
            return None
        if kind not in self._rollouts:
            self._rollouts[kind] = attention_rollout([layer[None] for layer in maps])[0]  # (N, N)
        return self._rollouts[kind][query]


def attention_layers(model: nn.Module, kind: str, num_layers: int) -> list[MultiHeadAttention] | None:
    """The attention module of each layer of ``kind``, in order: ``cross`` the cross-attention modules,
    ``encoder`` / ``decoder`` the self-attention modules under the model's ``encoder`` / ``decoder``, ``self`` all
    self-attention modules — or None when they do not line up one per layer (the page then offers no ablation)."""
    found = []
    for name, module in model.named_modules():
        if not isinstance(module, MultiHeadAttention) or module.is_cross != (kind == "cross"):
            continue
        if kind in ("encoder", "decoder") and not name.startswith(kind + "."):
            continue
        found.append(module)
    return found if len(found) == num_layers else None


@contextlib.contextmanager
def ablated_head(attention: MultiHeadAttention, head: int) -> Iterator[None]:
    """Inside the block, head ``head`` of ``attention`` contributes nothing (its slice of the concatenated heads
    ``(B, N, H·E)`` is zeroed before ``out_proj``)."""
    if not 0 <= head < attention.num_heads:
        raise DataError(f"head {head} out of range: 0..{attention.num_heads - 1}")
    width = attention.head_dim
    start, stop = head * width, (head + 1) * width

    def zero_head(_module, args):
        concatenated = args[0].clone()
        concatenated[..., start:stop] = 0
        return (concatenated, *args[1:])

    handle = attention.out_proj.register_forward_pre_hook(zero_head)
    try:
        yield
    finally:
        handle.remove()
