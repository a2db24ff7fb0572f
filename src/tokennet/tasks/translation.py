"""The translation task: an encoder–decoder (Transformer or RNN + attention) maps a string to a string.

Decoding is greedy or beam search (:mod:`tokennet.decode`) over the model's caches; one character
tokenizer serves source and target.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..data.dates import encode_pairs
from ..decode import beam_search, greedy_search, strip_special
from ..errors import DataError
from ..viz.explore.sequences import TranslationExplorer
from . import ConditionalDecoder
from .base import HELP, OPTIONS, Input, Task, register_task, verb
from .example_files import Example, take

if TYPE_CHECKING:
    from ..run import Run

__all__ = ["Translation", "translate", "translate_batch"]

log = logging.getLogger(__name__)


@torch.no_grad()
def translate_batch(model, tokenizer, sources: list[str], *, beam_size: int = 4, alpha: float = 0.6,
                    batch_size: int = 256) -> list[str]:
    """Translate many sources in batches (they must already fit the model)."""
    dev = next(model.parameters()).device
    config = model.config
    out: list[str] = []
    for i in range(0, len(sources), batch_size):
        (src, _), _ = encode_pairs([(source, "") for source in sources[i : i + batch_size]], tokenizer, config.pad_id)
        src = src.to(dev)
        ids = greedy_search(model, src) if beam_size == 1 else beam_search(model, src, beam_size=beam_size,
                                                                             alpha=alpha)
        out.extend(tokenizer.decode(seq) for seq in strip_special(ids, config.eos_id, config.pad_id))
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
    unknown = sorted({char for char, token_id in zip(text, ids, strict=True) if token_id == tokenizer.unk_id})
    return translate_batch(model, tokenizer, [text], beam_size=beam_size, alpha=alpha)[0], unknown


@register_task
class Translation(Task):
    """An encoder–decoder over strings: ``run.translate(text, beam_size=None)``."""

    name = "translation"
    kind = "translation"
    families = ("seq2seq", "bahdanau")
    viz_uses = ("index", "layer", "head", "text")
    explorer = TranslationExplorer
    protocol = ConditionalDecoder
    inputs = (Input("prompt", HELP["prompt"], file=False),)
    options = (OPTIONS["beam_size"],)

    def respond(self, run: Run, values: dict[str, Any]) -> Iterator[str]:
        """The translation of ``--prompt``; characters outside the vocabulary are listed on stderr."""
        out, unknown = self.translate(run, values["prompt"], beam_size=values["beam_size"], return_unknown=True)
        if unknown:
            log.warning("tokennet: warning: characters outside the vocabulary read as <unk>: %r", "".join(unknown))
        yield out + "\n"

    def draw(self, run: Run, out_dir: Path, **options) -> list[Path]:
        """``alignment.png``: the cross-attention of a test example (or ``--text``), per layer and head."""
        from ..viz.alignment import seq2seq_viz

        return seq2seq_viz(run, out_dir, **options)

    def panel(self, run: Run, log) -> list[tuple[str, str]]:
        from ..viz.report.sequences import translation_panel

        return translation_panel(run, log)

    def examples(self, run: Run, directory: Path, count: int = 1) -> list[Example]:
        """``prompt-K.txt`` per held-out source text, labelled with its translation."""
        pairs = run.data.held_out()
        out = []
        for k in take(count, len(pairs), run.path):
            source, target = pairs[k][:2]
            path = Path(directory) / f"prompt-{k}.txt"
            path.write_text(source, encoding="utf-8")
            out.append(Example({"prompt": source}, target, (path,)))
        return out

    def bad_inputs(self, run: Run, directory: Path) -> list[tuple[dict[str, Any], str]]:
        limit = run.model.config.max_source_len
        return [({"prompt": "   "}, "empty"), ({"prompt": "1" * (limit + 1)}, "longer than")]

    @verb
    def translate(self, run: Run, text: str, *, beam_size: int | None = None, return_unknown: bool = False):
        """The translation of ``text`` with the run's beam settings (``beam_size`` overrides the run's).

        Characters outside the vocabulary are read as ``<unk>``: with ``return_unknown`` the result is
        ``(translation, unknown characters)``, else they are logged as a warning.
        """
        settings = run.settings
        beams = beam_size if beam_size is not None else settings.get("beam_size", 4)
        out, unknown = translate(run.model, run.tokenizer, text, beam_size=beams, alpha=settings.get("alpha", 0.6))
        if unknown and not return_unknown:
            log.warning("characters outside the vocabulary read as <unk>: %r", "".join(unknown))
        return (out, unknown) if return_unknown else out
