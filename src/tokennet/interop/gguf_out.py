"""A ``gpt`` run as a GGUF file that llama.cpp runs, written the way llama.cpp's own ``convert_hf_to_gguf.py`` writes.

Two of llama.cpp's architectures cover tokennet's GPT configurations that it can run unchanged:

=============  ==============================================================  =================================
architecture   tokennet configuration                                          tensors (``i`` = layer)
=============  ==============================================================  =================================
``gpt2``       learned positions, LayerNorm, GELU (tanh) MLP                   ``token_embd position_embd
                                                                               blk.i.{attn_norm, attn_qkv,
                                                                               attn_output, ffn_norm, ffn_up,
                                                                               ffn_down} output_norm [output]``
``llama``      RoPE, RMSNorm, SwiGLU MLP, no biases (grouped-query heads ok)   ``token_embd blk.i.{attn_norm,
                                                                               attn_q, attn_k, attn_v,
                                                                               attn_output, ffn_norm, ffn_gate,
                                                                               ffn_up, ffn_down} output_norm
                                                                               [output]``
=============  ==============================================================  =================================

As in the converter: ``nn.Linear``'s ``(out, in)`` layout is GGUF's; Llama's query and key rows are permuted
from the rotate-half pairing to llama.cpp's interleaved pairs (:func:`~.llama.permute`); a tied LM head is
not written (llama.cpp reuses ``token_embd``); the file type applies to matrices, while vectors, norms,
biases and GPT-2's position table stay float32; a matrix whose width is not a multiple of 32 falls back from
Q8_0 to float16. Weights the run holds in GGUF blocks (an imported file's Q4_1 or Q4_K, say) are written as they are,
bit for bit. A GPT-2-style model without biases gets zero biases (llama.cpp's GPT-2 graph requires them).

The tokenizer goes into ``tokenizer.ggml.*`` as a byte-level BPE vocabulary (``gpt2`` model): tokens in id
order, their types (control for special tokens, user-defined for other added tokens, as llama.cpp's converter
writes them), merges, the special ids and llama.cpp's name of the pre-tokenizer (GPT-2's regex: ``gpt-2``;
tokennet's ``gpt4`` pattern, cl100k's, which llama.cpp splits with its Llama-3 regex: ``llama-bpe``; SmolLM's
digits-then-GPT-2: ``smollm``), and a chat template where the run has one. Anything else — not a language
model, another configuration, a character tokenizer — is refused in one line before anything is written.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..errors import ConfigError
from ..fileio import temp_name_beside
from ..layers.blockquant import BlockEmbedding, BlockLinear
from .gguf_in import LLAMA3_PATTERN, Blocks
from .gpt2 import GGUF_LAYER_NAMES
from .llama import LAYER_NAMES, permute

__all__ = ["write_gguf", "gguf_arch", "GGUFFile", "FILE_TYPES"]

FILE_TYPES = ("f32", "f16", "q8_0")
_TYPE_NAMES = {"q8_0": "Q8_0", "q4_0": "Q4_0", "q4_1": "Q4_1", "q5_0": "Q5_0", "q4_k": "Q4_K", "q5_k": "Q5_K",
               "q6_k": "Q6_K"}


@dataclass
class GGUFFile:
    """What :func:`write_gguf` wrote: the file, its architecture and file type, each tensor's GGUF type, notes."""

    path: Path
    arch: str
    file_type: str
    tensor_types: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def gguf_arch(config) -> str:
    """``"gpt2"`` or ``"llama"``: the llama.cpp architecture that computes what this GPT config computes.

    Raises:
        ConfigError: naming the first setting neither architecture has.
    """
    if getattr(config, "family", None) != "gpt":
        raise ConfigError(f"GGUF export is for gpt runs (language models); this is a {config.family} run")
    if not getattr(config, "value_proj", True):  # W_v = I: the file format needs a v weight; we do not invent one
        raise ConfigError("GGUF export: value_proj=false (W_v = I) has no v_proj weight in that format; export ONNX "
                          "(the graph needs none) or train with value_proj=true; nothing was written")
    common = {"mixer": "attention", "qk_norm": False, "norm_placement": "pre", "embedding_scale": 1.0,
              "attention_windows": None, "head_dim": None}  # Gemma's and Mistral's settings are not exported
    common = {k: v for k, v in common.items() if hasattr(config, k)}
    styles = {
        "gpt2": {"position": "learned", "norm_layer": "layernorm", "gated_mlp": False},
        "llama": {"position": "rope", "norm_layer": "rmsnorm", "gated_mlp": True, "activation": "silu",
                  "bias": False},
    }
    for k, v in common.items():
        if getattr(config, k) != v:
            raise ConfigError(f"GGUF export: {k}={getattr(config, k)!r} has no llama.cpp equivalent (needs {k}={v!r}); "
                              "nothing was written")
    arch = "llama" if config.position == "rope" else "gpt2"
    if getattr(config, "qkv_bias", False) and arch == "llama":
        arch = "qwen2"  # Llama with biases on q, k, v
    for k, v in styles["llama" if arch == "qwen2" else arch].items():
        if getattr(config, k) != v:
            want = ", ".join(f"{key}={value!r}" for key, value in styles["llama" if arch == "qwen2" else arch].items())
            raise ConfigError(f"GGUF export: {k}={getattr(config, k)!r} fits neither llama.cpp architecture "
                              f"({arch} needs {want}); nothing was written")
    if arch == "gpt2" and config.activation not in ("gelu_tanh", "gelu"):
        raise ConfigError(f"GGUF export: activation={config.activation!r} has no llama.cpp equivalent in the gpt2 "
                          "architecture (GELU); nothing was written")
    return arch


