"""What the conditional decoders share: token-id checks, ``(src, tgt)`` inputs, the loss, the decoding state.

The families that write a sequence ``y`` given a condition ``x`` — :mod:`~tokennet.models.seq2seq` (a
source sentence), :mod:`~tokennet.models.bahdanau` (the same, with an RNN) and
:mod:`~tokennet.models.captioner` (an image) — all predict ``p(y_t | y_{<t}, x)`` from the target shifted
right (``<bos> y₁ … y_{T−1}``) and are trained on the mean token cross-entropy
``L = −(1/T) Σ_t log p(y_t | y_{<t}, x)``. The encoder–decoders carry an :class:`EncoderDecoderState`
between decoding steps (the protocol of :mod:`tokennet.decode`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..attention.multihead import KVCache

__all__ = ["check_token_ids", "condition_target", "source_target", "seq_loss", "EncoderDecoderState"]


def check_token_ids(ids: Tensor, vocab_size: int, max_len: int, what: str) -> None:
    """Raise ``ValueError`` unless ``ids`` is a ``(B, N)`` integer tensor with ``1 <= N <= max_len`` in range."""
    if not torch.is_tensor(ids) or ids.dim() != 2 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        shape = tuple(ids.shape) if torch.is_tensor(ids) else type(ids).__name__
        raise ValueError(f"{what} must be a (B, N) integer tensor of token ids, got {shape}")
    if ids.shape[1] < 1:
        raise ValueError(f"{what} is empty (N=0); give at least one token")
    if ids.shape[1] > max_len:
        raise ValueError(f"{what} has {ids.shape[1]} tokens, more than the model's maximum of {max_len}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(f"{what} has ids outside the vocabulary [0, {vocab_size})")


def condition_target(inputs, *, pair: str, names: tuple[str, str]) -> tuple[Tensor, Tensor]:
    """``(x, tgt_in)`` from a pair of the condition ``x`` and the shifted target, checking the batch sizes agree.

    Args:
        inputs: the pair (a tuple or list of two).
        pair: what the pair holds, for the error, e.g. ``"(src (B, S), tgt_in (B, T)) of token ids"``.
        names: what to call ``x`` and the target in the batch-size error, e.g. ``("source", "target")``.
    """
    if not isinstance(inputs, (tuple, list)) or len(inputs) != 2:
        raise ValueError(f"inputs must be a pair {pair}")
    x, tgt = inputs
    if torch.is_tensor(x) and torch.is_tensor(tgt) and x.shape[0] != tgt.shape[0]:
        raise ValueError(f"{names[0]} and {names[1]} batch sizes differ: {x.shape[0]} vs {tgt.shape[0]}")
    return x, tgt


def source_target(inputs) -> tuple[Tensor, Tensor]:
    """``(src, tgt_in)`` from a pair (or a dict with keys ``src``, ``tgt``), checking the batch sizes agree."""
    if isinstance(inputs, dict):
        inputs = (inputs.get("src"), inputs.get("tgt"))
    return condition_target(inputs, pair="(src (B, S), tgt_in (B, T)) of token ids", names=("source", "target"))


def seq_loss(logits: Tensor, targets: Tensor | None, label_smoothing: float = 0.0) -> Tensor | None:
    """Mean token cross-entropy of ``logits`` ``(B, T, V)`` against ``targets`` ``(B, T)`` (-100 ignored).

    ``L = −(1/|K|) Σ_{(b, t) ∈ K} log p(y_bt | y_b<t, x_b)`` over the kept positions ``K``; with label
    smoothing ε the target distribution is ``(1 − ε) onehot(y) + ε / V`` (Szegedy et al. 2016,
    https://arxiv.org/abs/1512.00567).

    Args:
        logits: next-token logits ``(B, T, V)``.
        targets: next-token ids ``(B, T)``, -100 where ignored; None gives no loss.
        label_smoothing: ε in ``[0, 1)``.
    """
    if targets is None:
        return None
    if targets.shape != logits.shape[:2]:
        raise ValueError(f"targets of shape {tuple(targets.shape)} do not match logits {tuple(logits.shape[:2])}")
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100,
                           label_smoothing=label_smoothing)


@dataclass
class EncoderDecoderState:
    """What an encoder–decoder carries between decoding steps: the encoder output and the caches.

    Args:
        memory: encoder output ``(B, M, D)``.
        mask: cross-attention mask ``(B, 1, 1, M)`` (None = attend everywhere).
        caches: decoder self-attention caches (None = uncached decoding).
        cross_caches: static caches of the cross-attention keys/values (None = uncached).
    """

    memory: Tensor
    mask: Tensor | None
    caches: list[KVCache] | None
    cross_caches: list[KVCache] | None

    @property
    def use_cache(self) -> bool:
        return self.caches is not None

    @property
    def batch_size(self) -> int:
        return self.memory.shape[0]

    def reorder(self, index: Tensor) -> None:
        """Select (or repeat) batch rows, e.g. to expand to beams or keep the surviving hypotheses."""
        self.memory = self.memory.index_select(0, index)
        if self.mask is not None:
            self.mask = self.mask.index_select(0, index)
        for cache in (self.caches or []) + (self.cross_caches or []):
            cache.reorder(index)
