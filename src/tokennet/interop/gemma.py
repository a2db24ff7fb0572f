"""Gemma 3 → tokennet :class:`~tokennet.models.gpt.GPT` with Gemma's options, from a GGUF file (llama.cpp's ``gemma3``).

Gemma 3 (Gemma Team 2025, https://arxiv.org/abs/2503.19786) is tokennet's GPT configured as:

- embeddings scaled by √D, ``x_0 = √D · E[ids]``; the LM head tied to the (unscaled) embedding;
- sandwich-normed blocks, ``x ← x + N'(Attn(N(x)))``, ``x ← x + N'(MLP(N(x)))``, every norm an RMSNorm whose gain
  is ``1 + w`` (``norm_layer="rmsnorm1p"``); a final RMSNorm before the head;
- per-head RMSNorm of queries and keys (``qk_norm="rmsnorm1p"``) before RoPE, head width E from the file (256 for
  270M, not D/H), grouped-query attention, scores scaled by 1/√E;
- a GeGLU MLP, ``W₂ (GELU_tanh(W_g x) ⊙ W₁ x)``;
- five of every six layers attend in a sliding window of W keys (``i − W < j ≤ i``) with RoPE base 10⁴, the sixth
  (layers 5, 11, 17, …) to every earlier key with the file's base (10⁶): llama.cpp's ``set_swa_pattern(6)`` and its
  fixed local base.

llama.cpp's converter stores every Gemma norm gain as ``1 + w`` (it adds the one); tokennet's ``rmsnorm1p`` holds
``w``, so one is subtracted on import (exact for gains in [0.5, 2], Sterbenz). Gemma's rotary pairs are GPT-NeoX's
(channel j with j + E/2, as tokennet's), so Q and K rows are taken as they are.

GGUF name → tokennet name (``i`` = layer)::

    token_embd                   tok_emb (= lm_head)
    blk.i.attn_norm              decoder.blocks.i.norm1
    blk.i.attn_{q,k,v}           decoder.blocks.i.attn.qkv_proj (rows stacked)
    blk.i.attn_{q,k}_norm        decoder.blocks.i.attn.{q,k}_norm
    blk.i.attn_output            decoder.blocks.i.attn.out_proj
    blk.i.post_attention_norm    decoder.blocks.i.post_attn_norm
    blk.i.ffn_norm               decoder.blocks.i.norm2
    blk.i.ffn_{gate,up,down}     decoder.blocks.i.mlp.{gate,fc1,fc2}
    blk.i.post_ffw_norm          decoder.blocks.i.post_mlp_norm
    output_norm                  decoder.norm

Quantized tensors: the types :data:`~.gguf_in.KEPT_TYPES` names stay blocks (Q8_0 embedding; the K-quant and Q5_0
formats plug in there as they become :class:`~tokennet.layers.blockquant.BlockLinear` formats — nothing here
changes), any other type is dequantized to float32 with ``gguf.quants.dequantize`` and named in a one-line note.
Q, K and V stacked into ``qkv_proj`` stay blocks when they share a type, and when they mix Q8_0 with Q5_0 or Q4_0
(Gemma 3 270M: Q5_0 Q and K, Q8_0 V in 9 of 18 layers) they become Q8_0 blocks of the same weights
(:func:`~tokennet.layers.blockquant.widen_to_q8_0`); other mixes are dequantized to float32.
"""

from __future__ import annotations

import math
from pathlib import Path

from torch import Tensor

from ..errors import ConfigError, DataError
from ..models.gpt import GPT, GPTConfig
from ..tokens.sentencepiece import SentencePieceTokenizer
from .gguf_in import (
    arch_fields,
    block_formats,
    build_checked,
    check_block_count,
    dense,
    f32,
    field,
    field_count,
    load_tensors,
    read_gguf,
    stack_rows,
)
from .hf import NameMap
from .registry import Converted, register

__all__ = ["convert_gemma3_gguf", "gguf_sentencepiece", "gemma3_config", "gemma3_windows", "GGUF_GEMMA3_KEYS",
           "SWA_PATTERN",
           "ROPE_LOCAL_BASE"]

