"""The numbers the explore page draws, all from the model: its attention maps, the rollout, and the output with
one head ablated.

- **Attention** is ``model.attention_maps(inputs)`` — the data ``tokennet viz`` draws — stacked per kind into
  ``(L, H, Nq, Nk)``: row ``i`` of layer ``ℓ``, head ``h`` is ``softmax(Q Kᵀ / √E)`` for query token ``i``.
- **Rollout** (Abnar & Zuidema 2020): ``R = Â_L ⋯ Â_1`` with ``Â = ½ mean_h A + ½ I``
  (:func:`~tokennet.viz.attention_maps.attention_rollout`), for self-attention (``self``, ``encoder``,
  ``decoder``; not across a cross-attention, whose rows and columns are different tokens).
- **Ablating a head**: the head's output is zeroed where the heads are concatenated, just before the
  attention's output projection ``out_proj`` (a forward pre-hook, removed afterwards), so the rest of the model
  sees the layer without that head — Michel et al. 2019, "Are Sixteen Heads Really Better than One?"
  (:func:`~tokennet.attention.ablation.ablated_head`, which ``tokennet heads`` uses too).
"""

from __future__ import annotations

import torch

from ...attention.ablation import ablated_head, attention_layers
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
