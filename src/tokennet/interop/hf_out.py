"""A ``gpt`` run as a Hugging Face directory: what ``AutoModelForCausalLM`` and ``AutoTokenizer`` load.

The inverse of the importers (:mod:`.gpt2`, :mod:`.llama`), for the two configurations ``transformers`` has
a class for:

============  ===========================================================  ========================================
class         tokennet configuration                                       layout
============  ===========================================================  ========================================
``GPT2``      learned positions, LayerNorm, GELU (tanh or erf) / ReLU MLP   ``Conv1D`` weights: ``(in, out)``, so
              (no grouped-query heads)                                      every projection is transposed; a model
                                                                            without biases gets zero biases
``Llama``     RoPE, RMSNorm, SwiGLU MLP, no biases (grouped-query ok)       ``qkv_proj`` rows split into
                                                                            ``q_proj``, ``k_proj``, ``v_proj``
                                                                            (same rotate-half pairing: no
                                                                            permutation)
============  ===========================================================  ========================================

The directory holds ``config.json``, ``model.safetensors`` (float32; weights held in GGUF blocks are
dequantized), ``generation_config.json`` and the tokenizer: ``tokenizer.json`` (the Hugging Face tokenizer
JSON tokennet's BPE already is), ``tokenizer_config.json`` (special tokens, chat template) and
``special_tokens_map.json``. Nothing here imports ``transformers``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import ConfigError
from ..fileio import swap_into_place, temp_dir_beside
from ..layers.blockquant import BlockEmbedding, BlockLinear
from ..layers.quantize import _to_float

__all__ = ["write_hf", "hf_class"]

_ACT = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


def hf_class(config) -> str:
    """``"gpt2"`` or ``"llama"``: the transformers model class for this GPT config, or a one-line ConfigError."""
    if getattr(config, "family", None) != "gpt":
        raise ConfigError(f"Hugging Face export is for gpt runs (language models); this is a {config.family} run")
    if not getattr(config, "value_proj", True):  # W_v = I: the file format needs a v weight; we do not invent one
        raise ConfigError("Hugging Face export: value_proj=false (W_v = I) has no v_proj weight in that format; "
                          "export ONNX (the graph needs none) or train with value_proj=true; nothing was written")
    plain = {"norm_placement": "pre", "embedding_scale": 1.0, "attention_windows": None, "head_dim": None}
    odd = [k for k, v in plain.items() if getattr(config, k, v) != v]  # Gemma's and Mistral's: not exported
    if config.mixer != "attention" or config.qk_norm or odd:
        bad = "mixer" if config.mixer != "attention" else "qk_norm" if config.qk_norm else odd[0]
        raise ConfigError(f"Hugging Face export: {bad}={getattr(config, bad)!r} has no GPT-2 or Llama equivalent; "
                          "nothing was written")
    if config.position == "rope":
        want = {"norm_layer": "rmsnorm", "gated_mlp": True, "activation": "silu", "bias": False}
        kind = "llama"
    elif config.position == "learned":
        want = {"norm_layer": "layernorm", "gated_mlp": False, "num_kv_heads": None}
        kind = "gpt2"
        if config.activation not in _ACT:
            raise ConfigError(f"Hugging Face export: activation={config.activation!r} is not one of GPT-2's "
                              f"({', '.join(_ACT)}); nothing was written")
    else:
        raise ConfigError(f"Hugging Face export: position={config.position!r} is neither GPT-2's (learned) nor "
                          "Llama's (rope); nothing was written")
    for k, v in want.items():
        got = getattr(config, k)
        if k == "num_kv_heads" and got == config.num_heads:
            continue
        if got != v:
            need = ", ".join(f"{key}={value!r}" for key, value in want.items())
            raise ConfigError(f"Hugging Face export: {k}={got!r} does not fit {kind} ({need}); nothing was written")
    return kind


def _float_model(model: nn.Module) -> nn.Module:
    """The model itself, or a copy with its GGUF blocks dequantized to float32."""
    if not any(isinstance(m, (BlockLinear, BlockEmbedding)) for m in model.modules()):
        return model
    import copy

    from ..layers.quantize import _share_tensors

    out = copy.deepcopy(model, _share_tensors(model))
    _to_float(out)
    return out


def _gpt2(model: nn.Module) -> tuple[dict[str, Any], dict[str, Tensor]]:
    config = model.config
    hidden = round(config.mlp_ratio * config.dim)
    cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": config.vocab_size,
           "n_positions": config.block_size, "n_embd": config.dim, "n_layer": config.num_layers,
           "n_head": config.num_heads,
           "n_inner": hidden, "activation_function": _ACT[config.activation], "layer_norm_epsilon": config.norm_eps,
           "tie_word_embeddings": config.tie_weights, "attn_pdrop": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0}
    state = {"transformer.wte.weight": model.tok_emb.weight, "transformer.wpe.weight": model.pos_emb.weight}

    def bias(mod, n):
        own_bias = getattr(mod, "bias", None)
        return torch.zeros(n) if own_bias is None else own_bias

    for i, blk in enumerate(model.decoder.blocks):
        prefix = f"transformer.h.{i}."
        for ours, theirs in ((blk.norm1, "ln_1"), (blk.norm2, "ln_2")):
            state[prefix + theirs + ".weight"], state[prefix + theirs + ".bias"] = ours.weight, bias(ours, config.dim)
        for ours, theirs in ((blk.attn.qkv_proj, "attn.c_attn"), (blk.attn.out_proj, "attn.c_proj"),
                             (blk.mlp.fc1, "mlp.c_fc"), (blk.mlp.fc2, "mlp.c_proj")):
            state[prefix + theirs + ".weight"] = ours.weight.T  # Conv1D: (in, out)
            state[prefix + theirs + ".bias"] = bias(ours, ours.out_features)
    state["transformer.ln_f.weight"], state["transformer.ln_f.bias"] = (model.decoder.norm.weight,
                                                                        bias(model.decoder.norm, config.dim))
    if not config.tie_weights:
        state["lm_head.weight"] = model.lm_head.weight
    return cfg, state


def _llama(model: nn.Module) -> tuple[dict[str, Any], dict[str, Tensor]]:
    config = model.config
    H, Hkv, E = config.num_heads, config.num_kv_heads or config.num_heads, config.dim // config.num_heads
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": config.vocab_size,
           "max_position_embeddings": config.block_size, "hidden_size": config.dim,
           "intermediate_size": round(config.mlp_ratio * config.dim), "num_hidden_layers": config.num_layers,
           "num_attention_heads": H, "num_key_value_heads": Hkv, "head_dim": E, "hidden_act": "silu",
           "rms_norm_eps": config.norm_eps, "rope_theta": config.rope_base, "tie_word_embeddings": config.tie_weights,
           "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0}
    state = {"model.embed_tokens.weight": model.tok_emb.weight}
    for i, blk in enumerate(model.decoder.blocks):
        prefix = f"model.layers.{i}."
        q, k, v = blk.attn.qkv_proj.weight.split([H * E, Hkv * E, Hkv * E])
        state.update({prefix + "input_layernorm.weight": blk.norm1.weight, prefix + "self_attn.q_proj.weight": q,
                   prefix + "self_attn.k_proj.weight": k, prefix + "self_attn.v_proj.weight": v,
                   prefix + "self_attn.o_proj.weight": blk.attn.out_proj.weight,
                   prefix + "post_attention_layernorm.weight": blk.norm2.weight,
                   prefix + "mlp.gate_proj.weight": blk.mlp.gate.weight,
                   prefix + "mlp.up_proj.weight": blk.mlp.fc1.weight,
                   prefix + "mlp.down_proj.weight": blk.mlp.fc2.weight})
    state["model.norm.weight"] = model.decoder.norm.weight
    if not config.tie_weights:
        state["lm_head.weight"] = model.lm_head.weight
    return cfg, state


def _qwen2(model: nn.Module, cfg: dict[str, Any], sd: dict[str, Tensor]) -> None:
    """A Llama directory made Qwen2's (``qkv_bias``): its config, and the q, k, v biases (in place)."""
    config = model.config
    H, Hkv, E = config.num_heads, config.num_kv_heads or config.num_heads, config.dim // config.num_heads
    for k in ("attention_bias", "mlp_bias", "head_dim"):
        cfg.pop(k)
    cfg.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2", use_sliding_window=False)
    for i, blk in enumerate(model.decoder.blocks):
        q, k, v = blk.attn.qkv_proj.bias.split([H * E, Hkv * E, Hkv * E])
        prefix = f"model.layers.{i}.self_attn."
        sd.update({prefix + "q_proj.bias": q, prefix + "k_proj.bias": k, prefix + "v_proj.bias": v})


