"""A text encoder: bidirectional self-attention over token ids, one vector per sentence (BERT family).

BERT (Devlin et al. 2019, https://arxiv.org/abs/1810.04805) embeds tokens as the sum of a token, a
learned position and a token-type (segment) embedding, normalizes that sum (LayerNorm), and runs
post-norm blocks (``x = LN(x + Attn(x)); x = LN(x + MLP(x))``, erf GELU). A sentence embedding, as
Sentence-BERT defines it (Reimers & Gurevych 2019, https://arxiv.org/abs/1908.10084), is the mean of the
final token states over the real (unpadded) tokens, L2-normalized:

    e = normalize( Σ_i m_i h_i / Σ_i m_i ),   m_i = 1 for a real token, 0 for padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention.masks import padding
from ..errors import ConfigError
from ..layers.stack import AttentionMaps, Encoder
from ..position.concat import with_position_mode
from ..position.learned import LearnedPosition
from .registry import Output, TransformerConfig, register_family

__all__ = ["TextEncoderConfig", "TextEncoder"]


@dataclass
class TextEncoderConfig(TransformerConfig, defaults=dict(dim=384, num_layers=6, num_heads=12)):
    """Config of :class:`TextEncoder`.

    Args:
        vocab_size: number of token ids.
        max_len: the longest input, in tokens (learned positions).
        type_vocab_size: token types (segments A/B); 0 = none.
        dim, num_layers, num_heads: width D, depth L, heads H.
        mlp_ratio: MLP width as a multiple of D.
        dropout: dropout in the blocks while training (BERT: 0.1; 0 here, as for inference and fine-tuning on
            little data).
        norm_eps: LayerNorm epsilon (BERT: 1e-12).
        activation: MLP nonlinearity (BERT: erf ``"gelu"``).
        pad_id: the padding token id (masked out of attention and pooling).
        position_mode: ``"add"`` (BERT: token + position + type) or ``"concat"``: tokens embedded at width
            ``D − pos_dim``, each concatenated with its learned position vector ``[x_i ; P_i]`` (then the type
            embedding is added to all D); see :mod:`tokennet.position.concat`.
        pos_dim: the position's width ``D_p`` with ``position_mode="concat"`` (``1 <= pos_dim < dim``); None with
            ``"add"``.
        backend: attention backend.
    """

    vocab_size: int = 30522
    max_len: int = 512
    type_vocab_size: int = 2
    norm_eps: float = 1e-12
    activation: str = "gelu"
    pad_id: int = 0
    position_mode: str = "add"
    pos_dim: int | None = None

    def __post_init__(self):
        self.family = "text-encoder"
        self._positive(vocab_size=self.vocab_size, max_len=self.max_len, dim=self.dim, num_layers=self.num_layers,
                       num_heads=self.num_heads)
        self._mlp_and_backend()
        if self.dim % self.num_heads:
            raise ConfigError(f"num_heads={self.num_heads} must divide dim={self.dim}")
        if not 0 <= self.pad_id < self.vocab_size:
            raise ConfigError(f"pad_id={self.pad_id} is outside the vocabulary [0, {self.vocab_size})")
        self._position_mode()


class TextEncoder(nn.Module):
    """BERT-style encoder: ``forward(ids (B, N)) → Output(logits=token states (B, N, D))``; :meth:`embed` pools."""

    def __init__(self, config: TextEncoderConfig):
        super().__init__()
        self.config = cfg = config
        d_pos = cfg.pos_dim if cfg.position_mode == "concat" else cfg.dim
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.dim - cfg.pos_dim if cfg.position_mode == "concat" else cfg.dim)
        self.pos_emb = with_position_mode(LearnedPosition(cfg.max_len, d_pos), cfg.position_mode, d_pos)
        self.type_emb = nn.Embedding(cfg.type_vocab_size, cfg.dim) if cfg.type_vocab_size else None
        self.emb_norm = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.encoder = Encoder(cfg.dim, cfg.num_layers, cfg.num_heads, mlp_ratio=cfg.mlp_ratio, norm="post",
                               dropout=cfg.dropout, activation=cfg.activation, norm_eps=cfg.norm_eps,
                               backend=cfg.backend, value_proj=cfg.value_proj)

    def example_input(self, batch_size: int = 2) -> Tensor:
        gen = torch.Generator().manual_seed(0)
        return torch.randint(self.config.vocab_size, (batch_size, min(16, self.config.max_len)), generator=gen)

    def forward_features(self, ids: Tensor, mask: Tensor | None = None, *, return_attention: bool = False):
        """Token ids ``(B, N)`` → token states ``(B, N, D)``; ``mask`` ``(B, N)`` True at real tokens
        (default: ids ≠ pad_id). Token type 0 for every token (one segment)."""
        if ids.dim() != 2:
            raise ValueError(f"ids must be (B, N) token ids, got shape {tuple(ids.shape)}")
        if mask is None:
            mask = ids.ne(self.config.pad_id)
        x = self.pos_emb(self.tok_emb(ids))  # (B, N, D): x + P, or [x ; P] from width D − D_p
        if self.type_emb is not None:
            x = x + self.type_emb.weight[0]
        x = self.emb_norm(x)
        return self.encoder(x, mask=padding(~mask), return_weights=return_attention)

    def forward(self, ids: Tensor, targets: Tensor | None = None) -> Output:
        if targets is not None:
            raise ValueError("a text encoder has no training loss in tokennet (it is imported, not trained)")
        return Output(self.forward_features(ids))

    def embed(self, ids: Tensor, mask: Tensor | None = None) -> Tensor:
        """Sentence embeddings ``(B, D)``: the mean of the token states over real tokens, L2-normalized."""
        if mask is None:
            mask = ids.ne(self.config.pad_id)
        feats = self.forward_features(ids, mask)  # (B, N, D)
        m = mask[:, :, None].to(feats.dtype)  # (B, N, 1)
        pooled = (feats * m).sum(1) / m.sum(1).clamp(min=1e-9)  # (B, D)
        return F.normalize(pooled, p=2, dim=-1)

    def attention_maps(self, ids: Tensor) -> AttentionMaps:
        """Every layer's attention ``A = softmax(Q Kᵀ / √E)`` over ``ids`` ``(B, N)``: ``{"self": [(B, H, N, N)] * L}``.

        Padding (``pad_id``) is masked out of the keys."""
        _, maps = self.forward_features(ids, return_attention=True)
        return {"self": [m["self"] for m in maps]}


# A family without presets: text encoders are imported (tokennet import), not trained, so the registry's
# train-every-preset tests (forward + loss + backward) do not apply; tests/interop/test_bert.py covers it.
register_family("text-encoder", TextEncoderConfig, TextEncoder)
