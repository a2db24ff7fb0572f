"""The translation task: an encoder–decoder (Transformer or RNN + attention) maps a string to a string.

Decoding is greedy or beam search (:mod:`tokennet.decode`) over the model's caches; one character
tokenizer serves source and target.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from ..data.dates import encode_pairs
from ..decode import beam_search, greedy_search, strip_special
from ..errors import DataError
from . import ConditionalDecoder, Task

if TYPE_CHECKING:
    from ..run import Run

__all__ = ["Translation", "translate", "translate_batch"]

log = logging.getLogger(__name__)


@torch.no_grad()
def translate_batch(model, tokenizer, sources: list[str], *, beam_size: int = 4, alpha: float = 0.6,
                    batch_size: int = 256) -> list[str]:
    """Translate many sources in batches (they must already fit the model)."""
    dev = next(model.parameters()).device
    c = model.config
    out: list[str] = []
    for i in range(0, len(sources), batch_size):
        (src, _), _ = encode_pairs([(s, "") for s in sources[i : i + batch_size]], tokenizer, c.pad_id)
        src = src.to(dev)
        ids = greedy_search(model, src) if beam_size == 1 else beam_search(model, src, beam_size=beam_size,
                                                                             alpha=alpha)
        out.extend(tokenizer.decode(r) for r in strip_special(ids, c.eos_id, c.pad_id))
    return out


def translate(model, tokenizer, text: str, *, beam_size: int = 4, alpha: float = 0.6) -> tuple[str, list[str]]:
    """Translate one string; returns ``(translation, characters outside the vocabulary)``.

    Unknown characters become ``<unk>`` (the model still translates what it can read). An empty
    string, or one longer than the model's ``max_source_len``, raises ``DataError``.
    """
    text = text.strip()
    if not text:
        raise DataError("the input is empty; give a date such as '3rd of March 1999'")
    if beam_size < 1:
        raise DataError(f"beam_size must be >= 1, got {beam_size}")
    ids = tokenizer.encode(text)
    limit = model.config.max_source_len
    if len(ids) > limit:
        raise DataError(f"the input is {len(ids)} characters, longer than the model's maximum of {limit}")
    unknown = sorted({ch for ch, i in zip(text, ids, strict=True) if i == tokenizer.unk_id})
    return translate_batch(model, tokenizer, [text], beam_size=beam_size, alpha=alpha)[0], unknown


class Translation(Task):
    """An encoder–decoder over strings: ``run.translate(text, beam_size=None)``."""

    name = "translation"
    kind = "translation"
    verbs = ("translate",)
    protocol = ConditionalDecoder

    def translate(self, run: Run, text: str, *, beam_size: int | None = None, return_unknown: bool = False):
        """The translation of ``text`` with the run's beam settings (``beam_size`` overrides the run's).

        Characters outside the vocabulary are read as ``<unk>``: with ``return_unknown`` the result is
        ``(translation, unknown characters)``, else they are logged as a warning.
        """
        s = run.settings
        k = beam_size if beam_size is not None else s.get("beam_size", 4)
        out, unknown = translate(run.model, run.tokenizer, text, beam_size=k, alpha=s.get("alpha", 0.6))
        if unknown and not return_unknown:
            log.warning("characters outside the vocabulary read as <unk>: %r", "".join(unknown))
        return (out, unknown) if return_unknown else out