def _tokenizer_files(tokenizer, block_size: int) -> dict[str, Any]:
    """``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json`` of a BPE tokenizer."""
    kind = getattr(tokenizer, "kind", None)
    if kind not in ("bpe", "pretrained"):
        raise ConfigError(f"Hugging Face export needs a BPE tokenizer (tokennet's own or an imported one); this "
                          f"run's is {kind or 'missing'}; nothing was written")
    data = tokenizer.to_dict()
    engine = data if kind == "bpe" else data["engine"]
    vocab = {**engine["model"]["vocab"], **{t["content"]: t["id"] for t in engine.get("added_tokens") or []}}
    name = {i: t for t, i in vocab.items()}
    ids = {"bos_id": 1, "eos_id": 2, "pad_id": 0, "unk_id": 3} if kind == "bpe" else data["tokennet"]
    special = {f"{k[:-3]}_token": name[ids[k]] for k in ("bos_id", "eos_id", "pad_id", "unk_id")
               if ids.get(k) is not None}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": block_size,
              "clean_up_tokenization_spaces": False, "add_bos_token": False, **special}
    template = getattr(tokenizer, "chat_template", None)
    if template:
        config["chat_template"] = template
    return {"tokenizer.json": engine, "tokenizer_config.json": config, "special_tokens_map.json": special}