SWA_PATTERN = 6  # llama.cpp's gemma3: layer i is global when (i + 1) % 6 == 0, else sliding-window
ROPE_LOCAL_BASE = 10000.0  # llama.cpp's rope_freq_base_train_swa for gemma3 (not stored in the file)

GGUF_GEMMA3_KEYS = ("context_length", "embedding_length", "block_count", "feed_forward_length",
                    "attention.head_count", "attention.head_count_kv", "attention.key_length",
                    "attention.value_length", "attention.layer_norm_rms_epsilon", "rope.freq_base",
                    "attention.sliding_window", "vocab_size", "rope.dimension_count")
_REALS = ("attention.layer_norm_rms_epsilon", "rope.freq_base")

# Tokennet names of one layer → GGUF names.
LAYER_NAMES = {
    "norm1.weight": "attn_norm.weight",
    "attn.q_norm.weight": "attn_q_norm.weight",
    "attn.k_norm.weight": "attn_k_norm.weight",
    "attn.out_proj.weight": "attn_output.weight",
    "post_attn_norm.weight": "post_attention_norm.weight",
    "norm2.weight": "ffn_norm.weight",
    "mlp.gate.weight": "ffn_gate.weight",
    "mlp.fc1.weight": "ffn_up.weight",
    "mlp.fc2.weight": "ffn_down.weight",
    "post_mlp_norm.weight": "post_ffw_norm.weight",
}


def gemma3_windows(num_layers: int, window: int) -> list[int]:
    """Gemma 3's per-layer windows: ``window`` for five of each six layers, 0 (global) for every sixth."""
    return [0 if (i + 1) % SWA_PATTERN == 0 else window for i in range(num_layers)]


def gemma3_config(*, vocab_size: int, context: int, dim: int, hidden: int, layers: int, heads: int, kv_heads: int,
                  head_dim: int, rope_base: float, eps: float, window: int) -> GPTConfig:
    """The tokennet GPT config of a Gemma 3 text model."""
    config = GPTConfig(
        vocab_size=vocab_size, block_size=context, dim=dim, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
        head_dim=head_dim, mlp_ratio=hidden / dim, position="rope", rope_base=float(rope_base),
        rope_local_base=ROPE_LOCAL_BASE, tie_weights=True, bias=False, activation="gelu_tanh", gated_mlp=True,
        norm_layer="rmsnorm1p", norm_eps=float(eps), qk_norm="rmsnorm1p", norm_placement="sandwich",
        embedding_scale=math.sqrt(dim), attention_windows=gemma3_windows(layers, window))
    if round(config.mlp_ratio * dim) != hidden:
        raise ConfigError(f"feed_forward_length {hidden} cannot be expressed as mlp_ratio·{dim}; nothing was written")
    return config


SPM_FIELDS = ("model", "tokens", "scores", "token_type", "bos_token_id", "eos_token_id", "padding_token_id",
              "unknown_token_id", "add_bos_token", "add_space_prefix")


def gguf_sentencepiece(reader, path: Path) -> SentencePieceTokenizer:
    """The file's SentencePiece vocabulary (``tokenizer.ggml.model = "llama"``) as a tokennet tokenizer."""
    fields = {k: field(reader, "tokenizer.ggml." + k) for k in SPM_FIELDS}
    fields["chat_template"] = field(reader, "tokenizer.chat_template")
    return SentencePieceTokenizer.from_gguf_fields(fields, str(path))


def _gain(w) -> Tensor:
    """llama.cpp's stored norm gain ``1 + w`` → tokennet's ``w``."""
    return dense(w) - 1.0


