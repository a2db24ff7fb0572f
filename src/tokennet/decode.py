"""Decoding conditional models (translation, captioning): greedy search and beam search.

Works with every model that follows the conditional decoding protocol — :class:`~tokennet.models.seq2seq.Seq2Seq`,
:class:`~tokennet.models.bahdanau.Bahdanau`, the captioners:

- ``state = model.init_decode(inputs, use_cache=True)`` encodes the condition once (the source
  sentence, the image) and holds whatever the steps need: the encoder output and, when cached, the
  decoder's self-attention KV caches and the cross-attention keys/values computed at the first step;
- ``model.decode_step(tokens, state) → logits (B, n, V)``: with the cache ``tokens`` are only the new
  tokens; without it, the whole prefix (everything is recomputed, the reference the cache is tested
  against);
- ``state.reorder(index)`` selects batch rows (to expand to beams and follow the surviving ones), and
  ``state.batch_size`` is the number of rows.

Sequences start with ``config.bos_id`` and end at ``config.eos_id``; the returned ids exclude
``<bos>`` and hold ``pad_id`` after ``<eos>``.

Beam search keeps the ``beam_size`` best partial hypotheses by total log-probability; a hypothesis
that emitted ``<eos>`` is frozen (its only continuation is ``<pad>`` at no cost) and competes with the
open ones. At the end each hypothesis is scored ``log p(y | x) / lp(y)`` with the GNMT length penalty
``lp(y) = ((5 + |y|) / 6)^α`` (Wu et al. 2016, https://arxiv.org/abs/1609.08144); ``α = 0`` is the
plain log-probability, larger ``α`` favours longer outputs.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .errors import ConfigError

__all__ = ["greedy_search", "beam_search", "strip_special", "length_penalty"]


def _check(model: nn.Module, max_len: int | None) -> int:
    for name in ("init_decode", "decode_step"):
        if not hasattr(model, name):
            raise ValueError(f"{type(model).__name__} is not a conditional decoder (no {name})")
    limit = model.config.max_target_len - 1  # <bos> takes one position
    if max_len is None:
        return limit
    if max_len < 1:
        raise ConfigError(f"max_len must be >= 1, got {max_len}")
    if max_len > limit:
        raise ConfigError(f"max_len={max_len} exceeds the model's maximum of {limit} new tokens")
    return max_len


def length_penalty(lengths: Tensor, alpha: float) -> Tensor:
    """GNMT length penalty ``((5 + |y|) / 6)^α``."""
    return ((5.0 + lengths.float()) / 6.0) ** alpha


@torch.inference_mode()
def greedy_search(model: nn.Module, inputs, *, max_len: int | None = None, use_cache: bool = True) -> Tensor:
    """Pick the most likely next token at every step; returns ids ``(B, n)`` (no ``<bos>``).

    Args:
        model: a conditional decoder (see the module docstring).
        inputs: the condition: source ids ``(B, S)`` or images ``(B, C, H, W)``.
        max_len: most tokens to generate (default: the model's maximum).
        use_cache: decode with the KV cache (False recomputes the prefix every step).
    """
    max_len = _check(model, max_len)
    config = model.config
    was_training = model.training
    model.eval()
    try:
        state = model.init_decode(inputs, use_cache=use_cache)
        B = state.batch_size
        device = next(model.parameters()).device
        seq = torch.full((B, 1), config.bos_id, dtype=torch.long, device=device)
        done = torch.zeros(B, dtype=torch.bool, device=device)
        for _ in range(max_len):
            feed = seq[:, -1:] if use_cache else seq
            nxt = model.decode_step(feed, state)[:, -1].argmax(-1)  # (B,)
            nxt = torch.where(done, torch.full_like(nxt, config.pad_id), nxt)
            done = done | nxt.eq(config.eos_id)
            seq = torch.cat([seq, nxt[:, None]], dim=1)
            if bool(done.all()):
                break
        return seq[:, 1:]
    finally:
        model.train(was_training)


@torch.inference_mode()
def beam_search(model: nn.Module, inputs, *, beam_size: int = 4, alpha: float = 0.6, max_len: int | None = None,
                use_cache: bool = True, return_scores: bool = False):
    """Beam search with a length penalty; returns the best hypothesis per input, ids ``(B, n)``.

    ``beam_size=1`` is greedy search.

    Args:
        model: a conditional decoder (see the module docstring).
        inputs: the condition: source ids ``(B, S)`` or images ``(B, C, H, W)``.
        beam_size: hypotheses kept per input.
        alpha: length-penalty exponent α (0 = rank by total log-probability).
        max_len: most tokens to generate (default: the model's maximum).
        use_cache: decode with the KV cache.
        return_scores: also return the normalized scores ``(B,)`` of the chosen hypotheses.
    """
    max_len = _check(model, max_len)
    config = model.config
    if beam_size < 1:
        raise ConfigError(f"beam_size must be >= 1, got {beam_size}")
    if alpha < 0:
        raise ConfigError(f"alpha (length penalty) must be >= 0, got {alpha}")
    was_training = model.training
    model.eval()
    try:
        state = model.init_decode(inputs, use_cache=use_cache)
        B = state.batch_size
        K = beam_size
        device = next(model.parameters()).device
        state.reorder(torch.arange(B, device=device).repeat_interleave(K))  # every input → K beams
        seq = torch.full((B * K, 1), config.bos_id, dtype=torch.long, device=device)
        scores = torch.full((B, K), float("-inf"), device=device)
        scores[:, 0] = 0.0  # all beams start identical: expand only the first
        finished = torch.zeros(B * K, dtype=torch.bool, device=device)
        lengths = torch.zeros(B * K, dtype=torch.long, device=device)
        for _ in range(max_len):
            feed = seq[:, -1:] if use_cache else seq
            logp = torch.log_softmax(model.decode_step(feed, state)[:, -1].float(), dim=-1)  # (B·K, V)
            V = logp.shape[-1]
            # A finished hypothesis continues only with <pad>, at no cost: its score is frozen.
            frozen = torch.full_like(logp, float("-inf"))
            frozen[:, config.pad_id] = 0.0
            logp = torch.where(finished[:, None], frozen, logp)
            cand = (scores.reshape(B * K, 1) + logp).reshape(B, K * V)
            scores, flat = cand.topk(K, dim=-1)  # (B, K)
            beam, tok = flat // V, flat % V
            rows = (torch.arange(B, device=device)[:, None] * K + beam).reshape(-1)  # (B·K,) source rows
            tok = tok.reshape(-1)
            seq = torch.cat([seq[rows], tok[:, None]], dim=1)
            lengths = lengths[rows] + (~finished[rows]).long()
            finished = finished[rows] | tok.eq(config.eos_id)
            state.reorder(rows)
            if bool(finished.all()):
                break
        norm = scores / length_penalty(lengths.reshape(B, K), alpha)  # (B, K)
        best = norm.argmax(dim=-1)  # (B,)
        out = seq.reshape(B, K, -1)[torch.arange(B, device=device), best, 1:]
        return (out, norm.gather(1, best[:, None])[:, 0]) if return_scores else out
    finally:
        model.train(was_training)


def strip_special(ids: Tensor, eos_id: int = 2, pad_id: int = 0) -> list[list[int]]:
    """Rows of generated ids → lists cut before the first ``<eos>`` (and without padding)."""
    out = []
    for row in ids.tolist():
        if eos_id in row:
            row = row[: row.index(eos_id)]
        out.append([t for t in row if t != pad_id])
    return out
