"""Reading a Hugging Face checkpoint directory: its ``config.json``, its safetensors, and a strict name map.

Every converter in :mod:`tokennet.interop` goes through here, so the rules hold for every family:

- a config field either maps onto a tokennet config field, is known not to change the function at
  inference (dropout rates, token ids, bookkeeping), or must hold the value tokennet implements; any
  other field stops the import with one line naming it;
- every foreign tensor is consumed by the name map or named as a derived buffer; a tensor the map
  does not use, or one the map needs and the file lacks, stops the import and is listed.

Nothing here imports ``transformers``: the checkpoint is read as plain JSON and safetensors.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from ..errors import ConfigError, DataError, one_line
from ..jsonio import load as load_json
from ..state import check_state_dict

__all__ = ["HF_GENERIC_FIELDS", "read_hf_config", "read_safetensors", "check_fields", "check_layer_count",
           "NameMap", "linear_from_conv1d"]

# Fields every transformers config carries (PretrainedConfig and generation bookkeeping): none changes
# what the network computes for a given input.
HF_GENERIC_FIELDS = frozenset({
    "_name_or_path", "architectures", "chunk_size_feed_forward", "dtype", "torch_dtype", "id2label",
    "label2id", "is_encoder_decoder", "model_type", "output_attentions", "output_hidden_states",
    "problem_type", "return_dict", "transformers_version", "use_cache", "bos_token_id", "eos_token_id",
    "pad_token_id", "sep_token_id", "decoder_start_token_id", "initializer_range", "tokenizer_class",
    "task_specific_params", "prefix", "finetuning_task", "use_return_dict", "torchscript",
    "tie_encoder_decoder", "pruned_heads", "is_decoder", "cross_attention_hidden_size",
    "_attn_implementation_autoset", "gradient_checkpointing",
})


def read_hf_config(source: Path) -> dict[str, Any]:
    """``SOURCE/config.json`` of a Hugging Face checkpoint directory, with a one-line error when it is not one."""
    if not source.is_dir():
        raise DataError(f"{source} is not a checkpoint directory (it does not exist or is not a directory)")
    file = source / "config.json"
    if not file.is_file():
        raise DataError(f"{source} is not a Hugging Face checkpoint: it has no config.json")
    try:
        cfg = load_json(file)  # nesting bounded (JSONTooDeep); UnicodeDecodeError and parse errors are ValueErrors
    except ValueError as err:
        raise DataError(f"{file} is not valid JSON: {one_line(err)[:200]}") from None
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        raise DataError(f"{file} is not a Hugging Face model config (no 'model_type' field)")
    _check_types(cfg, file)
    return cfg


# The fields tokennet's converters read, by the JSON type transformers writes: a hand-edited or damaged
# config.json is refused here, naming the field, rather than failing deep in a converter's arithmetic.
_COUNTS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
           "num_key_value_heads", "max_position_embeddings", "head_dim", "n_embd", "n_layer", "n_head", "n_positions",
           "n_ctx", "n_inner", "image_size", "patch_size", "num_channels", "type_vocab_size")
_NOT_NULL = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "max_position_embeddings", "n_embd", "n_layer", "n_head", "n_positions", "image_size", "patch_size")
_REALS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "rope_theta")


def _check_types(cfg: dict[str, Any], f: Path) -> None:
    def bad(k, what):
        text = repr(cfg[k])
        raise DataError(f"{f}: field {k} = {text if len(text) <= 40 else text[:37] + '...'} is not {what}")

    if not isinstance(cfg["model_type"], str):
        bad("model_type", "a string")
    archs = cfg.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(arch, str) for arch in archs)):
        bad("architectures", "a list of class names")
    for k in _COUNTS:
        v = cfg.get(k)
        if v is None and not (k in cfg and k in _NOT_NULL):
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            bad(k, "a positive integer")
    for k in _REALS:
        v = cfg.get(k)
        if k in cfg and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            bad(k, "a finite number")
    for k in ("rope_parameters", "rope_scaling"):
        if cfg.get(k) is not None and not isinstance(cfg[k], dict):
            bad(k, "an object")
    params = cfg.get("rope_parameters") or {}
    theta = params.get("rope_theta")
    if "rope_theta" in params and (isinstance(theta, bool) or not isinstance(theta, (int, float))
                              or not math.isfinite(theta)):
        raise DataError(f"{f}: field rope_parameters.rope_theta is not a finite number")
    for k in ("hidden_act", "activation_function"):
        if cfg.get(k) is not None and not isinstance(cfg[k], str):
            bad(k, "a string")
    if cfg.get("tie_word_embeddings") is not None and not isinstance(cfg["tie_word_embeddings"], bool):
        bad("tie_word_embeddings", "true or false")
    for k in ("pad_token_id", "bos_token_id", "eos_token_id"):  # eos may be a list (several stop tokens)
        v = cfg.get(k)
        ids = v if k == "eos_token_id" and isinstance(v, list) else [v]
        if v is not None and not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            bad(k, "a token id" + (" or a list of them" if k == "eos_token_id" else ""))


def read_safetensors(source: Path) -> dict[str, Tensor]:
    """All tensors of ``SOURCE/model.safetensors`` (float tensors as float32), or one line saying what is wrong.

    Sharded checkpoints (``model.safetensors.index.json``) are read shard by shard. Pickle files
    (``pytorch_model.bin``) are refused: unpickling can run code.
    """
    from safetensors import SafetensorError, safe_open

    index = source / "model.safetensors.index.json"
    if index.is_file():
        try:
            files = sorted(set(load_json(index)["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise DataError(f"{index} is not a safetensors index: {one_line(err)[:200]}") from None
        if not files or not all(isinstance(n, str) and n and Path(n).name == n and n not in (".", "..")
                                for n in files):
            raise DataError(f"{index}: its weight_map must name shard files in the same directory")
    elif (source / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        pickled = [pickle_path.name for pickle_path in sorted(source.glob("*.bin"))]
        hint = f" ({pickled[0]} is pickle-based: convert it to safetensors first)" if pickled else ""
        raise DataError(f"{source} has no model.safetensors{hint}")
    out: dict[str, Tensor] = {}
    for name in files:
        path = source / name
        try:
            with safe_open(str(path), framework="pt") as reader:
                for k in reader.keys():  # noqa: SIM118 - safe_open has keys(), not __iter__
                    t = reader.get_tensor(k)
                    out[k] = t.float() if t.is_floating_point() else t
        except (SafetensorError, OSError, RuntimeError) as err:
            first = (str(err).splitlines() or [type(err).__name__])[0]
            raise DataError(f"{path} is not a readable safetensors file (truncated or damaged?): {first}") from None
    return out


def check_layer_count(tensors: dict[str, Tensor], layers: int, where: str) -> None:
    """The config's layer count against the checkpoint's numbered layers (``model.layers.N.``, ``h.N.``,
    ``layer.N.``), before a converter loops over it or builds a model that deep (a damaged count must not)."""
    found = {int(m.group(1)) for k in tensors if (m := re.search(r"(?:^|\.)(?:layers|h|layer)\.(\d+)\.", k))}
    if len(found) != layers or max(found, default=-1) != layers - 1:
        raise DataError(f"{where}: the config says {layers} layer(s) but the file holds {len(found)}; "
                        "nothing was written")


def check_fields(cfg: dict[str, Any], family: str, *, mapped: Iterable[str], required: dict[str, Any],
                 ignored: Iterable[str] = ()) -> None:
    """Refuse a config field the converter does not account for, naming it.

    Args:
        cfg: the foreign config.
        family: the converter's name, for the message.
        mapped: fields the converter translates into tokennet config fields.
        required: field → the only value tokennet implements (the field may be absent).
        ignored: fields that do not change inference (dropout rates and the like), besides
            :data:`HF_GENERIC_FIELDS`.
    """
    known = set(mapped) | set(ignored) | HF_GENERIC_FIELDS
    for k, v in cfg.items():
        if k in required:
            if v != required[k]:
                raise ConfigError(f"config field {k}={v!r} is not supported by the {family} converter "
                                  f"(tokennet implements {k}={required[k]!r}); nothing was written")
        elif k not in known:
            raise ConfigError(f"config field {k!r} (= {v!r}) is not known to the {family} converter; "
                              "nothing was written")


def linear_from_conv1d(w: Tensor) -> Tensor:
    """GPT-2's ``Conv1D`` stores ``(in, out)`` and computes ``x W + b``; ``nn.Linear`` stores ``(out, in)``."""
    return w.t().contiguous()


