"""The historical baseline: an RNN encoder–decoder with additive attention (Bahdanau et al. 2015).

https://arxiv.org/abs/1409.0473. The encoder is a bidirectional GRU over the source; its states
``h_j = [h→_j; h←_j]`` are the keys and values. At each target step the decoder's previous state
``s_{t−1}`` is the query:

    e_tj = w_vᵀ tanh(W_q s_{t−1} + W_k h_j)        (additive score, masked at source padding)
    α_t  = softmax_j(e_tj),  c_t = Σ_j α_tj h_j    (the context vector)
    s_t  = GRU([E y_{t−1}; c_t], s_{t−1})
    p(y_t | y_{<t}, x) = softmax(W_o tanh(W_h [s_t; c_t; E y_{t−1}]))

The decoder starts from ``s_0 = tanh(W_s h←_1)`` (the backward encoder's summary of the sentence), as in
the paper.

``attention=False`` is the encoder–decoder *without* attention that the paper improves on (Cho et al. 2014,
https://arxiv.org/abs/1406.1078): the whole source is squeezed into one fixed vector
``c = [h→_S; h←_1]`` (the two directions' final states), and every step reads that same ``c``:
``s_t = GRU([E y_{t−1}; c], s_{t−1})``, ``p(y_t | …) = softmax(W_o tanh(W_h [s_t; c; E y_{t−1}]))`` — the
same parameters less the additive score. However long the input, the decoder sees ``dim`` numbers of it.

Same data interface as :class:`~tokennet.models.seq2seq.Seq2Seq` — ``forward((src, tgt_in), tgt_out)`` —
and the same decoding protocol, so the two share the recipe, greedy and beam search.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..attention.functional import masked_softmax
from ..attention.masks import padding
from ..attention.scores import AdditiveScore
from ..dropout import Dropout
from ..errors import ConfigError
from .registry import ModelConfig, Output, register_family, register_preset
from .seqio import check_token_ids, seq_loss, source_target

__all__ = ["BahdanauConfig", "Bahdanau", "RNNState"]


@dataclass
class BahdanauConfig(ModelConfig):
    """Config of :class:`Bahdanau`.

    Args:
        vocab_size: number of token ids (shared by source and target).
        max_source_len: longest source in tokens.
        max_target_len: longest target in tokens, ``<bos>`` included.
        dim: embedding width and GRU state width (each encoder direction has ``dim // 2``, so the
            encoder states ``[h→; h←]`` are ``dim`` wide).
        num_layers: GRU layers of the encoder and of the decoder.
        attention_dim: hidden width of the additive score (None = dim).
        attention: False drops the attention: every step reads the fixed summary ``c = [h→_S; h←_1]``
            (Cho et al. 2014's encoder–decoder) instead of ``c_t = Σ_j α_tj h_j``.
        dropout: dropout on embeddings, between GRU layers and before the output layer.
        label_smoothing: ε of the smoothed cross-entropy.
        pad_id, bos_id, eos_id: special token ids.
    """

    vocab_size: int = 64
    max_source_len: int = 64
    max_target_len: int = 32
    dim: int = 128
    num_layers: int = 1
    attention_dim: int | None = None
    attention: bool = True
    dropout: float = 0.0
    label_smoothing: float = 0.0
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self):
        self.family = "bahdanau"
        self._positive(vocab_size=self.vocab_size, max_source_len=self.max_source_len,
                       max_target_len=self.max_target_len, dim=self.dim, num_layers=self.num_layers)
        if self.attention_dim is not None:
            self._positive(attention_dim=self.attention_dim)
        if not isinstance(self.attention, bool):
            raise ConfigError(f"attention={self.attention!r} must be true or false")
        if self.dim % 2:
            raise ConfigError(f"dim={self.dim} must be even (each encoder direction gets dim // 2)")
        self._fraction(dropout=self.dropout, label_smoothing=self.label_smoothing)
        for k in ("pad_id", "bos_id", "eos_id"):
            if not 0 <= getattr(self, k) < self.vocab_size:
                raise ConfigError(f"{k}={getattr(self, k)} must be a token id in [0, vocab_size={self.vocab_size})")


@dataclass
class RNNState:
    """Decoding state: encoder states, their mask, the decoder's GRU state (the RNN's "cache").

    ``hidden`` advances with each cached step; uncached steps rerun the GRU from ``hidden0``.
    """

    memory: Tensor  # (B, S, D); without attention (B, 1, D): the fixed summary c
    mask: Tensor  # (B, 1, S); without attention (B, 1, 1), all True
    hidden0: Tensor  # (L, B, D)
    hidden: Tensor  # (L, B, D)
    use_cache: bool = True

    @property
    def batch_size(self) -> int:
        return self.memory.shape[0]

    def reorder(self, index: Tensor) -> None:
        self.memory = self.memory.index_select(0, index)
        self.mask = self.mask.index_select(0, index)
        self.hidden0 = self.hidden0.index_select(1, index)
        self.hidden = self.hidden.index_select(1, index)


class Bahdanau(nn.Module):
    """GRU encoder–decoder with additive attention: ``forward((src, tgt_in), tgt_out=None) → Output``."""

    def __init__(self, config: BahdanauConfig):
        super().__init__()
        self.config = cfg = config
        D, L = cfg.dim, cfg.num_layers
        rnn_drop = cfg.dropout if L > 1 else 0.0
        self.tok_emb = nn.Embedding(cfg.vocab_size, D, padding_idx=cfg.pad_id)
        self.drop = Dropout(cfg.dropout)
        self.encoder = nn.GRU(D, D // 2, num_layers=L, batch_first=True, bidirectional=True, dropout=rnn_drop)
        self.init_proj = nn.Linear(D // 2, D)  # W_s: backward summary → s_0
        self.score = AdditiveScore(D, D, cfg.attention_dim or D) if cfg.attention else None
        self.decoder = nn.GRU(2 * D, D, num_layers=L, batch_first=True, dropout=rnn_drop)
        self.out_proj = nn.Linear(3 * D, D)  # W_h over [s_t; c_t; E y_{t-1}]
        self.lm_head = nn.Linear(D, cfg.vocab_size)

    # -- encoder -------------------------------------------------------------------------------
    def encode(self, src: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Source ids ``(B, S)`` → ``(states (B, S, D), mask (B, 1, S), s_0 (L, B, D))``.

        Without attention the "states" are the one summary ``c = [h→_S; h←_1]`` ``(B, 1, D)``, mask all True.
        """
        cfg = self.config
        check_token_ids(src, cfg.vocab_size, cfg.max_source_len, "source")
        B, S = src.shape
        mask = padding(src.eq(cfg.pad_id))[:, 0]  # (B, 1, S)
        # pack_padded_sequence needs lengths >= 1: an empty source is read as one <pad>, whose state
        # the mask then hides (its context vector is zero).
        lengths = mask[:, 0].sum(-1).clamp(min=1).cpu()
        packed = pack_padded_sequence(self.drop(self.tok_emb(src)), lengths, batch_first=True, enforce_sorted=False)
        out, h_n = self.encoder(packed)
        memory, _ = pad_packed_sequence(out, batch_first=True, total_length=S)  # (B, S, D)
        finals = h_n.view(cfg.num_layers, 2, B, cfg.dim // 2)  # (L, 2, B, D/2): h→_S and h←_1 of every layer
        init_state = torch.tanh(self.init_proj(finals[:, 1]))  # (L, B, D)
        if not cfg.attention:  # the fixed-length summary of the top layer, [h→_S; h←_1]
            summary = torch.cat([finals[-1, 0], finals[-1, 1]], dim=-1)[:, None]  # (B, 1, D)
            return summary, torch.ones(B, 1, 1, dtype=torch.bool, device=src.device), init_state
        return memory, mask, init_state

    # -- decoder -------------------------------------------------------------------------------
    def _steps(self, tgt: Tensor, memory: Tensor, mask: Tensor, hidden: Tensor, *, return_attention: bool = False):
        """Run the decoder over ``tgt`` ``(B, T)`` from ``hidden``; return ``(logits (B, T, V), hidden)``
        (and the alignments ``α`` ``(B, T, S)`` with ``return_attention``)."""
        emb = self.drop(self.tok_emb(tgt))  # (B, T, D)
        outs, alphas = [], []
        for t in range(tgt.shape[1]):
            query = hidden[-1][:, None]  # (B, 1, D): s_{t-1} of the top layer
            if self.score is None:  # no attention: the same summary c at every step
                alpha, ctx = mask.to(memory.dtype), memory  # (B, 1, 1), (B, 1, D)
            else:
                alpha = masked_softmax(self.score(query, memory), mask)  # (B, 1, S)
                ctx = alpha @ memory  # (B, 1, D)
            emb_t = emb[:, t : t + 1]  # (B, 1, D)
            dec_out, hidden = self.decoder(torch.cat([emb_t, ctx], dim=-1), hidden)  # s: (B, 1, D)
            outs.append(torch.cat([dec_out, ctx, emb_t], dim=-1))
            alphas.append(alpha)
        feats = torch.tanh(self.out_proj(torch.cat(outs, dim=1)))  # (B, T, D)
        logits = self.lm_head(self.drop(feats))
        return (logits, hidden, torch.cat(alphas, dim=1)) if return_attention else (logits, hidden)

    def forward(self, inputs: tuple[Tensor, Tensor], targets: Tensor | None = None) -> Output:
        logits, _ = self._teacher_forced(inputs)  # (B, T, V)
        return Output(logits, seq_loss(logits, targets, self.config.label_smoothing))

    def _teacher_forced(self, inputs, return_attention: bool = False):
        src, tgt = source_target(inputs)
        cfg = self.config
        check_token_ids(tgt, cfg.vocab_size, cfg.max_target_len, "target")
        memory, mask, init_hidden = self.encode(src)
        out = self._steps(tgt, memory, mask, init_hidden, return_attention=return_attention)
        return out[0], (out[2] if return_attention else None)

    def attention_maps(self, inputs: tuple[Tensor, Tensor]) -> dict[str, list[Tensor]]:
        """The additive attention's alignments under teacher forcing, as one "layer" with one "head":
        ``{"cross": [(B, 1, T, S)]}`` (Bahdanau et al. 2015, Fig. 3).

        Raises:
            ConfigError: the model has no attention (``attention=False``).
        """
        if not self.config.attention:
            raise ConfigError("this GRU encoder–decoder has no attention (attention=false): no alignments to show")
        _, alphas = self._teacher_forced(inputs, return_attention=True)
        return {"cross": [alphas[:, None]]}  # (B, 1, T, S)

    # -- decoding ------------------------------------------------------------------------------
    def init_decode(self, src: Tensor, *, use_cache: bool = True) -> RNNState:
        memory, mask, init_hidden = self.encode(src)
        return RNNState(memory, mask, init_hidden, init_hidden, use_cache)

    def decode_step(self, tokens: Tensor, state: RNNState) -> Tensor:
        """Next-token logits ``(B, n, V)``: cached, ``tokens`` are new and the state advances; else the prefix."""
        if state.use_cache:
            logits, state.hidden = self._steps(tokens, state.memory, state.mask, state.hidden)
            return logits
        check_token_ids(tokens, self.config.vocab_size, self.config.max_target_len, "target")
        return self._steps(tokens, state.memory, state.mask, state.hidden0)[0]

    # -- examples for tests --------------------------------------------------------------------
    def example_input(self, batch_size: int = 2) -> tuple[Tensor, Tensor]:
        """``(src, tgt_in)`` of random ids; row 0 is full length, the others end in padding."""
        cfg = self.config
        gen = torch.Generator().manual_seed(0)
        S, T = min(12, cfg.max_source_len), min(8, cfg.max_target_len)
        src = torch.randint(min(4, cfg.vocab_size - 1), cfg.vocab_size, (batch_size, S), generator=gen)
        for row in range(1, batch_size):
            src[row, max(1, S - row) :] = cfg.pad_id
        tgt = torch.randint(cfg.vocab_size, (batch_size, T), generator=gen)
        tgt[:, 0] = cfg.bos_id
        return src, tgt

    def example_targets(self, batch_size: int = 2) -> Tensor:
        gen = torch.Generator().manual_seed(1)
        return torch.randint(self.config.vocab_size, (batch_size, min(8, self.config.max_target_len)), generator=gen)


register_family("bahdanau", BahdanauConfig, Bahdanau)
register_preset("bahdanau-small", "bahdanau", "GRU encoder–decoder with additive attention, 1 layer × 128 "
                "(the date-translation baseline)", dim=128, num_layers=1)
register_preset("bahdanau-micro", "bahdanau", "GRU encoder–decoder with additive attention, 1 layer × 32 (tests)",
                dim=32, num_layers=1, vocab_size=40, max_source_len=16, max_target_len=12)
