"""Llama family → tokennet :class:`~tokennet.models.gpt.GPT` with Llama's options, from an HF directory or a GGUF file.

Llama (Touvron et al. 2023, https://arxiv.org/abs/2302.13971) is tokennet's GPT with four options
switched: RMSNorm instead of LayerNorm (``norm_layer="rmsnorm"``), a SwiGLU MLP
(``gated_mlp=True, activation="silu"``), rotary positions with a chosen base (``position="rope",
rope_base``), no biases (``bias=False``), grouped-query attention (``num_kv_heads``) and, in most
sizes, an LM head of its own (``tie_weights=False``; SmolLM2 ties it).

Two sources:

- a Hugging Face directory of ``LlamaForCausalLM`` (``config.json`` + ``model.safetensors``), or of
  ``MistralForCausalLM``: Llama's config with a ``sliding_window`` W, every layer's query at i attending to the keys
  ``i − W < j ≤ i`` (``attention_windows``);
- a GGUF file (llama.cpp's format), read with the ``gguf`` package. Q8_0, Q4_0 and Q4_1 tensors are kept as
  they are, block for block (:mod:`tokennet.layers.blockquant`; the config's ``quantized`` field says which
  layers hold blocks): the run reads the weights llama.cpp reads, in a sixth of float32's bytes. Other
  quantized types (k-quants, …) are dequantized to float32, with a one-line note. llama.cpp's Q/K row
  permutation is undone (a permutation of whole rows, so blocks survive it): llama.cpp's converter
  reorders each head's query/key rows from the "rotate-half" pairing (channel j with j + E/2, which HF and
  tokennet use) to interleaved pairs (2j, 2j + 1): ``W.reshape(H, 2, E/2, D).swapaxes(1, 2)``;
  :func:`unpermute` is its inverse. Q, K and V (rows stacked into ``qkv_proj``) stay blocks when all three
  are in one format.

HF name → GGUF name → tokennet name (``i`` = layer)::

    model.embed_tokens                   token_embd      tok_emb
    model.layers.i.input_layernorm       blk.i.attn_norm decoder.blocks.i.norm1
    model.layers.i.self_attn.{q,k,v}_proj blk.i.attn_{q,k,v} decoder.blocks.i.attn.qkv_proj (rows stacked)
    model.layers.i.self_attn.o_proj      blk.i.attn_output decoder.blocks.i.attn.out_proj
    model.layers.i.post_attention_layernorm blk.i.ffn_norm decoder.blocks.i.norm2
    model.layers.i.mlp.gate_proj         blk.i.ffn_gate  decoder.blocks.i.mlp.gate
    model.layers.i.mlp.up_proj           blk.i.ffn_up    decoder.blocks.i.mlp.fc1
    model.layers.i.mlp.down_proj         blk.i.ffn_down  decoder.blocks.i.mlp.fc2
    model.norm                           output_norm     decoder.norm
    lm_head                              output          lm_head (absent when tied)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..errors import ConfigError, DataError
from ..models.gpt import GPT, GPTConfig
from ..tokens.pretrained import PretrainedTokenizer
from .gguf_in import (
    arch_fields,
    block_formats,
    build_checked,
    check_block_count,
    dense,
    f32,
    field,
    gguf_tokenizer,
    load_tensors,
    read_gguf,
    stack_rows,
)
from .hf import NameMap, check_fields, check_layer_count, read_safetensors
from .registry import Converted, register

__all__ = ["convert_llama", "convert_mistral", "convert_llama_gguf", "convert_qwen2", "convert_qwen2_gguf",
           "unpermute", "permute", "llama_config", "LAYER_NAMES"]

# Tokennet names of one layer → (HF name, GGUF name).
LAYER_NAMES = {
    "norm1.weight": ("input_layernorm.weight", "attn_norm.weight"),
    "attn.out_proj.weight": ("self_attn.o_proj.weight", "attn_output.weight"),
    "norm2.weight": ("post_attention_layernorm.weight", "ffn_norm.weight"),
    "mlp.gate.weight": ("mlp.gate_proj.weight", "ffn_gate.weight"),
    "mlp.fc1.weight": ("mlp.up_proj.weight", "ffn_up.weight"),
    "mlp.fc2.weight": ("mlp.down_proj.weight", "ffn_down.weight"),
}


def llama_config(*, vocab_size: int, context: int, dim: int, hidden: int, layers: int, heads: int, kv_heads: int,
                 rope_base: float, eps: float, tied: bool, window: int | None = None) -> GPTConfig:
    """The tokennet GPT config of a Llama model (``window``: Mistral's sliding window of keys, every layer)."""
    config = GPTConfig(vocab_size=vocab_size, block_size=context, dim=dim, num_layers=layers, num_heads=heads,
                       num_kv_heads=kv_heads, mlp_ratio=hidden / dim, position="rope", rope_base=float(rope_base),
                       tie_weights=tied, bias=False, activation="silu", gated_mlp=True, norm_layer="rmsnorm",
                       norm_eps=float(eps), attention_windows=[window] * layers if window else None)
    if round(config.mlp_ratio * dim) != hidden:
        raise ConfigError(f"intermediate size {hidden} cannot be expressed as mlp_ratio·{dim}; nothing was written")
    return config


def _fill(m: NameMap, config: GPTConfig, *, gguf: bool, stack=None) -> None:
    """Put every tensor of a Llama checkpoint into ``m`` (HF or GGUF names); ``stack(name)`` makes the function that
    stacks Q, K and V rows (default ``torch.cat``)."""
    k = 1 if gguf else 0
    emb, final, head = ("token_embd.weight", "output_norm.weight", "output.weight") if gguf else \
        ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")
    m.put("tok_emb.weight", emb)
    for i in range(config.num_layers):
        theirs = f"blk.{i}." if gguf else f"model.layers.{i}."
        ours = f"decoder.blocks.{i}."
        for name, pair in LAYER_NAMES.items():
            m.put(ours + name, theirs + pair[k])
        qkv = [theirs + (f"attn_{n}.weight" if gguf else f"self_attn.{n}_proj.weight") for n in "qkv"]
        cat = stack(ours + "attn.qkv_proj") if stack else (lambda *parts: torch.cat(parts))
        m.put(ours + "attn.qkv_proj.weight", qkv, cat)  # [W_q; W_k; W_v]
    m.put("decoder.norm.weight", final)
    if config.tie_weights:
        m.put("lm_head.weight", emb)
    else:
        m.put("lm_head.weight", head)


def _hf_rope_base(cfg: dict[str, Any]) -> float:
    params = cfg.get("rope_parameters")
    if params is not None:  # transformers ≥ 5 writes rope_parameters
        if params.get("rope_type", "default") != "default":
            raise ConfigError(f"config field rope_parameters.rope_type={params.get('rope_type')!r} is not supported "
                              "by the llama converter (tokennet implements plain RoPE); nothing was written")
        return params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    return cfg.get("rope_theta", 10000.0)


@register(hf=[("mistral", "MistralForCausalLM")])
def convert_mistral(source: Path, cfg: dict[str, Any]) -> Converted:
    """A tokennet GPT holding the weights of the ``MistralForCausalLM`` checkpoint directory ``source``: Llama with
    every layer attending in a sliding window of ``sliding_window`` keys (``i − W < j ≤ i``; null: global)."""
    return convert_llama(source, cfg, family="mistral")


@register(hf=[("llama", "LlamaForCausalLM")])
def convert_llama(source: Path, cfg: dict[str, Any], *, family: str = "llama") -> Converted:
    """A tokennet GPT holding the weights of the ``LlamaForCausalLM`` checkpoint directory ``source``."""
    window = cfg.get("sliding_window") if family == "mistral" else None
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ConfigError(f"config field sliding_window={window!r} is not a positive integer or null; "
                          "nothing was written")
    check_fields(
        cfg, family,
        mapped=("vocab_size", "max_position_embeddings", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "rope_theta", "rope_parameters", "rms_norm_eps",
                "tie_word_embeddings", "head_dim") + (("sliding_window",) if family == "mistral" else ()),
        required={"hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "rope_scaling": None,
                  "pretraining_tp": 1},
        ignored=("attention_dropout",),
    )
    dim, heads = cfg.get("hidden_size", 4096), cfg.get("num_attention_heads", 32)
    if cfg.get("head_dim", dim // heads) != dim // heads:
        raise ConfigError(f"config field head_dim={cfg['head_dim']} differs from hidden_size/num_attention_heads="
                          f"{dim // heads}; tokennet implements the latter; nothing was written")
    config = llama_config(
        vocab_size=cfg.get("vocab_size", 32000), context=cfg.get("max_position_embeddings", 2048), dim=dim,
        hidden=cfg.get("intermediate_size", 11008), layers=cfg.get("num_hidden_layers", 32), heads=heads,
        kv_heads=cfg.get("num_key_value_heads") or heads, rope_base=_hf_rope_base(cfg),
        eps=cfg.get("rms_norm_eps", 1e-6), tied=cfg.get("tie_word_embeddings", False),
        window=window if window is not None and window < cfg.get("max_position_embeddings", 2048) else None)
    m = NameMap(read_safetensors(source), str(source / "model.safetensors"))
    check_layer_count(m.tensors, config.num_layers, m.where)
    _fill(m, config, gguf=False)
    model = build_checked(GPT, config, m)
    tokenizer = PretrainedTokenizer.from_hf_dir(source, vocab_size=config.vocab_size)
    notes = [] if tokenizer else ["the source has no tokenizer.json: the run takes token ids, and "
                                  "`generate --prompt` needs a tokenizer"]
    return Converted(model.eval(), tokenizer, notes)


# -- GGUF -------------------------------------------------------------------------------------------
def permute(w: Tensor, num_heads: int) -> Tensor:
    """llama.cpp's Q/K row permutation (``convert_hf_to_gguf.py``): rotate-half pairs (j, j+E/2) → interleaved pairs
    (2j, 2j+1), ``w.reshape(H, 2, E/2, …).swapaxes(1, 2)``; for a weight ``(H·E, D)`` or a bias ``(H·E,)``."""
    rows = w.shape[0]
    head_dim = rows // num_heads
    return w.reshape(num_heads, 2, head_dim // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)  # (H, E/2, 2, …)


def unpermute(w: Tensor, num_heads: int) -> Tensor:
    """Undo llama.cpp's Q/K row permutation: interleaved rotary pairs (2j, 2j+1) → rotate-half pairs (j, j+E/2).

    llama.cpp's ``convert_hf_to_gguf.py`` applies ``w.reshape(H, 2, E/2, D).swapaxes(1, 2).reshape(H·E, D)``;
    this is its inverse.
    """
    rows, width = w.shape
    head_dim = rows // num_heads
    # (H, 2, E/2, D) → (H·E, D)
    return w.reshape(num_heads, head_dim // 2, 2, width).transpose(1, 2).reshape(rows, width)


# llama.* metadata keys the converter maps; others (e.g. rope scaling) stop the import.
GGUF_LLAMA_KEYS = ("block_count", "context_length", "embedding_length", "feed_forward_length",
                   "attention.head_count", "attention.head_count_kv", "rope.freq_base",
                   "attention.layer_norm_rms_epsilon", "vocab_size", "rope.dimension_count")
_GGUF_LLAMA_REALS = ("rope.freq_base", "attention.layer_norm_rms_epsilon")


def _unpermute_rows(w, num_heads: int):
    """:func:`unpermute` of a dense matrix, or the same permutation of a matrix's rows of blocks."""
    if isinstance(w, Tensor):
        return unpermute(w, num_heads)
    order = unpermute(torch.arange(w.qs.shape[0])[:, None], num_heads)[:, 0]  # where each row comes from
    return w.rows(order)


@register(gguf=["llama"])
def convert_llama_gguf(path: Path, *, reader=None, keep_blocks: bool = True) -> Converted:
    """A tokennet GPT (and its tokenizer) from a Llama-architecture GGUF file.

    Args:
        path: the file.
        reader: the file already opened with :func:`~.gguf_in.read_gguf`.
        keep_blocks: keep Q8_0/Q4_0/Q4_1 tensors as blocks (False: dequantize every tensor to float32).

    Returns:
        ``(model, tokenizer, notes)``.
    """
    return _llama_like_gguf(path, reader or read_gguf(path), keep_blocks, "llama", GGUF_LLAMA_KEYS)


# -- Qwen2 -------------------------------------------------------------------------------------------
# Qwen2 (Yang et al. 2024, https://arxiv.org/abs/2407.10671) is Llama with biases on the query, key and value
# projections (``qkv_bias``): ``[Q; K; V] = X [W_q; W_k; W_v]ᵀ + [b_q; b_k; b_v]``; every other layer has none.
# HF ``model.layers.i.self_attn.{q,k,v}_proj.bias`` / GGUF ``blk.i.attn_{q,k,v}.bias`` → ``attn.qkv_proj.bias``.
# llama.cpp's converter does not permute Qwen2's query/key rows (its graph rotates halves, as HF does).

def _put_qkv_bias(m: NameMap, config: GPTConfig, *, gguf: bool) -> None:
    for i in range(config.num_layers):
        theirs = [f"blk.{i}.attn_{n}.bias" if gguf else f"model.layers.{i}.self_attn.{n}_proj.bias" for n in "qkv"]
        m.put(f"decoder.blocks.{i}.attn.qkv_proj.bias", theirs,
              lambda *parts: torch.cat([dense(part) for part in parts]))


@register(hf=[("qwen2", "Qwen2ForCausalLM")])
def convert_qwen2(source: Path, cfg: dict[str, Any]) -> Converted:
    """A tokennet GPT holding the weights of the ``Qwen2ForCausalLM`` checkpoint directory ``source``."""
    check_fields(
        cfg, "qwen2",
        mapped=("vocab_size", "max_position_embeddings", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "rope_theta", "rope_parameters", "rms_norm_eps",
                "tie_word_embeddings", "head_dim"),
        required={"hidden_act": "silu", "rope_scaling": None, "use_sliding_window": False},
        # without use_sliding_window, sliding_window and max_window_layers change nothing
        ignored=("attention_dropout", "sliding_window", "max_window_layers", "layer_types"),
    )
    if any(t != "full_attention" for t in cfg.get("layer_types") or []):
        raise ConfigError(f"config field layer_types={cfg['layer_types']!r}: tokennet's qwen2 converter implements "
                          "full attention in every layer; nothing was written")
    dim, heads = cfg.get("hidden_size", 4096), cfg.get("num_attention_heads", 32)
    if cfg.get("head_dim", dim // heads) != dim // heads:
        raise ConfigError(f"config field head_dim={cfg['head_dim']} differs from hidden_size/num_attention_heads="
                          f"{dim // heads}; tokennet implements the latter; nothing was written")
    config = llama_config(
        vocab_size=cfg.get("vocab_size", 151936), context=cfg.get("max_position_embeddings", 32768), dim=dim,
        hidden=cfg.get("intermediate_size", 22016), layers=cfg.get("num_hidden_layers", 32), heads=heads,
        kv_heads=cfg.get("num_key_value_heads") or heads, rope_base=_hf_rope_base(cfg),
        eps=cfg.get("rms_norm_eps", 1e-6), tied=cfg.get("tie_word_embeddings", False)).replace(qkv_bias=True)
    m = NameMap(read_safetensors(source), str(source / "model.safetensors"))
    check_layer_count(m.tensors, config.num_layers, m.where)
    _fill(m, config, gguf=False)
    _put_qkv_bias(m, config, gguf=False)
    model = build_checked(GPT, config, m)
    tokenizer = PretrainedTokenizer.from_hf_dir(source, vocab_size=config.vocab_size)
    notes = [] if tokenizer else ["the source has no tokenizer.json: the run takes token ids, and "
                                  "`generate --prompt` needs a tokenizer"]
    return Converted(model.eval(), tokenizer, notes)


GGUF_QWEN2_KEYS = ("block_count", "context_length", "embedding_length", "feed_forward_length",
                   "attention.head_count", "attention.head_count_kv", "rope.freq_base",
                   "attention.layer_norm_rms_epsilon", "vocab_size", "rope.dimension_count")


@register(gguf=["qwen2"])
def convert_qwen2_gguf(path: Path, *, reader=None, keep_blocks: bool = True) -> Converted:
    """A tokennet GPT (and its tokenizer) from a ``qwen2``-architecture GGUF file: ``(model, tokenizer, notes)``."""
    return _llama_like_gguf(path, reader or read_gguf(path), keep_blocks, "qwen2", GGUF_QWEN2_KEYS)


def _llama_like_gguf(path: Path, reader, keep_blocks: bool, arch: str,
                     keys: tuple[str, ...]) -> Converted:
    """A ``llama`` or ``qwen2`` GGUF file as a tokennet GPT: the same header and tensors, except that llama.cpp
    permutes Llama's query/key rows (undone here) and Qwen2 has biases on q, k, v and no permutation."""
    qwen2 = arch == "qwen2"
    fields = arch_fields(path, reader, arch, keys, reals=_GGUF_LLAMA_REALS,
                    required=("block_count", "context_length", "embedding_length", "feed_forward_length",
                              "attention.head_count", "attention.layer_norm_rms_epsilon"))
    dim, heads = fields["embedding_length"], fields["attention.head_count"]
    kv_heads = fields["attention.head_count_kv"] or heads
    if fields["rope.dimension_count"] not in (None, dim // heads):
        raise ConfigError(f"{path}: {arch}.rope.dimension_count={fields['rope.dimension_count']} (partial rotary) "
                          "is not supported; nothing was written")
    tokens = field(reader, "tokenizer.ggml.tokens") or []
    vocab = fields["vocab_size"] or len(tokens)
    if tokens and len(tokens) != vocab:
        raise DataError(f"{path}: the tokenizer has {len(tokens)} tokens but the model {vocab}; nothing was written")
    weights, notes = load_tensors(reader, path, keep_blocks=keep_blocks)
    check_block_count(path, weights, fields["block_count"])
    config = llama_config(vocab_size=vocab, context=fields["context_length"], dim=dim,
                          hidden=fields["feed_forward_length"],
                          layers=fields["block_count"], heads=heads, kv_heads=kv_heads,
                          rope_base=f32(fields["rope.freq_base"]) or 10000.0,
                          eps=f32(fields["attention.layer_norm_rms_epsilon"]),
                          tied="output.weight" not in weights).replace(qkv_bias=qwen2)
    if not qwen2:
        for name in weights:
            if name.endswith("attn_q.weight"):
                weights[name] = _unpermute_rows(weights[name], heads)
            elif name.endswith("attn_k.weight"):
                weights[name] = _unpermute_rows(weights[name], kv_heads)
    m = NameMap(weights, str(path))
    mixed: list[str] = []
    widened: list[str] = []
    _fill(m, config, gguf=True, stack=lambda name: stack_rows(mixed, name, widened))
    if qwen2:
        _put_qkv_bias(m, config, gguf=True)
    if mixed:
        notes.append(f"{len(mixed)} fused projection(s) ({mixed[0]}, …) mix GGUF types in their parts and were "
                     "dequantized to float32")
    if widened:
        notes.append(f"{len(widened)} fused projection(s) ({widened[0]}, …) mix Q8_0 with Q4_0/Q5_0 blocks: held as "
                     "Q8_0 blocks (the same weights exactly)")
    config = config.replace(quantized=block_formats(m.state, config.num_layers))
    model = build_checked(GPT, config, m)
    return Converted(model.eval(), gguf_tokenizer(reader, path, config.vocab_size), notes)