def write_hf(model: nn.Module, tokenizer, out: str | Path) -> list[Path]:
    """Write ``model`` (a tokennet GPT) and its tokenizer as the Hugging Face directory ``out``; returns the files.

    Everything is checked first; the directory is written beside ``out`` under a temporary name and renamed,
    so a failure leaves nothing behind. ``out`` must not exist (the caller swaps the result in for an old one).
    """
    from safetensors.torch import save_file

    kind = hf_class(model.config)
    files = _tokenizer_files(tokenizer, model.config.block_size)
    model = _float_model(model)
    cfg, state = (_gpt2 if kind == "gpt2" else _llama)(model)
    if getattr(model.config, "qkv_bias", False):
        _qwen2(model, cfg, state)
    tok = tokenizer.to_dict()
    ids = {"bos_id": 1, "eos_id": 2, "pad_id": 0} if tokenizer.kind == "bpe" else tok["tokennet"]
    for k in ("bos", "eos", "pad"):
        if ids.get(f"{k}_id") is not None:
            cfg[f"{k}_token_id"] = int(ids[f"{k}_id"])
    cfg["torch_dtype"] = "float32"
    gen = {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in cfg}
    out = Path(out)
    if out.exists() or out.is_symlink():
        raise FileExistsError(f"{out} exists; write_hf writes a new directory (nothing was written)")
    tmp = temp_dir_beside(out, "new")
    try:
        tensors = {k: v.detach().float().contiguous().clone() for k, v in state.items()}  # no shared storage
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
        for name, content in files.items():
            (tmp / name).write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n")
        swap_into_place(tmp, out)  # ``out`` is absent (checked above): a plain rename
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sorted(out.iterdir())
