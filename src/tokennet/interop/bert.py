"""BERT family (Hugging Face ``BertModel``, e.g. all-MiniLM-L6-v2) → tokennet :class:`TextEncoder`.

Name map (``i`` = layer, ``L`` = ``encoder.layer.i``)::

    embeddings.word_embeddings / position_embeddings / token_type_embeddings → tok_emb / pos_emb / type_emb
    embeddings.LayerNorm                       → emb_norm
    L.attention.self.{query,key,value}         → encoder.blocks.i.attn.qkv_proj (rows stacked)
    L.attention.output.dense                   → encoder.blocks.i.attn.out_proj
    L.attention.output.LayerNorm               → encoder.blocks.i.norm1   (post-norm: LN(x + Attn(x)))
    L.intermediate.dense / L.output.dense      → encoder.blocks.i.mlp.fc1 / fc2
    L.output.LayerNorm                         → encoder.blocks.i.norm2   (LN(x + MLP(x)))

``embeddings.position_ids`` is a buffer of 0..N−1 (derived); ``pooler.dense`` (BERT's tanh layer on
[CLS]) is not used by mean pooling and is reported in the notes, not imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import DataError
from ..models.text_encoder import TextEncoder, TextEncoderConfig
from ..tokens.pretrained import PretrainedTokenizer
from .gguf_in import build_checked
from .hf import NameMap, check_fields, check_layer_count, read_safetensors
from .registry import Converted, register

__all__ = ["convert_bert"]


@register(hf=[("bert", "BertModel")])
def convert_bert(source: Path, cfg: dict[str, Any]) -> Converted:
    """A tokennet text encoder holding the weights of the ``BertModel`` checkpoint in ``source``."""
    check_fields(
        cfg, "bert",
        mapped=("vocab_size", "max_position_embeddings", "type_vocab_size", "hidden_size", "num_hidden_layers",
                "num_attention_heads", "intermediate_size", "layer_norm_eps"),
        required={"hidden_act": "gelu", "position_embedding_type": "absolute", "add_cross_attention": False},
        # tie_word_embeddings concerns the masked-LM head, which a BertModel does not have.
        ignored=("attention_probs_dropout_prob", "hidden_dropout_prob", "classifier_dropout", "tie_word_embeddings"),
    )
    dim = cfg.get("hidden_size", 768)
    config = TextEncoderConfig(
        vocab_size=cfg.get("vocab_size", 30522), max_len=cfg.get("max_position_embeddings", 512),
        type_vocab_size=cfg.get("type_vocab_size", 2), dim=dim, num_layers=cfg.get("num_hidden_layers", 12),
        num_heads=cfg.get("num_attention_heads", 12), mlp_ratio=cfg.get("intermediate_size", 3072) / dim,
        norm_eps=float(cfg.get("layer_norm_eps", 1e-12)), pad_id=cfg.get("pad_token_id") or 0)
    tensors = read_safetensors(source)
    prefix = "bert." if any(k.startswith("bert.") for k in tensors) else ""
    pooler = sorted(k for k in tensors if k.startswith(prefix + "pooler."))
    m = NameMap(tensors, str(source / "model.safetensors"),
                derived=rf"{prefix}embeddings\.position_ids|{prefix}pooler\..*")
    check_layer_count(tensors, config.num_layers, m.where)  # before the loop below runs that many times
    emb = prefix + "embeddings."
    m.put("tok_emb.weight", emb + "word_embeddings.weight")
    m.put("pos_emb.weight", emb + "position_embeddings.weight")
    m.put("type_emb.weight", emb + "token_type_embeddings.weight")
    for part in ("weight", "bias"):
        m.put(f"emb_norm.{part}", f"{emb}LayerNorm.{part}")
    for i in range(config.num_layers):
        their_layer, our_block = f"{prefix}encoder.layer.{i}.", f"encoder.blocks.{i}."
        for part in ("weight", "bias"):
            m.put(f"{our_block}attn.qkv_proj.{part}",
                  [f"{their_layer}attention.self.{n}.{part}" for n in ("query", "key", "value")],
                  lambda q, k, v: torch.cat([q, k, v]))  # [W_q; W_k; W_v]
            m.put(f"{our_block}attn.out_proj.{part}", f"{their_layer}attention.output.dense.{part}")
            m.put(f"{our_block}norm1.{part}", f"{their_layer}attention.output.LayerNorm.{part}")
            m.put(f"{our_block}mlp.fc1.{part}", f"{their_layer}intermediate.dense.{part}")
            m.put(f"{our_block}mlp.fc2.{part}", f"{their_layer}output.dense.{part}")
            m.put(f"{our_block}norm2.{part}", f"{their_layer}output.LayerNorm.{part}")
    model = build_checked(TextEncoder, config, m, sizes="in config.json")  # names, shapes checked on meta first
    notes = [f"not imported: {', '.join(pooler)} (BERT's [CLS] pooler; sentence embeddings use mean pooling)"] \
        if pooler else []
    tokenizer = None
    if (source / "tokenizer.json").is_file():
        tokenizer = PretrainedTokenizer.from_file(source / "tokenizer.json")
        if tokenizer.vocab_size != config.vocab_size:
            raise DataError(f"{source / 'tokenizer.json'} has {tokenizer.vocab_size} tokens but the model "
                            f"{config.vocab_size}; nothing was written")
    else:
        notes.append("the source has no tokenizer.json: the run takes token ids, and `embed` needs a tokenizer")
    return Converted(model.eval(), tokenizer, notes)
