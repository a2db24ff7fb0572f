"""Starting weights for training: a tokennet run, or anything ``tokennet import`` reads, converted on the fly.

``load_init(SOURCE)`` gives the model and tokenizer to fine-tune from:

- a tokennet run directory (or a bare saved model, ``config.json`` + ``model.safetensors``): loaded as
  :func:`tokennet.load` loads it;
- a Hugging Face checkpoint directory or a ``.gguf`` file: converted in memory by
  :func:`tokennet.interop.convert`, the converter ``tokennet import`` uses; nothing is written.

Anything else is one :class:`~tokennet.errors.RunError` line. A fine-tuned run remembers where its weights
came from; :func:`check_resume_vocabulary` refuses to resume it on a source whose vocabulary differs
from the run's own tokenizer. :func:`with_num_classes` gives a classifier a new head when the fine-tuning
data has other classes, and says which tensors are new; :func:`modules_of` names the modules that hold them
(what a recipe reports as its ``Job.new_modules``: with LoRA they train in full instead of staying frozen at
their random initialization). :func:`from_trunk` starts a model of another task from the shared stack of blocks
of a multimodal run, everything around the blocks new.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError, RunError
from ..jsonio import load as load_json
from ..models.multimodal import STACK_ATTR, TRUNK_FIELDS
from ..models.registry import CONFIG_FILE, WEIGHTS_FILE, model_from_config
from ..run import load, read_tokenizer
from .registry import convert

__all__ = ["InitSource", "load_init", "check_resume_vocabulary", "with_num_classes", "from_trunk", "modules_of"]


@dataclass
class InitSource:
    """Weights to start from: the model, its tokenizer (None for a model without text), where they came from.

    ``kind`` is ``"run"`` for a tokennet run directory, else the converter's name (``"gguf/llama"``,
    ``"llama/LlamaForCausalLM"``, ...); ``notes`` are the converter's remarks for the user.
    """

    model: nn.Module
    tokenizer: Any
    kind: str
    path: Path
    notes: list[str] = field(default_factory=list)


def _is_tokennet_model_dir(path: Path) -> bool:
    config_file = path / CONFIG_FILE
    if not config_file.is_file():
        return False
    try:
        cfg = load_json(config_file)
    except ValueError:  # not JSON, not UTF-8, or nested deeper than jsonio's bound (JSONTooDeep)
        return False
    return isinstance(cfg, dict) and "family" in cfg  # Hugging Face's config.json has "model_type" instead


def load_init(source: str | Path, *, device: str | torch.device = "cpu") -> InitSource:
    """The model and tokenizer in ``source``: a tokennet run, a Hugging Face directory or a GGUF file.

    The model is in train mode on ``device``, every parameter trainable (apply LoRA or freeze afterwards), in
    float32: a GGUF file's quantized tensors are dequantized (a run that holds GGUF blocks is refused: pass its
    file).

    Raises:
        RunError: ``source`` does not exist, or is neither a tokennet run nor a checkpoint tokennet imports.
        ConfigError: an importable format whose architecture or fields tokennet does not convert.
    """
    path = Path(source)
    if not path.exists():
        raise RunError(f"initial weights {path} do not exist")
    if path.is_dir() and _is_tokennet_model_dir(path):
        if not (path / WEIGHTS_FILE).is_file():
            raise RunError(f"{path} is a tokennet run without weights ({WEIGHTS_FILE}); has its training finished?")
        run = load(path, device=device)
        model, tokenizer, kind, notes = run.model, run.tokenizer, "run", []
        if getattr(model.config, "quantized", None):
            raise RunError(f"{path} holds its weights in GGUF blocks (imported from a GGUF file), which do not train; "
                           "pass the .gguf file itself as --init (its weights are dequantized to float32 for training)")
    elif (path.is_dir() and (path / CONFIG_FILE).is_file()) or path.suffix == ".gguf" or _gguf_magic(path):
        # training needs float weights: a GGUF file's Q8_0/Q4_0/Q4_1 tensors are dequantized, not kept as blocks
        model, tokenizer, kind, notes = convert(path, keep_blocks=False)
        model = model.to(device)
    else:
        raise RunError(f"{path} is neither a tokennet run (config.json + model.safetensors) nor a checkpoint "
                       "tokennet imports (a Hugging Face directory with config.json, or a .gguf file)")
    model.train()
    for param in model.parameters():
        param.requires_grad_(True)
    return InitSource(model, tokenizer, kind, path, notes)


def _gguf_magic(path: Path) -> bool:
    if not path.is_file():
        return False
    with open(path, "rb") as file:
        return file.read(4) == b"GGUF"


def check_resume_vocabulary(init: InitSource, run_dir: str | Path) -> None:
    """Refuse to resume ``run_dir`` from initial weights whose vocabulary is not the run's.

    The run saved its tokenizer when it started; a different source (another vocabulary size, or the same
    size with other tokens) would train the checkpoint's embeddings against the wrong tokens.

    Raises:
        RunError: the vocabularies differ (the message gives both sizes).
    """
    saved = read_tokenizer(run_dir)
    ours = init.tokenizer
    n_model = getattr(init.model.config, "vocab_size", None)
    if saved is None and ours is None:
        return
    if saved is None or ours is None:
        have = "has no tokenizer" if ours is None else f"has a tokenizer of {ours.vocab_size} tokens"
        raise RunError(f"the initial weights {init.path} {have}, the run {run_dir} being resumed "
                       f"{'has none' if saved is None else f'one of {saved.vocab_size}'}; resume from the "
                       "weights it started from")
    if saved.vocab_size != ours.vocab_size or saved.to_dict() != ours.to_dict():
        size = f"{ours.vocab_size} tokens" + (f", model {n_model}" if n_model not in (None, ours.vocab_size) else "")
        raise RunError(f"the vocabulary of the initial weights {init.path} ({size}) differs from the run {run_dir} "
                       f"being resumed ({saved.vocab_size} tokens); resume from the weights it started from")


def with_num_classes(model: nn.Module, num_classes: int) -> tuple[nn.Module, list[str]]:
    """A classifier with ``num_classes`` outputs: the same weights, a freshly initialized head where the count differs.

    Builds the family's model with ``num_classes`` and copies every tensor of ``model`` whose shape still
    fits; the ones that do not (the head's output layer) keep the new model's initialization.

    Returns:
        ``(model, names of the re-initialized tensors)``; the model itself and ``[]`` when nothing changes.
    """
    cfg = model.config
    if not hasattr(cfg, "num_classes"):
        raise ConfigError(f"a {cfg.family} model has no classification head (no num_classes)")
    if cfg.num_classes == num_classes:
        return model, []
    new = model_from_config(cfg.replace(num_classes=num_classes))
    old_sd, new_sd = model.state_dict(), new.state_dict()
    fresh = [k for k in new_sd if k not in old_sd or old_sd[k].shape != new_sd[k].shape]
    new.load_state_dict({k: (new_sd[k] if k in fresh else old_sd[k]) for k in new_sd})
    device = next(model.parameters()).device
    return new.to(device).train(model.training), fresh


def from_trunk(source: nn.Module, config) -> tuple[nn.Module, tuple[str, ...]]:
    """A model of ``config`` whose stack of blocks starts as the shared trunk of the multimodal model ``source``.

    The lecture's claim, used: the blocks do not care where tokens come from, so a new task's model (its own tokens,
    positions and head, all new) can start from blocks trained on other modalities. The model takes the trunk's
    shape (``dim``, ``num_layers``, ``num_heads``, ``mlp_ratio``, ``dropout``, ``backend``, ``value_proj``) whatever
    ``config`` says, and the trunk's block weights; the stack's final norm is the new model's own (a ViT closes
    its stack with its head's norm).

    Returns:
        ``(model, the names of its modules that are new)``: every child module but the stack of blocks.

    Raises:
        ConfigError: ``source`` has no shared trunk, or ``config``'s family has no stack of blocks of the trunk's
            kind (e.g. blocks without biases).
    """
    trunk = getattr(source, "trunk", None)
    if trunk is None or not hasattr(source.config, "parts"):
        raise ConfigError(f"a {source.config.family} model has no shared trunk to start from (a multimodal run has)")
    model = model_from_config(config.replace(**{k: getattr(source.config, k) for k in TRUNK_FIELDS}))
    attr = STACK_ATTR.get(model.config.family, "encoder")
    stack = getattr(model, attr, None)
    if not isinstance(getattr(stack, "blocks", None), nn.ModuleList):
        raise ConfigError(f"a {model.config.family} model has no stack of blocks at .{attr} to start from a trunk")
    try:
        stack.blocks.load_state_dict(trunk.blocks.state_dict())
    except RuntimeError as err:  # missing, unexpected or mis-shaped tensors: another kind of block
        raise ConfigError(f"the {model.config.family} model's blocks are not the trunk's kind: "
                          f"{str(err).splitlines()[0]}") from None
    device = next(trunk.parameters()).device
    fresh = tuple(name for name, _ in model.named_children() if name != attr)
    return model.to(device).train(source.training), fresh


def modules_of(tensor_names: list[str]) -> tuple[str, ...]:
    """The modules that hold these state-dict tensors (``["head.fc.weight", "head.fc.bias"] → ("head.fc",)``),
    in order of first appearance.

    Raises:
        ConfigError: a tensor belongs to the model itself rather than to a submodule (it has no module to name).
    """
    out: dict[str, None] = {}
    for k in tensor_names:
        if "." not in k:
            raise ConfigError(f"the new tensor {k!r} is a parameter of the model itself, not of a submodule")
        out[k.rsplit(".", 1)[0]] = None
    return tuple(out)
