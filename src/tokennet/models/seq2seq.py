"""The encoder–decoder Transformer of "Attention Is All You Need" (Vaswani et al. 2017).

https://arxiv.org/abs/1706.03762. Reads like the paper's Figure 1:

- source ids → embedding · √D + sinusoidal positions → encoder: L blocks of self-attention over the
  source, with the source padding mask (keys at padding are never attended to), and an MLP;
- target ids (shifted right: ``<bos> y₁ … y_{T−1}``) → the same embedding · √D + positions → decoder:
  blocks of masked (causal) self-attention, cross-attention whose queries are the target tokens and
  whose keys and values are the encoder's outputs ``M``: ``A = softmax(Q_y K_Mᵀ / √E)``, and an MLP;
- linear head tied to the embedding → ``p(y_t | y_{<t}, x)``.

Post-norm (the paper's ``x = LN(x + Sublayer(x))``) is the default; ``norm="pre"`` switches both
stacks to pre-norm with a final LayerNorm each.

Decoding protocol (used by :mod:`tokennet.decode` for greedy and beam search, shared with the other
conditional models): ``state = model.init_decode(inputs, use_cache=...)`` runs the encoder once;
``model.decode_step(tokens, state)`` returns next-token logits. With the cache, ``tokens`` are only the
new tokens: each decoder layer's self-attention keys/values grow in a :class:`KVCache`, and the
cross-attention keys/values of the encoder output are computed at the first step and reused
(static caches). Without it, ``tokens`` is the whole prefix and everything is recomputed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..attention.masks import padding
from ..dropout import Dropout
from ..errors import ConfigError
from ..layers.block import NORMS
from ..layers.mlp import ACTIVATIONS
from ..layers.stack import AttentionMaps, Decoder, Encoder
from ..position.sinusoidal import SinusoidalPosition
from .registry import Output, TransformerConfig, register_family, register_preset
from .seqio import EncoderDecoderState, check_token_ids, seq_loss, source_target

__all__ = ["Seq2SeqConfig", "Seq2Seq"]


@dataclass
class Seq2SeqConfig(TransformerConfig, defaults=dict(dropout=0.1)):
    """Config of :class:`Seq2Seq`.

    Args:
        vocab_size: number of token ids, shared by source and target (one tokenizer, one embedding).
        max_source_len: longest source in tokens.
        max_target_len: longest target in tokens, ``<bos>`` included.
        dim, num_heads: width D and heads H.
        num_layers: encoder blocks.
        num_decoder_layers: decoder blocks (None = num_layers).
        mlp_ratio: MLP width as a multiple of D (the paper: 4).
        dropout: dropout on embeddings, attention weights and residual branches (the paper: 0.1).
        norm: ``"post"`` (the paper), ``"pre"``, ``"sandwich"`` or ``"none"`` (no norms, an ablation).
        activation: MLP nonlinearity (the paper: ``"relu"``).
        tie_weights: share the embedding with the output layer (the paper does).
        label_smoothing: ε of the smoothed cross-entropy (the paper: 0.1).
        bias: biases in linear layers and norms.
        backend: attention backend.
        pad_id, bos_id, eos_id: special token ids (tokennet's tokenizers use 0, 1, 2).
    """

    vocab_size: int = 64
    max_source_len: int = 64
    max_target_len: int = 32
    num_decoder_layers: int | None = None
    norm: str = "post"
    activation: str = "relu"
    tie_weights: bool = True
    label_smoothing: float = 0.0
    bias: bool = True
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self):
        self.family = "seq2seq"
        self._positive(vocab_size=self.vocab_size, max_source_len=self.max_source_len,
                       max_target_len=self.max_target_len, dim=self.dim, num_layers=self.num_layers,
                       num_heads=self.num_heads)
        if self.num_decoder_layers is not None:
            self._positive(num_decoder_layers=self.num_decoder_layers)
        self._choice("norm", self.norm, NORMS)
        self._choice("activation", self.activation, ACTIVATIONS)
        self._mlp_and_backend()
        if self.dim % self.num_heads:
            raise ConfigError(f"num_heads={self.num_heads} must divide dim={self.dim}")
        if self.dim % 2:
            raise ConfigError(f"dim={self.dim} must be even for sinusoidal positions")
        self._fraction(dropout=self.dropout, label_smoothing=self.label_smoothing)
        for k in ("pad_id", "bos_id", "eos_id"):
            if not 0 <= getattr(self, k) < self.vocab_size:
                raise ConfigError(f"{k}={getattr(self, k)} must be a token id in [0, vocab_size={self.vocab_size})")


class Seq2Seq(nn.Module):
    """Encoder–decoder Transformer: ``forward((src, tgt_in), tgt_out=None) → Output(logits, loss)``.

    ``src`` ``(B, S)`` is right-padded with ``pad_id``; ``tgt_in`` ``(B, T)`` is the target shifted
    right (``<bos>`` first); ``tgt_out`` ``(B, T)`` are the next tokens, -100 where ignored.
    """

    def __init__(self, config: Seq2SeqConfig):
        super().__init__()
        self.config = cfg = config
        block_kw = dict(mlp_ratio=cfg.mlp_ratio, norm=cfg.norm, dropout=cfg.dropout, activation=cfg.activation,
                        bias=cfg.bias, backend=cfg.backend, value_proj=cfg.value_proj)
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.pos = SinusoidalPosition(cfg.dim, max_len=max(cfg.max_source_len, cfg.max_target_len))
        self.drop = Dropout(cfg.dropout)
        self.encoder = Encoder(cfg.dim, cfg.num_layers, cfg.num_heads, **block_kw)
        self.decoder = Decoder(cfg.dim, cfg.num_decoder_layers or cfg.num_layers, cfg.num_heads, cross_attention=True,
                               **block_kw)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        # Embeddings are multiplied by √D below, so N(0, 1/D) gives unit-variance tokens, on the scale
        # of the sinusoidal positions; tied, the same matrix is a well-scaled output layer.
        nn.init.normal_(self.tok_emb.weight, 0.0, cfg.dim**-0.5)
        if cfg.tie_weights:
            self.lm_head.weight = self.tok_emb.weight

    # -- pieces --------------------------------------------------------------------------------
    def embed(self, ids: Tensor, offset: int = 0) -> Tensor:
        """Token ids ``(B, N)`` → ``E[ids] · √D + PE[offset : offset + N]`` ``(B, N, D)``."""
        x = self.tok_emb(ids) * math.sqrt(self.config.dim)  # (B, N, D)
        return self.drop(self.pos(x, offset))

    def source_mask(self, src: Tensor) -> Tensor:
        """``(B, 1, 1, S)``: True at real source tokens, False at padding."""
        cfg = self.config
        check_token_ids(src, cfg.vocab_size, cfg.max_source_len, "source")
        return padding(src.eq(cfg.pad_id))

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """Source ids ``(B, S)`` → ``(memory (B, S, D), mask (B, 1, 1, S))``; padding is masked out."""
        mask = self.source_mask(src)
        return self.encoder(self.embed(src), mask=mask), mask

    def decode(self, tgt: Tensor, memory: Tensor, mask: Tensor | None, *, caches=None, cross_caches=None,
               return_attention: bool = False):
        """Target ids ``(B, T)`` → decoder states ``(B, T, D)``; with caches the ids follow the cached ones.

        With ``return_attention``, ``(h, maps)``: each decoder block's weights (see :meth:`Decoder.forward`).
        """
        cfg = self.config
        offset = caches[0].length if caches else 0
        check_token_ids(tgt, cfg.vocab_size, cfg.max_target_len - offset, "target")
        return self.decoder(self.embed(tgt, offset), memory, is_causal=True, context_mask=mask,
                            caches=caches, cross_caches=cross_caches, return_weights=return_attention)

    # -- the model contract --------------------------------------------------------------------
    def forward_features(self, inputs: tuple[Tensor, Tensor]) -> Tensor:
        """``(src (B, S), tgt_in (B, T))`` → decoder states ``(B, T, D)``."""
        src, tgt = source_target(inputs)
        memory, mask = self.encode(src)
        return self.decode(tgt, memory, mask)

    def forward_head(self, h: Tensor) -> Tensor:
        """Decoder states ``(B, T, D)`` → next-token logits ``(B, T, V)``."""
        return self.lm_head(h)

    def forward(self, inputs: tuple[Tensor, Tensor], targets: Tensor | None = None) -> Output:
        logits = self.forward_head(self.forward_features(inputs))  # (B, T, V)
        return Output(logits, seq_loss(logits, targets, self.config.label_smoothing))

    # -- decoding ------------------------------------------------------------------------------
    def init_decode(self, src: Tensor, *, use_cache: bool = True) -> EncoderDecoderState:
        """Run the encoder once; return the state :meth:`decode_step` continues from."""
        memory, mask = self.encode(src)
        caches = self.decoder.make_caches(self.config.max_target_len) if use_cache else None
        cross = self.decoder.make_cross_caches() if use_cache else None
        return EncoderDecoderState(memory, mask, caches, cross)

    def decode_step(self, tokens: Tensor, state: EncoderDecoderState) -> Tensor:
        """Next-token logits ``(B, n, V)`` for ``tokens`` ``(B, n)`` (new tokens if cached, else the prefix)."""
        feats = self.decode(tokens, state.memory, state.mask, caches=state.caches, cross_caches=state.cross_caches)
        return self.forward_head(feats)

    def attention_maps(self, inputs: tuple[Tensor, Tensor]) -> AttentionMaps:
        """Every layer's attention under teacher forcing, plain formula: ``{"encoder": [(B, H, S, S)],
        "decoder": [(B, H, T, T)], "cross": [(B, H, T, S)]}`` (one tensor per layer; the cross-attention
        rows are the alignments of Bahdanau et al. 2015, Fig. 3)."""
        src, tgt = source_target(inputs)
        mask = self.source_mask(src)
        memory, enc = self.encoder(self.embed(src), mask=mask, return_weights=True)
        _, dec = self.decode(tgt, memory, mask, return_attention=True)
        return {"encoder": [m["self"] for m in enc], "decoder": [m["self"] for m in dec],
                "cross": [m["cross"] for m in dec]}

    # -- examples for tests --------------------------------------------------------------------
    def example_input(self, batch_size: int = 2) -> tuple[Tensor, Tensor]:
        """``(src, tgt_in)`` of random ids; row 0 is full length, the others end in padding."""
        cfg = self.config
        gen = torch.Generator().manual_seed(0)
        low = min(4, cfg.vocab_size)  # real tokens avoid the specials 0..3 where the vocabulary allows
        S, T = min(12, cfg.max_source_len), min(8, cfg.max_target_len)
        src = torch.randint(low, cfg.vocab_size, (batch_size, S), generator=gen) if low < cfg.vocab_size \
            else torch.full((batch_size, S), cfg.vocab_size - 1)
        for row in range(1, batch_size):
            src[row, max(1, S - row) :] = cfg.pad_id
        tgt = torch.randint(cfg.vocab_size, (batch_size, T), generator=gen)
        tgt[:, 0] = cfg.bos_id
        return src, tgt

    def example_targets(self, batch_size: int = 2) -> Tensor:
        """Next-token targets ``(B, T)`` matching :meth:`example_input`."""
        gen = torch.Generator().manual_seed(1)
        return torch.randint(self.config.vocab_size, (batch_size, min(8, self.config.max_target_len)), generator=gen)


register_family("seq2seq", Seq2SeqConfig, Seq2Seq)
register_preset("seq2seq-small", "seq2seq",
                "Encoder–decoder Transformer, 2+2 layers × 128 wide, 4 heads (date translation)",
                dim=128, num_layers=2, num_heads=4)
register_preset("seq2seq-micro", "seq2seq", "Encoder–decoder Transformer, 1+1 layers × 32 wide (tests)",
                dim=32, num_layers=1, num_heads=2, vocab_size=40, max_source_len=16, max_target_len=12)
