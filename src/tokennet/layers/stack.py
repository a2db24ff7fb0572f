"""Stacks of blocks: the encoder (bidirectional) and the decoder (causal, optional cross-attention).

Following x-transformers' composition, a model embeds its tokens, computes positions once (rotary
angles, ALiBi bias) and passes them down to every block of a stack.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..attention.multihead import KVCache
from .block import Block
from .norm import Norm

__all__ = ["Encoder", "Decoder", "AttentionMaps", "set_checkpointing"]

AttentionMaps = dict[str, list[Tensor]]
"""Attention weights returned by a model's ``attention_maps``: a kind (``"self"``, ``"encoder"``,
``"decoder"``, ``"cross"``) → one ``(B, H, Nq, Nk)`` tensor per layer, first layer first."""


class _Stack(nn.Module):
    def __init__(self, dim: int, num_layers: int, num_heads: int, *, share_weights: bool = False, **block_kw):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        self.num_layers = num_layers
        self.share_weights = share_weights
        # Weight sharing across depth (ALBERT, Universal Transformer): one block applied L times.
        n_distinct = 1 if share_weights else num_layers
        self.blocks = nn.ModuleList(Block(dim, num_heads, **block_kw) for _ in range(n_distinct))
        pre = block_kw.get("norm", "pre") in ("pre", "sandwich")
        # Pre-norm leaves the residual stream unnormalized: one final norm (the blocks' kind) closes the stack.
        # (No final norm after post-norm blocks, whose last norm closes the stack, nor with norm="none".)
        kind = block_kw.get("norm_layer", "layernorm")
        if not isinstance(kind, Norm):
            kind = Norm(kind, eps=block_kw.get("norm_eps", 1e-5), bias=block_kw.get("bias", True))
        self.norm = kind(dim) if pre else nn.Identity()
        self.checkpointing = False  # activation checkpointing of the blocks while training (set_checkpointing)

    def layers(self):
        """The block applied at each depth (the same module repeated when weights are shared)."""
        return [self.blocks[0 if self.share_weights else i] for i in range(self.num_layers)]

    def _run(self, blk: nn.Module, *args, **kw):
        """``blk(*args, **kw)``; with :attr:`checkpointing`, while training with gradients and no cache, the block
        keeps only its input for backward and runs its forward again there (``torch.utils.checkpoint``,
        non-reentrant: the random state is replayed, so dropout draws the same mask)."""
        if (self.checkpointing and self.training and torch.is_grad_enabled() and kw.get("cache") is None
                and not kw.get("return_weights")):
            return checkpoint(blk, *args, use_reentrant=False, **kw)
        return blk(*args, **kw)


class Encoder(_Stack):
    """A stack of bidirectional blocks: every token may attend to every (unmasked) token.

    Args:
        dim, num_layers, num_heads: width D, depth L and heads H.
        share_weights: reuse one block at every depth.
        **block_kw: passed to :class:`Block` (``mlp_ratio, norm, dropout, activation, mixer, …``).
    """

    def forward(self, x: Tensor, *, mask: Tensor | None = None, rope=None, bias: Tensor | None = None,
                return_weights: bool = False):
        """``(B, N, D) → (B, N, D)``; ``mask`` broadcastable to ``(B, H, N, N)``, or a list of one such mask per
        layer (e.g. a window in the first layer only); ``bias`` (additive scores) likewise, one or one per layer.

        With ``return_weights``, ``(x, maps)``: per layer, the block's weights (see :meth:`Block.forward`).
        """
        layers = self.layers()
        masks = list(mask) if isinstance(mask, (list, tuple)) else [mask] * len(layers)
        if len(masks) != len(layers):
            raise ValueError(f"a mask per layer: {len(layers)} layers, {len(masks)} masks")
        biases = list(bias) if isinstance(bias, (list, tuple)) else [bias] * len(layers)
        if len(biases) != len(layers):
            raise ValueError(f"a bias per layer: {len(layers)} layers, {len(biases)} biases")
        maps = []
        for blk, mask, layer_bias in zip(layers, masks, biases, strict=True):
            x = self._run(blk, x, mask=mask, rope=rope, bias=layer_bias, return_weights=return_weights)
            if return_weights:
                x, weights = x
                maps.append(weights)
        x = self.norm(x)
        return (x, maps) if return_weights else x


class Decoder(_Stack):
    """A stack of causal blocks; with ``cross_attention=True`` each block also attends to a context.

    Args:
        dim, num_layers, num_heads: width D, depth L and heads H.
        cross_attention: decoder blocks of an encoder–decoder (masked self-attention + cross-attention).
        share_weights: reuse one block at every depth.
        **block_kw: passed to :class:`Block`.
    """

    def __init__(self, dim: int, num_layers: int, num_heads: int, *, cross_attention: bool = False, **kw):
        super().__init__(dim, num_layers, num_heads, cross_attention=cross_attention, **kw)
        self.cross_attention = cross_attention

    def make_caches(self, max_len: int) -> list[KVCache]:
        """One self-attention cache per depth (also when weights are shared)."""
        return [KVCache(max_len) for _ in range(self.num_layers)]

    def make_cross_caches(self) -> list[KVCache]:
        """One static cross-attention cache per depth."""
        return [KVCache(static=True) for _ in range(self.num_layers)]

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        is_causal: bool = True,
        context_mask: Tensor | None = None,
        rope=None,
        bias: Tensor | None = None,
        caches: list[KVCache] | None = None,
        cross_caches: list[KVCache] | None = None,
        return_weights: bool = False,
    ):
        """``(B, N, D) → (B, N, D)``; with ``caches`` the N tokens follow the cached ones.

        ``mask`` and ``rope`` may be lists, one entry per layer (layers of their own window or RoPE base: Gemma 3's
        sliding-window and global layers).

        With ``return_weights``, ``(x, maps)``: per layer, the block's weights (see :meth:`Block.forward`).
        """
        maps = []
        for i, blk in enumerate(self.layers()):
            x = self._run(
                blk,
                x,
                context,
                mask=mask[i] if isinstance(mask, list) else mask,
                is_causal=is_causal,
                context_mask=context_mask,
                rope=rope[i] if isinstance(rope, list) else rope,
                bias=bias,
                cache=None if caches is None else caches[i],
                cross_cache=None if cross_caches is None else cross_caches[i],
                return_weights=return_weights,
            )
            if return_weights:
                x, weights = x
                maps.append(weights)
        x = self.norm(x)
        return (x, maps) if return_weights else x


def set_checkpointing(model: nn.Module, on: bool = True) -> int:
    """Turn activation checkpointing of every encoder and decoder stack in ``model`` on or off; returns how many
    stacks there are (0: the model has none, and nothing changed).

    With it on, training keeps one tensor per block (its input) instead of every intermediate of every block, and
    backward recomputes each block's forward: less memory for about one more forward pass per step. Outputs and
    gradients are those without it (up to float rounding).
    """
    stacks = [m for m in model.modules() if isinstance(m, _Stack)]
    for m in stacks:
        m.checkpointing = bool(on)
    return len(stacks)
