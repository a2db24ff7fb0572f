"""GPT-2 (Hugging Face ``GPT2LMHeadModel``) → tokennet :class:`~tokennet.models.gpt.GPT`.

GPT-2 is tokennet's GPT with learned positions, pre-norm blocks, the tanh-approximate GELU, LayerNorm
ε = 1e-5 and the LM head tied to the token embedding (Radford et al. 2019). The layouts differ in two
ways, both handled here:

- GPT-2's ``Conv1D`` stores weights ``(in, out)`` (``y = x W + b``); ``nn.Linear`` stores ``(out, in)``,
  so every projection is transposed;
- ``c_attn`` is already the fused ``[W_q | W_k | W_v]`` along its output axis, exactly tokennet's
  ``qkv_proj`` rows after the transpose (Q rows first, then K, then V, head-major inside each).

Name map (``i`` = layer), HF and GGUF (llama.cpp's ``gpt2`` architecture, written by its converter with the
same ``(out, in)`` layout as ``nn.Linear``)::

    transformer.wte             token_embd       → tok_emb
    transformer.wpe             position_embd    → pos_emb
    transformer.h.i.ln_1        blk.i.attn_norm  → decoder.blocks.i.norm1
    transformer.h.i.attn.c_attn blk.i.attn_qkv   → decoder.blocks.i.attn.qkv_proj   (HF: transposed)
    transformer.h.i.attn.c_proj blk.i.attn_output → decoder.blocks.i.attn.out_proj  (HF: transposed)
    transformer.h.i.ln_2        blk.i.ffn_norm   → decoder.blocks.i.norm2
    transformer.h.i.mlp.c_fc    blk.i.ffn_up     → decoder.blocks.i.mlp.fc1         (HF: transposed)
    transformer.h.i.mlp.c_proj  blk.i.ffn_down   → decoder.blocks.i.mlp.fc2         (HF: transposed)
    transformer.ln_f            output_norm      → decoder.norm
    lm_head (absent when tied)  output (absent when tied) → lm_head

(``.weight`` and ``.bias`` each.) llama.cpp's GPT-2 graph uses the tanh approximation of GELU, so a GGUF file
imports with ``activation="gelu_tanh"``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ConfigError, DataError
from ..models.gpt import GPT, GPTConfig
from ..tokens.pretrained import PretrainedTokenizer
from .gguf_in import (
    block_formats,
    build_checked,
    check_block_count,
    check_numbers,
    dense,
    f32,
    field,
    gguf_tokenizer,
    load_tensors,
    read_gguf,
)
from .hf import NameMap, check_fields, check_layer_count, linear_from_conv1d, read_safetensors
from .registry import Converted, register

__all__ = ["convert_gpt2", "convert_gpt2_gguf", "GGUF_LAYER_NAMES", "GGUF_GPT2_KEYS"]

# tokennet module of a layer → llama.cpp's GGUF name (each with .weight and .bias)
GGUF_LAYER_NAMES = {"norm1": "attn_norm", "attn.qkv_proj": "attn_qkv", "attn.out_proj": "attn_output",
                    "norm2": "ffn_norm", "mlp.fc1": "ffn_up", "mlp.fc2": "ffn_down"}
# gpt2.* metadata keys the converter maps; others stop the import.
GGUF_GPT2_KEYS = ("block_count", "context_length", "embedding_length", "feed_forward_length",
                  "attention.head_count", "attention.head_count_kv", "attention.layer_norm_epsilon", "vocab_size")

ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}


def gpt2_config(cfg: dict[str, Any]) -> GPTConfig:
    """Map a ``GPT2Config`` (as JSON) onto :class:`GPTConfig`, refusing what tokennet does not implement."""
    check_fields(
        cfg, "gpt2",
        mapped=("vocab_size", "n_positions", "n_ctx", "n_embd", "n_layer", "n_head", "n_inner",
                "activation_function", "layer_norm_epsilon", "tie_word_embeddings"),
        required={"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                  "add_cross_attention": False},
        # Dropout rates are training-time only; reorder_and_upcast_attn changes float16 numerics, not
        # the function; summary_* configure GPT2DoubleHeadsModel's extra head, absent from an LM.
        ignored=("attn_pdrop", "embd_pdrop", "resid_pdrop", "summary_first_dropout", "reorder_and_upcast_attn",
                 "summary_activation", "summary_proj_to_labels", "summary_type", "summary_use_proj"),
    )
    act = cfg.get("activation_function", "gelu_new")
    if act not in ACTIVATIONS:
        raise ConfigError(f"config field activation_function={act!r} is not supported by the gpt2 converter "
                          f"(supported: {', '.join(ACTIVATIONS)}); nothing was written")
    dim = cfg.get("n_embd", 768)
    if cfg.get("n_ctx") is not None and cfg.get("n_ctx") != cfg.get("n_positions", 1024):
        raise ConfigError(f"config fields n_ctx={cfg['n_ctx']} and n_positions={cfg.get('n_positions')} disagree; "
                          "nothing was written")
    inner = cfg.get("n_inner") or 4 * dim
    return GPTConfig(
        vocab_size=cfg.get("vocab_size", 50257), block_size=cfg.get("n_positions", 1024), dim=dim,
        num_layers=cfg.get("n_layer", 12), num_heads=cfg.get("n_head", 12), mlp_ratio=inner / dim,
        position="learned", tie_weights=cfg.get("tie_word_embeddings", True), bias=True,
        activation=ACTIVATIONS[act], norm_eps=float(cfg.get("layer_norm_epsilon", 1e-5)),
    )


@register(hf=[("gpt2", "GPT2LMHeadModel")])
def convert_gpt2(source: Path, cfg: dict[str, Any]) -> Converted:
    """Build a tokennet GPT holding the weights of the ``GPT2LMHeadModel`` checkpoint in ``source``.

    Returns:
        ``(model, notes)``: notes are one-line remarks for the user (nothing is dropped silently).
    """
    config = gpt2_config(cfg)
    if round(config.mlp_ratio * config.dim) != (cfg.get("n_inner") or 4 * config.dim):
        raise ConfigError(f"config field n_inner={cfg.get('n_inner')} cannot be expressed as mlp_ratio·n_embd")
    tensors = read_safetensors(source)
    # Checkpoints saved from GPT2Model (or old ones) have no "transformer." prefix.
    prefix = "transformer." if any(k.startswith("transformer.") for k in tensors) else ""
    # attn.bias / attn.masked_bias: the causal mask as a buffer (older transformers saved it); tokennet builds it.
    m = NameMap(tensors, str(source / "model.safetensors"), derived=rf"{prefix}h\.\d+\.attn\.(bias|masked_bias)")
    check_layer_count(tensors, config.num_layers, m.where)
    t = linear_from_conv1d
    m.put("tok_emb.weight", f"{prefix}wte.weight")
    m.put("pos_emb.weight", f"{prefix}wpe.weight")
    for i in range(config.num_layers):
        their_layer, our_block = f"{prefix}h.{i}.", f"decoder.blocks.{i}."
        for ours, theirs in (("norm1", "ln_1"), ("norm2", "ln_2")):
            m.put(f"{our_block}{ours}.weight", f"{their_layer}{theirs}.weight")
            m.put(f"{our_block}{ours}.bias", f"{their_layer}{theirs}.bias")
        for ours, theirs in (("attn.qkv_proj", "attn.c_attn"), ("attn.out_proj", "attn.c_proj"),
                             ("mlp.fc1", "mlp.c_fc"), ("mlp.fc2", "mlp.c_proj")):
            m.put(f"{our_block}{ours}.weight", f"{their_layer}{theirs}.weight", t)
            m.put(f"{our_block}{ours}.bias", f"{their_layer}{theirs}.bias")
    m.put("decoder.norm.weight", f"{prefix}ln_f.weight")
    m.put("decoder.norm.bias", f"{prefix}ln_f.bias")
    if config.tie_weights:
        # save_pretrained drops the tied copy; a file that keeps it must hold the same matrix.
        if m.has("lm_head.weight"):
            if not m.tensors["lm_head.weight"].equal(m.tensors[f"{prefix}wte.weight"]):
                raise ConfigError("tie_word_embeddings is true but lm_head.weight differs from wte.weight; "
                                  "nothing was written")
            m.used.add("lm_head.weight")
        m.put("lm_head.weight", f"{prefix}wte.weight")
    else:
        m.put("lm_head.weight", "lm_head.weight")
    model = build_checked(GPT, config, m)
    tokenizer = PretrainedTokenizer.from_hf_dir(source, vocab_size=config.vocab_size)
    notes = [] if tokenizer else ["the source has no tokenizer (tokenizer.json, or vocab.json + merges.txt): "
                                  "the run takes token ids, and `generate --prompt` needs a tokenizer"]
    return Converted(model.eval(), tokenizer, notes)


@register(gguf=["gpt2"])
def convert_gpt2_gguf(path: Path, *, reader=None, keep_blocks: bool = True) -> Converted:
    """A tokennet GPT (and its tokenizer) from a GGUF file of llama.cpp's ``gpt2`` architecture.

    Returns:
        ``(model, tokenizer, notes)``.
    """
    reader = reader or read_gguf(path)
    for key in reader.fields:
        if key.startswith("gpt2.") and key[len("gpt2."):] not in GGUF_GPT2_KEYS:
            raise ConfigError(f"{path}: GGUF field {key!r} is not known to the gpt2 converter; nothing was written")
    fields = {k: field(reader, "gpt2." + k) for k in GGUF_GPT2_KEYS}
    check_numbers(path, "gpt2", fields, counts=tuple(k for k in GGUF_GPT2_KEYS if k != "attention.layer_norm_epsilon"),
                  reals=("attention.layer_norm_epsilon",))
    weights, notes = load_tensors(reader, path, keep_blocks=keep_blocks)
    dim, heads = fields["embedding_length"], fields["attention.head_count"]
    emb = weights.get("token_embd.weight")
    if emb is None or dim is None or heads is None or fields["block_count"] is None:
        raise DataError(f"{path} lacks the gpt2 fields or the token embedding the converter needs; nothing was written")
    check_block_count(path, weights, fields["block_count"])
    vocab = fields["vocab_size"] or (emb.qs if hasattr(emb, "qs") else emb).shape[0]
    hidden = fields["feed_forward_length"] or 4 * dim
    kv_heads = fields["attention.head_count_kv"]
    biases = [n for n in weights if n.endswith(".bias")]
    # llama.cpp's GPT-2 graph needs biases; a model without them (tokennet's bias=False) is written with zeros
    bias = not biases or any(bool(dense(weights[n]).any()) for n in biases)
    config = GPTConfig(vocab_size=vocab, block_size=fields["context_length"], dim=dim,
                       num_layers=fields["block_count"], num_heads=heads,
                       num_kv_heads=None if kv_heads in (None, heads) else kv_heads, mlp_ratio=hidden / dim,
                       position="learned", tie_weights="output.weight" not in weights, bias=bias,
                       activation="gelu_tanh", norm_eps=f32(fields["attention.layer_norm_epsilon"]) or 1e-5)
    if round(config.mlp_ratio * dim) != hidden:
        raise ConfigError(f"feed_forward_length {hidden} cannot be expressed as mlp_ratio·{dim}; nothing was written")
    m = NameMap(weights, str(path))
    parts = ("weight", "bias") if bias else ("weight",)
    if not bias:
        m.used.update(biases)  # all zero: the same function as no bias
    m.put("tok_emb.weight", "token_embd.weight")
    m.put("pos_emb.weight", "position_embd.weight")
    for i in range(config.num_layers):
        for ours, theirs in GGUF_LAYER_NAMES.items():
            for part in parts:
                m.put(f"decoder.blocks.{i}.{ours}.{part}", f"blk.{i}.{theirs}.{part}")
    for part in parts:
        m.put(f"decoder.norm.{part}", f"output_norm.{part}")
    m.put("lm_head.weight", "token_embd.weight" if config.tie_weights else "output.weight")
    for k, v in m.state.items():  # only matrices stay blocks: tokennet's position table and norms are float
        if k == "pos_emb.weight" or "norm" in k or not k.endswith(".weight"):
            m.state[k] = dense(v)
    config = config.replace(quantized=block_formats(m.state, config.num_layers))
    model = build_checked(GPT, config, m)
    return Converted(model.eval(), gguf_tokenizer(reader, path, config.vocab_size), notes)
