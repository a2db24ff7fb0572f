"""Hugging Face ViT (``ViTForImageClassification``) → tokennet :class:`~tokennet.models.vit.ViT`.

Both are the ViT of Dosovitskiy et al. 2021 (https://arxiv.org/abs/2010.11929): conv patch
embedding, a <cls> token, learned positions, pre-norm blocks with the erf GELU, and a head of
LayerNorm + linear on the <cls> token. Hugging Face keeps Q, K and V as three ``nn.Linear``; tokennet
holds them as the rows of one ``qkv_proj`` ``[W_q; W_k; W_v]``, so they are concatenated. HF's
LayerNorm ε is 1e-12 (mapped onto ``norm_eps``).

Name map (``i`` = layer, ``L`` = ``vit.encoder.layer.i``)::

    vit.embeddings.cls_token                       → cls_token
    vit.embeddings.position_embeddings (1, 1+N, D) → pos_emb.weight (1+N, D)
    vit.embeddings.patch_embeddings.projection     → patch_embed
    L.layernorm_before / L.layernorm_after         → encoder.blocks.i.norm1 / norm2
    L.attention.attention.{query,key,value}        → encoder.blocks.i.attn.qkv_proj (rows stacked)
    L.attention.output.dense                       → encoder.blocks.i.attn.out_proj
    L.intermediate.dense / L.output.dense          → encoder.blocks.i.mlp.fc1 / fc2
    vit.layernorm                                  → head.norm
    classifier                                     → head.fc
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import DataError
from ..models.vit import ViT, ViTConfig
from .gguf_in import build_checked
from .hf import NameMap, check_fields, check_layer_count, read_safetensors
from .registry import Converted, register

__all__ = ["convert_vit"]


def vit_config(cfg: dict[str, Any], num_classes: int) -> ViTConfig:
    """Map an HF ``ViTConfig`` (as JSON) onto tokennet's :class:`ViTConfig`."""
    check_fields(
        cfg, "vit",
        mapped=("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "layer_norm_eps",
                "image_size", "patch_size", "num_channels"),
        required={"hidden_act": "gelu", "qkv_bias": True},
        # Dropout is training-time only; encoder_stride serves masked image modelling and the pooler a
        # ViTModel head, neither part of an image classifier.
        ignored=("hidden_dropout_prob", "attention_probs_dropout_prob", "encoder_stride", "pooler_act",
                 "pooler_output_size"),
    )
    dim = cfg.get("hidden_size", 768)
    return ViTConfig(
        image_size=cfg.get("image_size", 224), patch_size=cfg.get("patch_size", 16),
        in_channels=cfg.get("num_channels", 3), num_classes=num_classes, dim=dim,
        num_layers=cfg.get("num_hidden_layers", 12), num_heads=cfg.get("num_attention_heads", 12),
        mlp_ratio=cfg.get("intermediate_size", 3072) / dim, pool="cls", position="learned", patch_embed="conv",
        bias=True, norm_eps=float(cfg.get("layer_norm_eps", 1e-12)),
    )


@register(hf=[("vit", "ViTForImageClassification")])
def convert_vit(source: Path, cfg: dict[str, Any]) -> Converted:
    """Build a tokennet ViT holding the weights of the ``ViTForImageClassification`` checkpoint in ``source``."""
    tensors = read_safetensors(source)
    where = str(source / "model.safetensors")
    if "classifier.weight" not in tensors:
        raise DataError(f"{where} has no classifier.weight: not a ViTForImageClassification checkpoint; "
                        "nothing was written")
    config = vit_config(cfg, num_classes=tensors["classifier.weight"].shape[0])
    m = NameMap(tensors, where)
    check_layer_count(tensors, config.num_layers, where)  # before the loop below runs that many times
    emb = "vit.embeddings."
    m.put("cls_token", emb + "cls_token")
    m.put("pos_emb.weight", emb + "position_embeddings", lambda pos: pos[0])  # (1, 1+N, D) → (1+N, D)
    m.put("patch_embed.weight", emb + "patch_embeddings.projection.weight")
    m.put("patch_embed.bias", emb + "patch_embeddings.projection.bias")
    for i in range(config.num_layers):
        their_layer, our_block = f"vit.encoder.layer.{i}.", f"encoder.blocks.{i}."
        for part in ("weight", "bias"):
            m.put(f"{our_block}norm1.{part}", f"{their_layer}layernorm_before.{part}")
            m.put(f"{our_block}norm2.{part}", f"{their_layer}layernorm_after.{part}")
            m.put(f"{our_block}attn.qkv_proj.{part}",
                  [f"{their_layer}attention.attention.{n}.{part}" for n in ("query", "key", "value")],
                  lambda q, k, v: torch.cat([q, k, v]))  # (3D, D) or (3D,): [W_q; W_k; W_v]
            m.put(f"{our_block}attn.out_proj.{part}", f"{their_layer}attention.output.dense.{part}")
            m.put(f"{our_block}mlp.fc1.{part}", f"{their_layer}intermediate.dense.{part}")
            m.put(f"{our_block}mlp.fc2.{part}", f"{their_layer}output.dense.{part}")
    for part in ("weight", "bias"):
        m.put(f"head.norm.{part}", f"vit.layernorm.{part}")
        m.put(f"head.fc.{part}", f"classifier.{part}")
    model = build_checked(ViT, config, m, sizes="in config.json")  # names, shapes checked on meta first
    notes = []
    if (source / "preprocessor_config.json").is_file():
        notes.append("preprocessor_config.json was not imported: normalize images the way it says before "
                     "calling the model")
    return Converted(model.eval(), None, notes)