# -- weights --------------------------------------------------------------------------------------------------
def _weight(module: nn.Module):
    """A module's weight as llama.cpp will read it: a float tensor, or the :class:`Blocks` it holds."""
    if isinstance(module, (BlockLinear, BlockEmbedding)):
        return Blocks(module.fmt, module.qs, module.d, module.m)
    return module.weight.detach().float()


def _rows(w, index: Tensor):
    return w.rows(index) if isinstance(w, Blocks) else w[index]


def _split_rows(w, sizes: list[int]) -> list:
    starts = np.cumsum([0, *sizes])
    return [_rows(w, torch.arange(start, stop)) for start, stop in zip(starts[:-1], starts[1:])]


def _permute_rows(w, heads: int):
    """llama.cpp's Q/K permutation of a dense matrix, or of a matrix's rows of blocks."""
    if isinstance(w, Tensor):
        return permute(w, heads)
    return w.rows(permute(torch.arange(w.qs.shape[0])[:, None], heads)[:, 0])


def _tensors(model: nn.Module, arch: str) -> dict[str, Any]:
    """GGUF name → weight (float tensor or :class:`Blocks`), in the converter's order."""
    cfg = model.config
    out: dict[str, Any] = {"token_embd.weight": _weight(model.tok_emb)}
    if arch == "gpt2":
        out["position_embd.weight"] = model.pos_emb.weight.detach().float()
    for i, blk in enumerate(model.decoder.blocks):
        prefix = f"blk.{i}."
        mods = dict(blk.named_modules())
        if arch == "gpt2":
            for ours, theirs in GGUF_LAYER_NAMES.items():
                mod = mods[ours]
                out[prefix + theirs + ".weight"] = _weight(mod)
                n = (mod.normalized_shape[0] if isinstance(mod, nn.LayerNorm) else mod.out_features)
                bias = getattr(mod, "bias", None)
                out[prefix + theirs + ".bias"] = torch.zeros(n) if bias is None else bias.detach().float()
        else:
            H, Hkv, E = cfg.num_heads, cfg.num_kv_heads or cfg.num_heads, cfg.dim // cfg.num_heads
            q, k, v = _split_rows(_weight(blk.attn.qkv_proj), [H * E, Hkv * E, Hkv * E])
            out[prefix + "attn_norm.weight"] = _weight(blk.norm1)
            if arch == "qwen2":  # llama.cpp's qwen2 graph rotates halves, as tokennet does: no permutation
                out[prefix + "attn_q.weight"], out[prefix + "attn_k.weight"], out[prefix + "attn_v.weight"] = q, k, v
                q_bias, k_bias, v_bias = blk.attn.qkv_proj.bias.detach().float().split([H * E, Hkv * E, Hkv * E])
                out[prefix + "attn_q.bias"], out[prefix + "attn_k.bias"] = q_bias, k_bias
                out[prefix + "attn_v.bias"] = v_bias
            else:
                out[prefix + "attn_q.weight"] = _permute_rows(q, H)
                out[prefix + "attn_k.weight"] = _permute_rows(k, Hkv)
                out[prefix + "attn_v.weight"] = v
            for ours, (_, theirs) in LAYER_NAMES.items():
                if ours != "norm1.weight":
                    out[prefix + theirs] = _weight(mods[ours.removesuffix(".weight")])
    out["output_norm.weight"] = _weight(model.decoder.norm)
    if arch == "gpt2":
        bias = model.decoder.norm.bias
        out["output_norm.bias"] = torch.zeros(cfg.dim) if bias is None else bias.detach().float()
    if not cfg.tie_weights:
        out["output.weight"] = _weight(model.lm_head)
    return out


