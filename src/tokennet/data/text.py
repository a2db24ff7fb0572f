"""Text corpora: the embedded ones, user files (file, directory or glob), the language-model split, LM batches.

Two corpora are embedded, so a fresh machine trains on real text with no download:

- ``shakespeare``: Tiny Shakespeare (1.1 MB, 40,000 lines of the plays; public domain), the corpus of
  char-rnn's and nanoGPT's character-level examples, shipped gzipped in the package (``corpora/``);
- ``python-docs``: the topics of the Python language reference that ship with CPython for ``help()``
  (``pydoc_data.topics``), about 0.46 MB of English prose with code.

:class:`TextCorpus` is the data spec of the language-model recipes: which corpus, and the split — the
last ``val_fraction`` of the token stream (at least one block) validates, the rest trains.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from pathlib import Path
from typing import ClassVar

import torch
from torch import Tensor

from ..errors import DataError
from .spec import DataSpec, register_data

__all__ = ["embedded_corpus", "read_corpus", "LMBatches", "DataError", "TEXT_SUFFIXES", "TextCorpus", "CORPORA",
           "shakespeare"]

TEXT_SUFFIXES = {".txt", ".md", ".rst", ".text", ".py", ".csv", ".tsv", ".json", ".jsonl", ".tex", ".html", ""}



def shakespeare() -> str:
    """Tiny Shakespeare, the embedded copy (``corpora/tinyshakespeare.txt.gz``)."""
    import gzip

    return gzip.decompress((Path(__file__).parent / "corpora" / "tinyshakespeare.txt.gz").read_bytes()).decode("utf-8")


def embedded_corpus() -> str:
    """The Python language reference's help topics (English prose with code), from the standard library."""
    try:
        from pydoc_data.topics import topics
    except ImportError as err:  # pragma: no cover - every CPython ships it, but distributions may strip it
        raise DataError("this Python has no pydoc_data (the embedded corpus); give a text file as the data") from err
    return "\n\n".join(topics[k].strip() for k in sorted(topics))


def _read_text_file(path: Path) -> str:
    raw = path.read_bytes()
    if not raw.strip():
        raise DataError(f"{path} is empty")
    if b"\x00" in raw[:65536]:
        raise DataError(f"{path} looks binary (it contains NUL bytes), not text")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{path} is not UTF-8 text (invalid byte at offset {err.start})") from None


def read_corpus(spec: str | os.PathLike) -> str:
    """Read a text corpus from a file, a directory (its text files, sorted, recursively) or a glob.

    Raises:
        DataError: missing path, nothing matching, empty or binary files.
    """
    spec = str(spec)
    path = Path(spec)
    if any(char in spec for char in "*?["):
        files = sorted(Path(candidate) for candidate in glob.glob(spec, recursive=True) if Path(candidate).is_file())
        if not files:
            raise DataError(f"no files match {spec!r}")
    elif path.is_dir():
        files = sorted(candidate for candidate in path.rglob("*")
                       if candidate.is_file() and candidate.suffix.lower() in TEXT_SUFFIXES
                       and not any(part.startswith(".") for part in candidate.relative_to(path).parts))
        if not files:
            raise DataError(f"directory {path} has no text files ({', '.join(sorted(TEXT_SUFFIXES - {''}))})")
    elif path.is_file():
        files = [path]
    else:
        raise DataError(f"data path {spec} does not exist")
    texts = []
    for file in files:
        try:
            texts.append(_read_text_file(file))
        except DataError:
            if len(files) == 1:
                raise
    if not texts:
        raise DataError(f"no readable text in {spec} (all files empty or binary)")
    return "\n\n".join(texts)


