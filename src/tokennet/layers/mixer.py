"""The lecture's "token net" mixer: a learned, input-independent token-mixing matrix ``W``.

Attention mixes tokens with a data-dependent matrix, ``Y = A(X) V`` with ``A = softmax(Q Kᵀ/√E)``.
Replace ``A(X)`` by a learned constant ``W`` (an ``N × N`` parameter) and you get ``Y = W X W_v``:
every input is mixed the same way (as in MLP-Mixer, Tolstikhin et al. 2021,
https://arxiv.org/abs/2105.01601). It is a drop-in for attention in :class:`~tokennet.layers.Block`,
so the two can be compared on the same task.

Two forms of ``W``: row-softmaxed (``free=False``, the default: each row a distribution, like attention's rows)
and free (``free=True``: ``W`` is any real ``N × N`` matrix, the lecture's *"linear combination of tokens"*,
``T_out = W T_in``, with no normalization at all).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..dropout import Dropout

__all__ = ["TokenMixing"]


class TokenMixing(nn.Module):
    """Token mixing with a learned matrix: ``Y = W X W_v W_o`` (``W`` is ``(N, N)``, shared by all inputs).

    Sequences shorter than ``num_tokens`` use the top-left block of ``W``. With a boolean mask
    (``True`` = may mix), masked entries of ``W`` are zeroed; with ``is_causal`` token t mixes only
    tokens 0..t. Rows are normalized by a softmax over the allowed entries, like attention rows, so
    the comparison with attention changes only where the weights come from. With ``free=True`` they are
    not: ``W`` is used as it is (masked entries zeroed), initialised to uniform rows ``1/N``.

    Args:
        dim: model width D.
        num_tokens: the largest N.
        bias: use biases in the value and output projections.
        dropout: dropout on the output.
        free: use ``W`` itself, not its row softmax (a free linear token mixer).
    """

    def __init__(self, dim: int, num_tokens: int, *, bias: bool = True, dropout: float = 0.0, free: bool = False):
        super().__init__()
        if num_tokens < 1:
            raise ValueError(f"num_tokens must be positive for the token mixer, got {num_tokens}")
        self.num_tokens, self.free = num_tokens, free
        # Uniform mixing at init either way: zero logits under a softmax, or 1/N itself when W is free.
        self.W = nn.Parameter(torch.full((num_tokens, num_tokens), 1.0 / num_tokens if free else 0.0))
        self.v_proj = nn.Linear(dim, dim, bias=bias)
        self.out_proj = nn.Linear(dim, dim, bias=bias)
        self.out_drop = (Dropout(dropout) if dropout > 0 else nn.Identity())

    def extra_repr(self) -> str:
        return f"num_tokens={self.num_tokens}, free={self.free}"

    def forward(self, x: Tensor, context=None, *, mask: Tensor | None = None, is_causal: bool = False,
                cache=None, rope=None, bias=None, return_weights: bool = False):
        """``(B, N, D) → (B, N, D)``; with a ``cache`` the N tokens follow the cached ones.

        With ``return_weights``, also the mixing weights ``(B, 1, N, n_k)`` (one "head"), like attention's ``A``.

        ``context`` (cross-mixing), ``rope`` and ``bias`` are refused: a fixed W has no cross form and
        already encodes positions.
        """
        from ..attention.functional import masked_softmax
        from ..attention.masks import causal

        if context is not None:
            raise ValueError("the token mixer has no cross-attention form; use mixer='attention'")
        if rope is not None or bias is not None:
            raise ValueError("the token mixer takes no rope or ALiBi: W itself is position-specific")
        B, N, _ = x.shape
        v = self.v_proj(x)  # (B, N, D)
        offset = 0
        if cache is not None:  # the cached "values" are the projected earlier tokens
            offset = cache.length
            v = cache.append(v[:, None], v[:, None])[0][:, 0]  # (B, offset + N, D)
        n_k = offset + N
        if n_k > self.num_tokens:
            raise ValueError(f"sequence of {n_k} tokens is longer than the token mixer's num_tokens={self.num_tokens}")
        logits = self.W[offset:n_k, :n_k]  # rows of the new tokens' positions
        if is_causal:
            causal_mask = causal(N, n_k, device=x.device)
            mask = causal_mask if mask is None else mask & causal_mask
        if self.free:  # W as it is: masked entries contribute nothing
            weights = logits.expand(B, N, n_k)  # (B, N, n_k)
            if mask is not None:
                weights = weights * torch.broadcast_to(mask, (B, 1, N, n_k))[:, 0].to(weights.dtype)
        else:
            weights = masked_softmax(logits.expand(B, 1, N, n_k), mask)[:, 0]  # (B, N, n_k)
        out = self.out_drop(self.out_proj(weights @ v))
        return (out, weights[:, None]) if return_weights else out