@register(gguf=["gemma3"])
def convert_gemma3_gguf(path: Path, *, reader=None, keep_blocks: bool = True) -> Converted:
    """A tokennet GPT (and its SentencePiece tokenizer) from a ``gemma3`` GGUF file.

    Args:
        path: the file.
        reader: the file already opened with :func:`~.gguf_in.read_gguf`.
        keep_blocks: keep the block types tokennet holds as blocks (False: dequantize every tensor to float32).

    Returns:
        ``(model, tokenizer, notes)``.
    """
    reader = reader or read_gguf(path)
    fields = arch_fields(path, reader, "gemma3", GGUF_GEMMA3_KEYS, reals=_REALS,
                    required=("block_count", "context_length", "embedding_length", "feed_forward_length",
                            "attention.head_count", "attention.layer_norm_rms_epsilon", "attention.sliding_window"),
                    unknown=" (rope scaling, softcapping and the like are not implemented)")
    dim, heads = fields["embedding_length"], fields["attention.head_count"]
    kv_heads = fields["attention.head_count_kv"] or heads
    head_dim = fields["attention.key_length"] or dim // heads
    if (fields["attention.value_length"] or head_dim) != head_dim:
        raise ConfigError(f"{path}: gemma3.attention.value_length={fields['attention.value_length']} differs from "
                          f"key_length={head_dim}; tokennet's heads have one width; nothing was written")
    if fields["rope.dimension_count"] not in (None, head_dim):
        raise ConfigError(f"{path}: gemma3.rope.dimension_count={fields['rope.dimension_count']} (partial rotary) "
                          "is not supported; nothing was written")
    # The vocabulary is read once, into the tokenizer (262,144 pieces for Gemma 3), before the tensors.
    tokenizer = gguf_sentencepiece(reader, path) if field_count(reader, "tokenizer.ggml.tokens") else None
    vocab = fields["vocab_size"] or (tokenizer.vocab_size if tokenizer is not None else 0)
    if tokenizer is not None and tokenizer.vocab_size != vocab:
        raise DataError(f"{path}: the tokenizer has {tokenizer.vocab_size} tokens but the model {vocab}; "
                        "nothing was written")
    weights, notes = load_tensors(reader, path, keep_blocks=keep_blocks)
    check_block_count(path, weights, fields["block_count"])
    if "output.weight" in weights:
        raise DataError(f"{path}: a gemma3 file with an untied output.weight is not supported; nothing was written")
    config = gemma3_config(vocab_size=vocab, context=fields["context_length"], dim=dim,
                           hidden=fields["feed_forward_length"],
                           layers=fields["block_count"], heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                           rope_base=f32(fields["rope.freq_base"]) or 10000.0,
                           eps=f32(fields["attention.layer_norm_rms_epsilon"]),
                           window=fields["attention.sliding_window"])
    m = NameMap(weights, str(path))
    mixed: list[str] = []
    widened: list[str] = []
    m.put("tok_emb.weight", "token_embd.weight")
    m.put("lm_head.weight", "token_embd.weight")
    for i in range(config.num_layers):
        theirs, ours = f"blk.{i}.", f"decoder.blocks.{i}."
        for name, gguf_name in LAYER_NAMES.items():
            m.put(ours + name, theirs + gguf_name, _gain if "norm" in name else None)
        m.put(ours + "attn.qkv_proj.weight", [theirs + f"attn_{n}.weight" for n in "qkv"],
              stack_rows(mixed, ours + "attn.qkv_proj", widened))  # [W_q; W_k; W_v]
        for n in "qkv":  # the parts go as soon as they are stacked (their names stay for the checks)
            if m.has(theirs + f"attn_{n}.weight"):
                m.tensors[theirs + f"attn_{n}.weight"] = None
    m.put("decoder.norm.weight", "output_norm.weight", _gain)
    if mixed:
        notes.append(f"{len(mixed)} fused projection(s) ({mixed[0]}, …) mix GGUF types in their parts and were "
                     "dequantized to float32")
    if widened:
        notes.append(f"{len(widened)} fused projection(s) ({widened[0]}, …) mix Q8_0 with Q4_0/Q5_0 blocks: held as "
                     "Q8_0 blocks (the same weights exactly)")
    config = config.replace(quantized=block_formats(m.state, config.num_layers))
    m.tensors = dict.fromkeys(m.tensors)  # names kept for the checks; the Q, K, V parts stacked above go now
    del weights
    model = build_checked(GPT, config, m)
    return Converted(model.eval(), tokenizer, notes)
