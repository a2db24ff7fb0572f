"""Ablating one head of a multi-head attention layer: its output zeroed, or replaced by its mean.

The lecture: *"each attention layer can be attending to different things"*. One way to see what a head is for is
to take it away and measure what the model gets worse at. A layer's heads each compute ``A_h V_h`` and are
concatenated, ``[A_1 V_1, …, A_H V_H]`` ``(B, N, H·E)``, before the output projection ``W_o`` (``out_proj``).
Ablating head ``h`` changes its slice of that concatenation, so the rest of the model sees the layer without what
that head found:

- ``zero``: the slice is 0 (Michel et al. 2019, "Are Sixteen Heads Really Better than One?",
  https://arxiv.org/abs/1905.10650);
- ``mean``: the slice is the head's mean output at each position over a set of inputs (:class:`HeadMeans`): the
  head still adds what it adds on average, only what it computed *for this input* is gone (mean ablation, Wang et
  al. 2022, https://arxiv.org/abs/2211.00593). Zeroing can hurt a model only because the next layer never saw a
  zero there; the mean is the gentler, fairer test of whether a head's *job* matters.

The change is a forward pre-hook on ``out_proj``, removed when the ``with`` block ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from ..errors import DataError
from .multihead import MultiHeadAttention

__all__ = ["ABLATIONS", "ablated_head", "attention_layers", "self_attention_layers", "HeadMeans", "recorded_means"]

ABLATIONS = ("zero", "mean")


def attention_layers(model: nn.Module, kind: str, num_layers: int) -> list[MultiHeadAttention] | None:
    """The attention module of each layer of ``kind``, in order: ``cross`` the cross-attention modules,
    ``encoder`` / ``decoder`` the self-attention modules under the model's ``encoder`` / ``decoder``, ``self`` all
    self-attention modules — or None when they do not line up one per layer."""
    found = []
    for name, module in model.named_modules():
        if not isinstance(module, MultiHeadAttention) or module.is_cross != (kind == "cross"):
            continue
        if kind in ("encoder", "decoder") and not name.startswith(kind + "."):
            continue
        found.append(module)
    return found if len(found) == num_layers else None


def self_attention_layers(model: nn.Module) -> list[MultiHeadAttention]:
    """Every self-attention module of ``model``, in the order the model holds them (empty for a CNN)."""
    return [module for module in model.modules() if isinstance(module, MultiHeadAttention) and not module.is_cross]


def _head_slice(attention: MultiHeadAttention, head: int) -> slice:
    """Head ``head``'s columns in the concatenated heads ``(…, H·E)``."""
    if not 0 <= head < attention.num_heads:
        raise DataError(f"head {head} out of range: 0..{attention.num_heads - 1}")
    return slice(head * attention.head_dim, (head + 1) * attention.head_dim)


@contextlib.contextmanager
def ablated_head(attention: MultiHeadAttention, head: int, replacement: Tensor | None = None) -> Iterator[None]:
    """Inside the block, head ``head`` of ``attention`` contributes ``replacement`` instead of its output: its slice
    of the concatenated heads ``(B, N, H·E)`` before ``out_proj`` is zeroed (``replacement=None``) or set to
    ``replacement`` ``(N, E)`` (one row per position: :meth:`HeadMeans.head`)."""
    columns = _head_slice(attention, head)

    def replace_head(_module, args):
        concatenated = args[0].clone()
        if replacement is None:
            concatenated[..., columns] = 0
        else:
            if replacement.shape[0] != concatenated.shape[-2]:
                raise DataError(f"the head's mean was taken over {replacement.shape[0]} positions, this input has "
                                f"{concatenated.shape[-2]}")
            concatenated[..., columns] = replacement.to(concatenated)
        return (concatenated, *args[1:])

    handle = attention.out_proj.register_forward_pre_hook(replace_head)
    try:
        yield
    finally:
        handle.remove()


class HeadMeans:
    """A layer's concatenated heads ``(B, N, H·E)`` summed over every input it saw: each head's mean output per
    position, ``(N, E)``, for mean ablation."""

    def __init__(self, attention: MultiHeadAttention):
        self.attention = attention
        self.total: Tensor | None = None
        self.count = 0

    def add(self, concatenated: Tensor) -> None:
        rows = concatenated.detach().float().reshape(-1, *concatenated.shape[-2:])  # (B, N, H·E)
        summed = rows.sum(0).cpu()  # (N, H·E)
        if self.total is not None and self.total.shape != summed.shape:
            raise DataError("mean ablation needs inputs of one length; these differ")
        self.total = summed if self.total is None else self.total + summed
        self.count += rows.shape[0]

    def head(self, head: int) -> Tensor:
        """Head ``head``'s mean output at each position ``(N, E)``."""
        if self.total is None:
            raise DataError("no input was recorded: the mean of a head needs at least one")
        return self.total[:, _head_slice(self.attention, head)] / self.count


@contextlib.contextmanager
def recorded_means(attentions: list[MultiHeadAttention]) -> Iterator[list[HeadMeans]]:
    """Inside the block, every forward through ``attentions`` adds its heads' outputs to one :class:`HeadMeans` per
    layer (the model's output is unchanged)."""
    means = [HeadMeans(attention) for attention in attentions]
    handles = []
    for mean in means:
        def record(_module, args, mean=mean):
            mean.add(args[0])
        handles.append(mean.attention.out_proj.register_forward_pre_hook(record))
    try:
        with torch.no_grad():
            yield means
    finally:
        for handle in handles:
            handle.remove()