def _raw_blocks(b: Blocks) -> np.ndarray:
    """The bytes a GGUF file holds for blocks: per block ``d`` (f16), [``m`` (f16)], ``qs``; ``(N, bytes per row)``."""
    if b.d is None:  # Q5_0, K-quants: qs is already the file's bytes
        return b.qs.contiguous().numpy()
    n, groups = b.d.shape
    parts = [b.d.contiguous().view(torch.uint8).view(n, groups, 2)]
    if b.m is not None:
        parts.append(b.m.contiguous().view(torch.uint8).view(n, groups, 2))
    parts.append(b.qs.contiguous().view(torch.uint8).view(n, groups, -1))
    return torch.cat(parts, -1).reshape(n, -1).numpy()


def _encode(name: str, w, file_type: str, gguf) -> tuple[np.ndarray, Any, str]:
    """``(data, raw_dtype, type name)`` for one tensor, by the converter's rules."""
    Q = gguf.GGMLQuantizationType
    if isinstance(w, Blocks):
        return _raw_blocks(w), Q[_TYPE_NAMES[w.fmt]], _TYPE_NAMES[w.fmt]
    array = w.numpy().astype(np.float32)
    if (array.ndim <= 1 or name.endswith("_norm.weight") or name == "position_embd.weight"
            or not name.endswith(".weight")):
        return array, None, "F32"
    if file_type == "f32":
        return array, None, "F32"
    if file_type == "q8_0" and array.shape[-1] % 32 == 0:
        return gguf.quants.quantize(array, Q.Q8_0), Q.Q8_0, "Q8_0"
    return array.astype(np.float16), None, "F16"  # f16, or Q8_0's fallback for a width blocks cannot take


# -- tokenizer ------------------------------------------------------------------------------------------------
def _pre_name(pre: dict | None) -> str | None:
    """llama.cpp's name for a Hugging Face pre-tokenizer (JSON), or None if it has none."""
    from ..tokens.text import GPT2_PATTERN, GPT4_PATTERN

    if not pre:
        return None
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
        return "gpt-2"
    parts = pre.get("pretokenizers") or []
    kinds = [part.get("type") for part in parts]
    if kinds == ["Digits", "ByteLevel"] and parts[0].get("individual_digits"):
        return "smollm"
    if kinds[:1] == ["Split"] and kinds[-1:] == ["ByteLevel"] and not parts[-1].get("use_regex", True):
        # tokennet's own BPE adds a second split that caps a pre-token at 256 characters (a long run of one
        # character): llama.cpp has no cap, which changes nothing below that length
        middle = [(part.get("pattern") or {}).get("Regex") for part in parts[1:-1]]
        if any(pattern != r"[\s\S]{1,256}" for pattern in middle):
            return None
        regex = (parts[0].get("pattern") or {}).get("Regex")
        if regex == GPT2_PATTERN:
            return "gpt-2"
        if regex in (GPT4_PATTERN, LLAMA3_PATTERN):
            return "llama-bpe"
    return None