class NameMap:
    """Builds a tokennet state dict from foreign tensors, keeping count of what was used.

    ``put(ours, theirs, fn)`` sets ``state[ours] = fn(tensors[theirs...])``; a foreign name that is
    absent is recorded as missing. :meth:`finish` refuses the import when any foreign tensor was not
    used (except ``derived``: buffers a framework recomputes, such as GPT-2's causal-mask ``attn.bias``),
    when any was missing, or when a shape differs from the tokennet model's.
    """

    def __init__(self, tensors: dict[str, Tensor], where: str, *, derived: str | None = None):
        self.tensors, self.where = tensors, where
        self.derived = re.compile(derived) if derived else None
        self.state: dict[str, Tensor] = {}
        self.used: set[str] = set()
        self.missing: list[str] = []

    def has(self, name: str) -> bool:
        return name in self.tensors

    def put(self, ours: str, theirs: str | list[str], fn: Callable[..., Tensor] | None = None) -> None:
        names = [theirs] if isinstance(theirs, str) else list(theirs)
        absent = [n for n in names if n not in self.tensors]
        if absent:
            self.missing.extend(absent)
            return
        self.used.update(names)
        found = [self.tensors[n] for n in names]
        self.state[ours] = fn(*found) if fn is not None else found[0]

    def unused(self) -> list[str]:
        return sorted(k for k in self.tensors
                      if k not in self.used and not (self.derived and self.derived.fullmatch(k)))

    def finish(self, model: nn.Module) -> dict[str, Tensor]:
        """Check the map against the foreign file and the model; return the state dict to load."""
        def listed(names: list[str]) -> str:
            return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")

        if self.missing:
            raise DataError(f"{self.where} lacks {len(self.missing)} tensor(s) the converter needs: "
                            f"{listed(sorted(set(self.missing)))}; nothing was written")
        unused = self.unused()
        if unused:
            raise DataError(f"{self.where} has {len(unused)} tensor(s) the converter does not map: {listed(unused)}; "
                            "nothing was written")
        expected = {k: v for k, v in model.state_dict().items()}
        check_state_dict(expected, self.state, self.where, DataError)
        return self.state
