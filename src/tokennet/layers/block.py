"""The transformer block: attention mixes tokens, the MLP transforms each token; both are residual.

Pre-norm (ViT, GPT-2; Xiong et al. 2020, https://arxiv.org/abs/2002.04745)::

    x = x + Attn(LN(x));  x = x + MLP(LN(x))

Post-norm (the original Transformer, Vaswani et al. 2017)::

    x = LN(x + Attn(x));  x = LN(x + MLP(x))

Sandwich norm (Gemma 2/3: a norm before each sublayer and one on its output, before the residual add)::

    x = x + LN'(Attn(LN(x)));  x = x + LN'(MLP(LN(x)))

with the output norms named ``post_attn_norm``, ``post_mlp_norm`` (``post_cross_norm``).

No norm (``norm="none"``, for ablations: the lecture's "LayerNorm has desirable optimization properties")::

    x = x + Attn(x);  x = x + MLP(x)

the norms are identities (``norm1``, ``norm2``, ``norm_cross`` are ``nn.Identity``; a stack's final norm too).

All use the same parameter names (``norm1, attn, norm2, mlp``; ``norm_cross, cross_attn`` for a
decoder block's cross-attention), so a checkpoint says nothing about which was used: the config does.

Variants are composed parts, not flags: the normalization is a :class:`~tokennet.layers.norm.Norm` (LayerNorm or
RMSNorm, with its ε), the MLP a kind (a callable ``dim → module``: :class:`~tokennet.layers.mlp.MLP`, or
:class:`~tokennet.layers.mlp.GatedMLP` for Llama's SwiGLU). The older keywords (``norm_layer="rmsnorm"``,
``norm_eps``, ``gated_mlp``, ``activation``, ``mlp_ratio``) still build the same parts.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from torch import Tensor, nn

from ..attention.multihead import KVCache, MultiHeadAttention
from .mixer import TokenMixing
from .mlp import MLP, GatedMLP
from .norm import NORM_LAYERS, Norm, make_norm

__all__ = ["Block", "NORMS", "MIXERS", "NORM_LAYERS", "make_norm", "Norm", "mlp_kind"]

NORMS = ("pre", "post", "sandwich", "none")
MIXERS = ("attention", "token")


def _identity(dim: int) -> nn.Module:
    """The norm kind of ``norm="none"``: ``x ↦ x`` at any width."""
    return nn.Identity()


def mlp_kind(*, mlp_ratio: float = 4.0, activation: str = "gelu", gated: bool = False, dropout: float = 0.0,
             bias: bool = True) -> Callable[[int], nn.Module]:
    """The MLP kind ``dim → module`` the older keywords describe: :class:`MLP`, or :class:`GatedMLP` when ``gated``."""
    return partial(GatedMLP if gated else MLP, mlp_ratio=mlp_ratio, activation=activation, dropout=dropout,
                   bias=bias)


class Block(nn.Module):
    """One transformer block: (masked) self-attention, optional cross-attention, MLP.

    Args:
        dim: model width D.
        num_heads: attention heads H.
        mlp_ratio: MLP inner width as a multiple of D.
        norm: ``"pre"``, ``"post"`` or ``"sandwich"`` (pre- and post-norm around each sublayer, Gemma) placement,
            or ``"none"``: no normalization at all (residual sublayers ``x + f(x)``; an ablation).
        dropout: dropout on the attention weights, the MLP's hidden units and each sublayer's output before it
            joins the residual stream (once: the sublayers' own, as in the Transformer's "residual dropout").
        activation: MLP nonlinearity (``"gelu"`` or ``"relu"``).
        num_kv_heads: key/value heads for grouped-query attention.
        cross_attention: add a cross-attention sublayer (decoder block of an encoder–decoder).
        context_dim: width of the cross-attention context (default ``dim``).
        mixer: ``"attention"`` (data-dependent ``A``) or ``"token"`` (the learned ``W`` of the token net).
        num_tokens: maximum sequence length, needed by the token mixer.
        bias: biases in linear layers and norms.
        backend: attention backend.
        norm_eps: the norm's epsilon (with a string ``norm_layer``).
        norm_layer: a :class:`Norm`, or ``"layernorm"`` / ``"rmsnorm"`` (with ``norm_eps`` and ``bias``).
        gated_mlp: a gated MLP (SwiGLU with ``activation="silu"``), when ``mlp`` is not given.
        qk_norm: RMS-normalize the self-attention's per-head queries and keys (True), or a norm kind for them.
        head_dim: per-head width E of the self-attention (default ``dim // num_heads``; Gemma 3 270M: 256 at D = 640).
        value_proj: learn the self-attention's ``W_v`` (default); ``False``: ``W_v = I`` (values are the tokens).
        mlp: the MLP kind, ``dim → module`` (default: :func:`mlp_kind` of ``mlp_ratio``, ``activation``,
            ``gated_mlp``, ``dropout``, ``bias``).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        mlp_ratio: float = 4.0,
        norm: str = "pre",
        dropout: float = 0.0,
        activation: str = "gelu",
        num_kv_heads: int | None = None,
        cross_attention: bool = False,
        context_dim: int | None = None,
        mixer: str = "attention",
        num_tokens: int | None = None,
        bias: bool = True,
        backend: str = "auto",
        norm_eps: float = 1e-5,
        norm_layer: str | Norm = "layernorm",
        gated_mlp: bool = False,
        qk_norm: bool | Callable[[int], nn.Module] = False,
        value_proj: bool = True,
        mlp: Callable[[int], nn.Module] | None = None,
        head_dim: int | None = None,
    ):
        super().__init__()
        if norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
        if mixer not in MIXERS:
            raise ValueError(f"mixer must be one of {MIXERS}, got {mixer!r}")
        self.pre = norm in ("pre", "sandwich", "none")  # none: x + f(x), the pre-norm path with identity norms
        self.sandwich = norm == "sandwich"
        norm_layer = norm_layer if isinstance(norm_layer, Norm) else Norm(norm_layer, eps=norm_eps, bias=bias)
        if norm == "none":
            norm_layer = _identity
        if mlp is None:
            mlp = mlp_kind(mlp_ratio=mlp_ratio, activation=activation, gated=gated_mlp, dropout=dropout, bias=bias)
        self.norm1 = norm_layer(dim)
        if mixer == "attention":
            self.attn = MultiHeadAttention(
                dim, num_heads, num_kv_heads=num_kv_heads, bias=bias, dropout=dropout, backend=backend,
                qk_norm=qk_norm, head_dim=head_dim, value_proj=value_proj,
            )
        elif qk_norm or not value_proj:
            raise ValueError("qk_norm and value_proj=False need mixer='attention'")
        else:
            if num_tokens is None:
                raise ValueError("mixer='token' needs num_tokens (the largest sequence length)")
            self.attn = TokenMixing(dim, num_tokens, bias=bias, dropout=dropout)
        self.cross_attn = None
        if cross_attention:
            self.norm_cross = norm_layer(dim)
            self.cross_attn = MultiHeadAttention(
                dim, num_heads, context_dim=context_dim or dim, bias=bias, dropout=dropout, backend=backend
            )
        self.norm2 = norm_layer(dim)
        self.mlp = mlp(dim)
        if self.sandwich:
            self.post_attn_norm = norm_layer(dim)
            if cross_attention:
                self.post_cross_norm = norm_layer(dim)
            self.post_mlp_norm = norm_layer(dim)
        self.drop: nn.Module = nn.Identity()  # what a branch passes through last: see _residual

    def _residual(self, x: Tensor, norm: nn.Module, f, post: str | None = None) -> Tensor:
        """``x + f(N(x))`` (pre), ``N(x + f(x))`` (post) or ``x + N'(f(N(x)))`` (sandwich), the branch passed
        through ``self.drop``. Each sublayer ``f`` drops its own output (the attention's ``out_drop``, the MLP's last
        ``drop``), so ``self.drop`` is the identity: a branch is dropped once. Stochastic depth puts a
        :class:`~tokennet.layers.drop_path.DropPath` there (ViT's ``drop_path``)."""
        if self.sandwich:
            return x + self.drop(getattr(self, post)(f(norm(x))))
        if self.pre:
            return x + self.drop(f(norm(x)))
        return norm(x + self.drop(f(x)))

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        is_causal: bool = False,
        context_mask: Tensor | None = None,
        rope: tuple[Tensor, Tensor] | None = None,
        bias: Tensor | None = None,
        cache: KVCache | None = None,
        cross_cache: KVCache | None = None,
        return_weights: bool = False,
    ):
        """``(B, N, D) → (B, N, D)``; with ``return_weights``, ``(x, {"self": A, "cross": A_c})``.

        Args:
            x: tokens.
            context: cross-attention context ``(B, M, Dc)`` (decoder blocks only).
            mask: self-attention mask, broadcastable to ``(B, H, N, Nk)``.
            is_causal: causal self-attention.
            context_mask: cross-attention mask, broadcastable to ``(B, H, N, M)``.
            rope: rotary ``(cos, sin)`` for the self-attention.
            bias: additive self-attention bias (ALiBi).
            cache: self-attention KV cache.
            cross_cache: static cache of the context's keys and values.
            return_weights: also return this block's attention weights ``(B, H, N, Nk)`` (computed with
                the plain formula), keyed ``"self"`` and, in a decoder block, ``"cross"``.
        """
        weights: dict[str, Tensor] = {}

        def attend(module, key, *args, **kw):
            if not return_weights:
                return module(*args, **kw)
            out, weights[key] = module(*args, return_weights=True, **kw)
            return out

        x = self._residual(x, self.norm1, lambda hidden: attend(self.attn, "self", hidden, mask=mask,
                                                                 is_causal=is_causal, rope=rope, bias=bias,
                                                                 cache=cache),
                           "post_attn_norm")
        if self.cross_attn is not None:
            if context is None:
                raise ValueError("this block has cross-attention: pass context=(B, M, Dc)")
            x = self._residual(x, self.norm_cross, lambda hidden: attend(self.cross_attn, "cross", hidden, context,
                                                                     mask=context_mask, cache=cross_cache),
                               "post_cross_norm")
        elif context is not None:
            raise ValueError("context given to a block without cross-attention (build it with cross_attention=True)")
        x = self._residual(x, self.norm2, self.mlp, "post_mlp_norm")
        return (x, weights) if return_weights else x
