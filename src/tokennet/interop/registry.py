"""The converter registry: each family file declares what it reads, and one dispatcher reads a source.

A converter is registered where it is defined, with the names a source gives its architecture::

    @register(hf=[("llama", "LlamaForCausalLM")])          # config.json's model_type and architectures
    def convert_llama(source: Path, cfg: dict) -> Converted: ...

    @register(gguf=["llama"])                               # the GGUF file's general.architecture
    def convert_llama_gguf(path: Path, *, reader, keep_blocks: bool) -> Converted: ...

and returns one type, :class:`Converted` (model, tokenizer, notes). :func:`convert` reads the source's header
(:func:`~.hf.read_hf_config` or :func:`~.gguf_in.read_gguf`) and dispatches through the tables; the readers
import no family file and the family files import the readers, so no import runs both ways. Adding a family is
one file (and its import in the package's ``__init__``, which loads every family).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError, DataError
from .gguf_in import field as gguf_field
from .gguf_in import read_gguf
from .hf import read_hf_config

__all__ = ["Converted", "register", "HF_CONVERTERS", "GGUF_CONVERTERS", "convert"]


@dataclass
class Converted:
    """What every converter returns: the tokennet model, its tokenizer (None where the source has none here) and
    remarks for the user."""

    model: nn.Module
    tokenizer: Any = None
    notes: list[str] = field(default_factory=list)


HFConverter = Callable[[Path, dict[str, Any]], Converted]
GGUFConverter = Callable[..., Converted]  # (path, *, reader, keep_blocks)

HF_CONVERTERS: dict[tuple[str, str], HFConverter] = {}  # (config.json's model_type, architecture) → converter
GGUF_CONVERTERS: dict[str, GGUFConverter] = {}  # general.architecture → converter


def register(*, hf: Iterable[tuple[str, str]] = (), gguf: Iterable[str] = ()):
    """Register the decorated converter for the Hugging Face ``(model_type, architecture)`` pairs ``hf`` and the
    GGUF ``general.architecture`` values ``gguf``; a name already taken is a bug (two families claiming it)."""

    def decorate(fn):
        for table, keys in ((HF_CONVERTERS, list(hf)), (GGUF_CONVERTERS, list(gguf))):
            for key in keys:
                if key in table and table[key] is not fn:
                    raise RuntimeError(f"converter for {key!r} registered twice: {table[key].__name__}, {fn.__name__}")
                table[key] = fn
        return fn

    return decorate


def _magic(path: Path) -> bytes:
    with open(path, "rb") as file:
        return file.read(4)


def convert(source: str | Path, *, keep_blocks: bool = True) -> tuple[nn.Module, Any, str, list[str]]:
    """Convert a checkpoint in memory: ``(tokennet model, tokenizer or None, converter name, notes)``; writes nothing.

    Args:
        source: a Hugging Face checkpoint directory, or a ``.gguf`` file.
        keep_blocks: a GGUF file's Q8_0/Q4_0/Q4_1 tensors stay blocks (False: float32 everywhere).
    """
    source = Path(source)
    if source.suffix == ".gguf" or (source.is_file() and _magic(source) == b"GGUF"):
        name, done = _convert_gguf(source, keep_blocks)
    else:
        name, done = _convert_hf(source)
    _check_template(done.tokenizer, source)
    _check_finite(done.model, source)
    return done.model, done.tokenizer, name, done.notes


def _check_finite(model: nn.Module, source: Path) -> None:
    """A checkpoint holding NaN or infinite weights is refused before anything is written: loading the run would
    refuse it anyway (models/registry.py), so importing it would only leave a run nothing can open."""
    for name, param in model.named_parameters():
        if param.is_floating_point() and not torch.isfinite(param).all():
            raise DataError(f"{source}: tensor {name!r} holds NaN or infinite values (a damaged file); nothing "
                            "was written")


def _convert_gguf(path: Path, keep_blocks: bool) -> tuple[str, Converted]:
    reader = read_gguf(path)
    arch = gguf_field(reader, "general.architecture")
    if arch not in GGUF_CONVERTERS:
        raise ConfigError(f"{path}: GGUF architecture {arch!r} has no tokennet converter (supported: "
                          f"{', '.join(GGUF_CONVERTERS)}); nothing was written")
    return f"gguf/{arch}", GGUF_CONVERTERS[arch](path, reader=reader, keep_blocks=keep_blocks)


def _convert_hf(source: Path) -> tuple[str, Converted]:
    cfg = read_hf_config(source)
    archs = cfg.get("architectures") or []
    model_type = cfg["model_type"]
    for arch in archs:
        if (model_type, arch) in HF_CONVERTERS:
            return f"{model_type}/{arch}", HF_CONVERTERS[(model_type, arch)](source, cfg)
    supported = ", ".join(f"{known_arch} ({t})" for t, known_arch in HF_CONVERTERS)
    got = f"{model_type} / {', '.join(archs) or 'no architectures field'}"
    raise ConfigError(f"{source}: architecture {got} has no tokennet converter (supported: {supported}); "
                      "nothing was written")


def _check_template(tokenizer: Any, source: Path) -> None:
    """A checkpoint whose chat template the sandbox refuses (tokens/chat_template.py) is refused whole, before
    anything is written; without jinja2 the template is checked when it is first rendered."""
    template = getattr(tokenizer, "chat_template", None)
    if not template or importlib.util.find_spec("jinja2") is None:
        return
    from ..tokens.chat_template import check_chat_template

    try:
        check_chat_template(template, where=str(source))
    except DataError as err:
        raise DataError(f"{err}; nothing was written") from None
