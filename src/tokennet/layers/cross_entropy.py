"""Cross-entropy over a large vocabulary, row block by row block: the loss of a language model's logits.

``L = (1/|K|) Σ_{i∈K} (lse_i − z_{i,y_i})`` with ``lse_i = log Σ_v exp z_iv`` over the kept rows ``K`` (targets not
``ignore_index``), and its gradient ``∂L/∂z_iv = (softmax(z_i)_v − [v = y_i]) / |K|`` (0 on ignored rows).

``F.cross_entropy`` computes the same in four passes over the ``(M, V)`` logits, each a full-size tensor in
memory: ``log_softmax`` writes ``log p`` (float32), backward fills a zero ``(M, V)`` gradient, scatters ``−1/|K|``
into it and ``log_softmax``'s backward reads both to write ``∂z``; under bf16 autocast the logits are first copied
to float32 and the gradient copied back. With SmolLM2's 49,152-token vocabulary and 512 rows each is a 100 MB
tensor. Here forward keeps only ``lse`` ``(M,)`` (one pass over the logits, a block of rows at a time in float32
whatever their dtype), and backward writes ``∂z`` in the logits' dtype in one pass, recomputing ``softmax`` from
``z`` and ``lse``. The logits themselves are the only ``(M, V)`` tensor kept.

Under ``torch.compile`` it is ``F.cross_entropy`` (Inductor fuses that itself).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["cross_entropy"]

_BLOCK_BYTES = 1 << 19  # rows per block: about 512 KiB of float32 logits, so a block's passes stay in cache


def _rows(V: int) -> int:
    return max(1, _BLOCK_BYTES // (4 * V))


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, ignore_index: int) -> Tensor:
        M, V = logits.shape
        keep = targets != ignore_index  # (M,)
        y = torch.where(keep, targets, 0)  # (M,): an ignored row reads column 0, then counts for nothing
        lse = torch.empty(M, dtype=torch.float32, device=logits.device)
        step = _rows(V)
        for i in range(0, M, step):
            lse[i:i + step] = torch.logsumexp(logits[i:i + step].float(), dim=-1)
        picked = logits.gather(1, y[:, None])[:, 0].float()  # z_{i, y_i}
        n = keep.sum()
        loss = ((lse - picked) * keep).sum() / n  # 0 / 0 = nan when every row is ignored, as F.cross_entropy
        ctx.save_for_backward(logits, y, keep, lse, n)
        return loss

    @staticmethod
    def backward(ctx, g: Tensor):
        logits, y, keep, lse, n = ctx.saved_tensors
        M, V = logits.shape
        grad = torch.empty_like(logits)
        row_weight = keep * (g / n)  # (M,): each row's weight, 0 for an ignored one
        step = _rows(V)
        for i in range(0, M, step):
            j = min(M, i + step)
            probs = logits[i:j].float().sub(lse[i:j, None]).exp_()  # softmax(z_i), a fresh float32 block
            probs[torch.arange(j - i, device=probs.device), y[i:j]] -= 1.0
            grad[i:j] = probs.mul_(row_weight[i:j, None])
        return grad, None, None


def cross_entropy(logits: Tensor, targets: Tensor, *, ignore_index: int = -100) -> Tensor:
    """Mean cross-entropy of ``logits`` ``(M, V)`` against ``targets`` ``(M,)``, rows whose target is
    ``ignore_index`` left out: ``F.cross_entropy(logits.float(), targets, ignore_index=ignore_index)`` in value and
    gradient (to float32 rounding), with the gradient in the logits' dtype and no full-size float32 temporaries
    (see the module docstring). Returns a float32 scalar."""
    if logits.dim() != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(f"logits (M, V) and targets (M,) expected, got {tuple(logits.shape)} and "
                         f"{tuple(targets.shape)}")
    if torch.compiler.is_compiling():
        return F.cross_entropy(logits.float(), targets, ignore_index=ignore_index)
    return _CrossEntropy.apply(logits, targets, ignore_index)
