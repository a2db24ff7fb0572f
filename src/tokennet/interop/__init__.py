"""Checkpoints of other libraries on tokennet's own modules: ``tokennet import SOURCE --out RUN_DIR``.

One converter per foreign family maps names and layouts onto tokennet's modules (CONTRIBUTING.md: foreign
names are mapped, not adopted); the result is an ordinary tokennet run directory (``config.json``,
``model.safetensors``, ``run.json``), so ``tokennet.load``, ``generate`` and ``viz`` use it with
tokennet's code alone — no ``transformers`` at inference.

=====================  ===============================  ===========================================
source                 architecture                     tokennet family
=====================  ===============================  ===========================================
HF dir, ``gpt2``       ``GPT2LMHeadModel``              ``gpt`` (:mod:`.gpt2`)
HF dir, ``vit``        ``ViTForImageClassification``    ``vit`` (:mod:`.vit`)
HF dir, ``llama``      ``LlamaForCausalLM``             ``gpt`` with Llama's options (:mod:`.llama`)
HF dir, ``qwen2``      ``Qwen2ForCausalLM``             ``gpt``, Llama's options + ``qkv_bias`` (:mod:`.llama`)
HF dir, ``mistral``    ``MistralForCausalLM``           ``gpt``: Llama's, every layer a sliding window (:mod:`.llama`)
``*.gguf`` file        ``llama``, ``gpt2``,             ``gpt`` (GGUF blocks kept, see gguf_in) + its tokenizer
                       ``qwen2``, ``gemma3``
HF dir, ``bert``       ``BertModel``                    ``text-encoder`` + its tokenizer (:mod:`.bert`)
=====================  ===============================  ===========================================

:func:`tokennet.interop.init.load_init` reads the same sources (or a tokennet run) as starting weights for
fine-tuning, converted in memory.

Anything else — another family, a config field a converter does not map, a tensor it does not use or
cannot find — stops the import with one line, and nothing is written.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from ..errors import RunError
from ..models.registry import save_pretrained
from ..run import save_tokenizer, write_run_info

# Every family file, imported for its converters' @register lines (registry.py dispatches through them).
from . import bert, gemma, gpt2, llama, vit  # noqa: F401
from .init import InitSource, load_init
from .registry import GGUF_CONVERTERS, HF_CONVERTERS, Converted, convert, register

__all__ = ["import_checkpoint", "convert", "ImportResult", "CONVERTERS", "HF_CONVERTERS", "GGUF_CONVERTERS",
           "Converted", "register", "load_init", "InitSource"]

logger = logging.getLogger(__name__)

CONVERTERS = HF_CONVERTERS  # the old name of the Hugging Face table: (model_type, architecture) → converter


@dataclass
class ImportResult:
    """What :func:`import_checkpoint` did: the run directory, the converter used and remarks for the user."""

    path: Path
    converter: str
    model: nn.Module
    notes: list[str] = field(default_factory=list)
    tokenizer: Any = None


def import_checkpoint(source: str | Path, out: str | Path, *, keep_blocks: bool = True,
                      overwrite: bool = False) -> ImportResult:
    """Convert the checkpoint in ``source`` and write it as a tokennet run directory ``out``.

    The conversion happens in memory and is checked completely (config fields, every tensor's name and
    shape) before anything is written; the run is written to a temporary directory beside ``out`` and
    renamed, so a failure leaves nothing behind.

    Args:
        source: a Hugging Face checkpoint directory (``config.json`` + ``model.safetensors``) or a GGUF file.
        out: the new run directory; it must not exist, or be empty — or, with ``overwrite``, be a directory
            whose ``run.json`` reads as a tokennet run (never the source, nor a directory holding it): the new
            run replaces it only once it is written whole, under the run's lock
            (:meth:`~tokennet.run.RunLock.swap_in`), and a failure leaves it as it was.
        keep_blocks: a GGUF file's Q8_0/Q4_0/Q4_1 tensors stay blocks (False: dequantized to float32).
        overwrite: replace an existing run at ``out``.
    """
    from ..fileio import swap_into_place, temp_dir_beside
    from ..run import LOCK_FILE, RunLock, read_run_info

    source, out = Path(source), Path(out)
    replacing = out.exists() and (not out.is_dir() or any(out.iterdir()))
    if replacing:
        if not overwrite:
            raise RunError(f"{out} already exists and is not an empty directory; choose another --out "
                           "(or --overwrite to replace the run there)")
        source_real, out_real = source.resolve(), out.resolve()
        if source_real == out_real or out_real in source_real.parents:
            raise RunError(f"refusing to overwrite {out}: it holds the source {source} (nothing was written)")
        try:  # --overwrite deletes what it replaces: only a directory whose run.json reads as a run
            read_run_info(out)
        except RunError as err:
            raise RunError(f"refusing to overwrite {out}: it does not read as a tokennet run ({err}); nothing was "
                           "written") from None
    model, tokenizer, name, notes = convert(source, keep_blocks=keep_blocks)
    lock = RunLock(out).acquire() if replacing else None  # a run being trained is not replaced under its writer
    tmp, swapped = temp_dir_beside(out, "import"), False
    try:
        save_pretrained(model, tmp)
        if tokenizer is not None:
            save_tokenizer(tmp, tokenizer)
        write_run_info(tmp, recipe="import", model=model.config.family, data=str(source.resolve()),
                       settings={"imported_from": str(source.resolve()), "converter": name})
        if lock is not None:
            lock.swap_in(tmp)  # raises only before the swap; afterwards the old run is deleted
            swapped = True
        else:
            trash = swap_into_place(tmp, out)  # an empty directory at ``out`` (checked above) trades places
            swapped = True
            if trash is not None:
                trash.rmdir()
    except BaseException:
        if not swapped:
            shutil.rmtree(tmp, ignore_errors=True)
            if lock is not None and lock.created:
                (out / LOCK_FILE).unlink(missing_ok=True)  # the old run exactly as it was
        raise
    finally:
        if lock is not None:
            lock.release()
    for n in notes:
        logger.warning("%s", n)
    return ImportResult(out, name, model, notes, tokenizer)