def _vocab(tokenizer, vocab_size: int) -> dict[str, Any]:
    """The ``tokenizer.*`` fields of a byte-level BPE tokenizer (tokennet's own, or one imported)."""
    kind = getattr(tokenizer, "kind", None)
    if kind not in ("bpe", "pretrained"):
        raise ConfigError(f"GGUF export needs a byte-level BPE tokenizer; this run's tokenizer is "
                          f"{kind or 'missing'} (train with the gpt recipe's BPE tokenizer); nothing was written")
    data = tokenizer.to_dict()
    engine = data if kind == "bpe" else data["engine"]
    meta = {"bos_id": 1, "eos_id": 2, "pad_id": 0, "unk_id": 3} if kind == "bpe" else data["tokennet"]
    model = engine.get("model") or {}
    if model.get("type") != "BPE" or (engine.get("decoder") or {}).get("type") != "ByteLevel":
        raise ConfigError("GGUF export needs a byte-level BPE tokenizer; this one is "
                          f"{model.get('type')} without a byte-level decoder; nothing was written")
    pre = _pre_name(engine.get("pre_tokenizer"))
    if pre is None:
        raise ConfigError("GGUF export: the tokenizer's pre-tokenizer has no llama.cpp name (supported: GPT-2's "
                          "regex, cl100k's, SmolLM's); nothing was written")
    vocab = dict(model["vocab"])
    special = set(range(4)) if kind == "bpe" else set()
    added = set()  # added tokens that are not special: llama.cpp's USER_DEFINED (matched whole, printed as text)
    for t in engine.get("added_tokens") or []:
        vocab[t["content"]] = t["id"]
        (special if t.get("special") else added).add(t["id"])
    if max(vocab.values()) >= vocab_size:
        raise ConfigError(f"GGUF export: the tokenizer has ids up to {max(vocab.values())} but the model only "
                          f"{vocab_size} rows; nothing was written")
    by_id = {i: t for t, i in vocab.items()}
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(vocab_size)]  # the converter's filler for unused rows
    # llama.cpp's token types, as its converter writes them: 3 control, 4 user-defined, 1 normal, 5 unused
    types = [3 if i in special else 4 if i in added else 1 if i in by_id else 5 for i in range(vocab_size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    fields = {"model": "gpt2", "pre": pre, "tokens": tokens, "types": types, "merges": merges,
              "ids": {k: meta.get(k) for k in ("bos_id", "eos_id", "pad_id", "unk_id")},
              "chat_template": getattr(tokenizer, "chat_template", None)}
    return fields


# -- the file -------------------------------------------------------------------------------------------------
def write_gguf(model: nn.Module, tokenizer, out: str | Path, *, file_type: str = "f16", name: str = "tokennet",
               ) -> GGUFFile:
    """Write ``model`` (a tokennet GPT) and its tokenizer as the GGUF file ``out``; see the module docstring.

    Everything is checked before the file is opened; it is written under a temporary name and renamed, so a
    failure leaves nothing behind.

    Args:
        model: a GPT in GPT-2 or Llama configuration.
        tokenizer: its byte-level BPE tokenizer.
        out: the file to write.
        file_type: ``"f32"``, ``"f16"`` or ``"q8_0"`` for the matrices (blocks the model holds stay as they are).
        name: ``general.name``.
    """
    try:
        import gguf
    except ImportError:
        raise ConfigError("GGUF export needs the gguf package: pip install gguf") from None
    if file_type not in FILE_TYPES:
        raise ConfigError(f"GGUF file type must be one of {list(FILE_TYPES)}, got {file_type!r}")
    cfg = model.config
    arch = gguf_arch(cfg)
    notes = []
    if arch == "gpt2" and cfg.activation == "gelu":
        notes.append("llama.cpp's gpt2 graph computes GELU with the tanh approximation; this model was trained with "
                     "the erf GELU, so llama.cpp's logits differ slightly (activation='gelu_tanh' matches exactly)")
    vocab = _vocab(tokenizer, cfg.vocab_size)
    tensors = _tensors(model.eval(), arch)
    encoded = {n: _encode(n, weight, file_type, gguf) for n, weight in tensors.items()}
    out = Path(out)
    tmp = temp_name_beside(out, "tmp")
    quiet = logging.getLogger("gguf")  # the writer logs each file it writes at INFO
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        weight = gguf.GGUFWriter(str(tmp), arch)
        weight.add_type(gguf.GGUFType.MODEL)
        weight.add_name(name)
        _add_shape(weight, cfg, arch)
        weight.add_file_type(_file_type(tensors, encoded, gguf))
        _add_vocab(weight, vocab)
        weight.add_quantization_version(gguf.GGML_QUANT_VERSION)
        for n, (data, raw, _) in encoded.items():
            weight.add_tensor(n, data, raw_dtype=raw)
        weight.write_header_to_file()
        weight.write_kv_data_to_file()
        weight.write_tensors_to_file()
        weight.close()
        tmp.replace(out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        quiet.setLevel(level)
    return GGUFFile(out, arch, file_type, {n: t for n, (_, _, t) in encoded.items()}, notes)


def _add_shape(w, c, arch: str) -> None:
    """The hyperparameters llama.cpp builds its graph from: layers, context, widths, heads, norms, rotary base."""
    w.add_block_count(c.num_layers)
    w.add_context_length(c.block_size)
    w.add_embedding_length(c.dim)
    w.add_feed_forward_length(round(c.mlp_ratio * c.dim))
    w.add_head_count(c.num_heads)
    if arch == "gpt2":
        if c.num_kv_heads not in (None, c.num_heads):
            w.add_head_count_kv(c.num_kv_heads)
        w.add_layer_norm_eps(c.norm_eps)
        return
    w.add_head_count_kv(c.num_kv_heads or c.num_heads)
    w.add_rope_freq_base(c.rope_base)
    w.add_layer_norm_rms_eps(c.norm_eps)
    w.add_vocab_size(c.vocab_size)
    w.add_rope_dimension_count(c.dim // c.num_heads)


def _file_type(tensors: dict, encoded: dict, gguf):
    """``general.file_type``: the type of most matrices (blocks the model holds count as matrices)."""
    kinds = [t for n, (_, _, t) in encoded.items()
             if isinstance(tensors[n], Blocks) or (tensors[n].dim() == 2 and n != "position_embd.weight")]
    main = max(set(kinds), key=kinds.count)
    ftypes = {"F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16,
              "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
              "Q4_1": gguf.LlamaFileType.MOSTLY_Q4_1, "Q5_0": gguf.LlamaFileType.MOSTLY_Q5_0,
              "Q4_K": gguf.LlamaFileType.MOSTLY_Q4_K_M, "Q5_K": gguf.LlamaFileType.MOSTLY_Q5_K_M,
              "Q6_K": gguf.LlamaFileType.MOSTLY_Q6_K}
    return ftypes[main]


def _add_vocab(w, vocab: dict) -> None:
    """The tokenizer: model, pre-tokenizer, tokens, their types, merges, special ids and the chat template."""
    w.add_tokenizer_model(vocab["model"])
    w.add_tokenizer_pre(vocab["pre"])
    w.add_token_list(vocab["tokens"])
    w.add_token_types(vocab["types"])
    w.add_token_merges(vocab["merges"])
    ids = vocab["ids"]
    for key, add in (("bos_id", w.add_bos_token_id), ("eos_id", w.add_eos_token_id),
                     ("unk_id", w.add_unk_token_id), ("pad_id", w.add_pad_token_id)):
        if ids.get(key) is not None:
            add(int(ids[key]))
    w.add_add_bos_token(False)  # tokennet does not prepend <bos> when it generates
    if vocab["chat_template"]:
        w.add_chat_template(vocab["chat_template"])