class LMBatches:
    """Random windows of a token stream for next-token prediction: ``x = ids[i:i+T]``, ``y = ids[i+1:i+T+1]``.

    ``batch(k)`` draws its offsets from a generator seeded by ``(seed, k)``, so batch ``k`` is the
    same in every run with that seed (exact resume needs nothing but ``k``).

    Args:
        ids: 1-D token ids.
        block_size: T.
        batch_size: B.
        seed: the data seed.
    """

    def __init__(self, ids: Tensor, block_size: int, batch_size: int, seed: int = 0):
        if ids.dim() != 1:
            raise ValueError("ids must be a 1-D tensor of token ids")
        if len(ids) < block_size + 1:
            raise DataError(
                f"corpus of {len(ids)} tokens is shorter than one block ({block_size} + 1); "
                "use more text or a smaller block_size"
            )
        self.ids = ids.long()
        self.block_size, self.batch_size, self.seed = block_size, batch_size, seed
        self._ar = torch.arange(block_size + 1)

    def batch(self, index: int) -> tuple[Tensor, Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        starts = torch.randint(len(self.ids) - self.block_size, (self.batch_size,), generator=generator)
        window = self.ids[starts[:, None] + self._ar]  # (B, T + 1)
        return window[:, :-1], window[:, 1:]

    def eval_batches(self, n: int) -> list[tuple[Tensor, Tensor]]:
        """``n`` fixed batches (the same in every call), for a stable validation loss."""
        return [self.batch(-(i + 1)) for i in range(n)]


# The embedded corpora by name (``--data shakespeare``); anything else is a path, a directory or a glob.
CORPORA = {"shakespeare": shakespeare, "python-docs": embedded_corpus}


@register_data
@dataclasses.dataclass
class TextCorpus(DataSpec):
    """A language model's data: a corpus (an embedded one by name, or a file, directory or glob) and its split.

    The split is by tokens, so it needs the tokenizer: the last ``max(⌊n · val_fraction⌋, block_size + 1)``
    of the ``n`` token ids validate, the rest train (:meth:`split`).

    With ``reverse``, both parts are read backwards: the same split, each part's token order flipped, so a
    reversed run validates on exactly the forward run's validation tokens and the two losses compare. With characters
    that is the text read from its end. The lecture: "the earlier words in the sentence are causally determining the
    next words, but there's not quite the anti-causal direction. The statistics are different. It's not like a
    reversible sequence".

    Args:
        source: the corpus: an embedded one by name, or a file, directory or glob (``--data``).
        val_fraction: the share of the corpus's tokens, at its end, held out for validation.
        reverse: train and validate on the token stream read backwards (for characters: the text reversed), the
            split unchanged.
    """

    kind: ClassVar[str] = "text"
    legacy_recipes: ClassVar[tuple[str, ...]] = ("gpt", "gpt-char")
    source: str = "python-docs"
    val_fraction: float = 0.1
    reverse: bool = False

    def __post_init__(self):
        if not 0 < self.val_fraction < 1:
            raise DataError(f"val_fraction must be in (0, 1), got {self.val_fraction}")

    @classmethod
    def from_legacy(cls, data, settings) -> TextCorpus:
        # Before the spec, no --data meant the Python docs (the default of both recipes then).
        return cls(source=data if data not in (None, "", "embedded") else "python-docs",
                   val_fraction=settings.get("val_fraction", 0.1), reverse=settings.get("reverse", False))

    def read(self) -> str:
        """The corpus text."""
        if self.source in CORPORA:
            return CORPORA[self.source]()
        return read_corpus(self.source)

    def split(self, ids: Tensor, block_size: int) -> tuple[Tensor, Tensor]:
        """``(train ids, validation ids)`` of a token stream: validation is its tail, at least one block + 1; with
        ``reverse``, each part read backwards (the boundary is the forward stream's)."""
        n_val = max(int(len(ids) * self.val_fraction), block_size + 1)
        train, val = ids[:-n_val], ids[-n_val:]
        return (train.flip(0), val.flip(0)) if self.reverse else (train, val)

    def stream(self, tokenizer) -> Tensor:
        """Every token id of the corpus, in the spec's reading direction (backwards with ``reverse``)."""
        ids = torch.tensor(tokenizer.encode(self.read()), dtype=torch.long)
        return ids.flip(0) if self.reverse else ids

    def held_out(self, tokenizer, block_size: int) -> Tensor:
        """The validation token ids of this corpus under ``tokenizer``."""
        ids = torch.tensor(tokenizer.encode(self.read()), dtype=torch.long)
        return self.split(ids, block_size)[1]
