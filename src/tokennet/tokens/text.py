"""Text → token ids: a character tokenizer and a byte-level BPE tokenizer behind one interface.

Both tokenizers reserve the same four special tokens at ids 0..3 (``SPECIAL_TOKENS``) and share the
rules for what comes in:

- ``encode`` takes ``str`` or ``bytes``. Bytes that are not valid UTF-8 are decoded with
  ``errors="replace"``, so each invalid sequence becomes U+FFFD; lone surrogates in a ``str`` (which
  ``bytes.decode(..., "surrogateescape")`` produces and UTF-8 cannot carry) become U+FFFD as well.
- Special tokens never come from text. ``"<eos>"`` inside a string is encoded as ordinary characters
  or bytes, so ``decode(encode(s)) == s`` holds for text that mentions them; the special ids appear
  only through ``add_bos`` / ``add_eos`` or by appending them yourself.
- ``decode(ids, skip_special=True)`` drops ``<pad>``, ``<bos>`` and ``<eos>`` and renders ``<unk>``
  as U+FFFD (unk stands for content, not structure); ``skip_special=False`` renders all four as their
  literal strings.

The BPE tokenizer is byte-level (Radford et al., 2019, https://openai.com/research/better-language-models):
text is split by a regular expression into pre-tokens, each pre-token's UTF-8 bytes are the initial
symbols, and the merges learned by training join frequent adjacent pairs. Every byte is in the base
vocabulary, so any string is encodable and ``<unk>`` is never produced. The Rust engine of the
Hugging Face ``tokenizers`` library does the work; ``bpe_reference.py`` is the same algorithm in a page
of Python, and a test holds the two equal.

A saved tokenizer is one ``tokenizer.json``: for BPE it is the Hugging Face JSON as is (so
``tokenizers.Tokenizer.from_file`` reads it; that library rejects extra top-level keys, so the kind
is read from the model type), for the character tokenizer it is ``{"tokennet": {"kind": "char", ...}}``.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from .. import jsonio
from ..errors import ConfigError, DataError, one_line
from ..fileio import atomic_write_text

logger = logging.getLogger(__name__)

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(len(SPECIAL_TOKENS))
TOKENIZER_KINDS = ("char", "bpe")

# The published pre-tokenization regexes: GPT-2's, and cl100k_base's (GPT-3.5/GPT-4).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
GPT4_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*"""
    r"""|\s*[\r\n]|\s+(?!\S)|\s+"""
)
PATTERNS = {"gpt2": GPT2_PATTERN, "gpt4": GPT4_PATTERN}

MIN_BPE_VOCAB = 256 + len(SPECIAL_TOKENS)
MAX_BPE_VOCAB = 1 << 17  # cl100k has ~100K tokens; beyond this an embedding table is mostly unused rows

_SURROGATE = re.compile("[\ud800-\udfff]")
# Under both published patterns no pre-token contains a newline followed by a printable ASCII
# character, so cutting there gives the same tokens as encoding the whole text, and the cut
# pieces can be encoded in parallel. Custom patterns give no such guarantee and are never cut.
_CUT = re.compile(r"\n(?=[!-~])")
_CUT_CHARS = 1 << 14


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from each byte to a printable character, the alphabet byte-level BPE works in.

    Printable Latin-1 bytes map to themselves; the other 68 (control characters, space, ...) map to
    the characters from U+0100 on, in byte order. So space (0x20) is ``"Ġ"`` and newline is ``"Ċ"``.
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(keep)
    extra = 0
    for byte in range(256):
        if byte not in keep:
            keep.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {byte: chr(codepoint) for byte, codepoint in zip(keep, chars, strict=True)}


def _clean_text(text: str | bytes) -> str:
    """Return ``text`` as a str of Unicode scalar values (invalid UTF-8 and lone surrogates → U+FFFD)."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        return bytes(text).decode("utf-8", errors="replace")
    if not isinstance(text, str):
        raise TypeError(f"expected str or bytes, got {type(text).__name__}")
    if text.isascii():
        return text
    return _SURROGATE.sub("\ufffd", text)


def _as_texts(texts: str | bytes | Iterable[str]) -> Iterable[str | bytes]:
    return [texts] if isinstance(texts, (str, bytes)) else texts


def _cut(text: str) -> Iterator[str]:
    """Yield consecutive pieces of ``text`` of about ``_CUT_CHARS`` characters, cut only after newlines."""
    start = 0
    while len(text) - start > _CUT_CHARS:
        m = _CUT.search(text, start + _CUT_CHARS)
        if m is None:
            break
        yield text[start : m.end()]
        start = m.end()
    yield text[start:]


def _as_id_list(ids: Any, vocab_size: int) -> list[int]:
    """Turn a list, 1-D tensor or 1-D array of token ids into a list of ints, checking the range."""
    if hasattr(ids, "tolist"):  # torch.Tensor, np.ndarray
        if getattr(ids, "ndim", 1) != 1:
            raise ValueError(
                f"decode takes a 1-D sequence of ids, got shape {tuple(ids.shape)}; "
                "use decode_batch for a batch of sequences"
            )
        ids = ids.tolist()
    else:
        ids = list(ids)
    if ids and (min(ids) < 0 or max(ids) >= vocab_size):
        bad = next(i for i in ids if not 0 <= i < vocab_size)
        raise DataError(
            f"token id {bad} is outside the vocabulary [0, {vocab_size}); "
            "decode ids with the tokenizer that produced them"
        )
    return ids


class Tokenizer(ABC):
    """Common interface: text ↔ list of token ids, with ``SPECIAL_TOKENS`` at ids 0..3."""

    kind: str = ""

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of token ids, specials included; ids run over ``range(vocab_size)``."""

    @property
    def pad_id(self) -> int:
        """Id of ``<pad>`` (0), the filler of short rows in a batch."""
        return PAD_ID

    @property
    def bos_id(self) -> int:
        """Id of ``<bos>`` (1), the start of a sequence."""
        return BOS_ID

    @property
    def eos_id(self) -> int:
        """Id of ``<eos>`` (2), the end of a sequence."""
        return EOS_ID

    @property
    def unk_id(self) -> int:
        """Id of ``<unk>`` (3), a character the char vocabulary lacks; BPE never emits it."""
        return UNK_ID

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size})"

    @abstractmethod
    def encode(self, text: str | bytes, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Encode one text into token ids.

        Args:
            text: a str, or UTF-8 bytes (invalid sequences become U+FFFD).
            add_bos: put ``bos_id`` first.
            add_eos: put ``eos_id`` last.
        """

    def encode_batch(
        self, texts: Sequence[str | bytes], *, add_bos: bool = False, add_eos: bool = False
    ) -> list[list[int]]:
        """Encode several texts; same arguments as ``encode``, one list of ids per text."""
        return [self.encode(t, add_bos=add_bos, add_eos=add_eos) for t in texts]

    @abstractmethod
    def decode(self, ids: Any, *, skip_special: bool = True) -> str:
        """Decode token ids back to text.

        Args:
            ids: a list of ints, or a 1-D integer tensor or array.
            skip_special: drop pad/bos/eos and render unk as U+FFFD; if False render all four
                specials as their literal strings.
        """

    def decode_continuation(self, ids: Any, *, skip_special: bool = True) -> str:
        """The text ``ids`` add after earlier text (generated tokens after a prompt; one token's text).

        ``decode`` reads ``ids`` as a whole text, and a vocabulary that puts a space before a text's first word
        (SentencePiece's ``add_space_prefix``: Llama 2, Mistral) removes it there; after a prompt that space is
        part of the continuation (``"Hello"`` + ``" world"``), as llama.cpp's ``token_to_piece`` keeps it. The
        same as ``decode`` for a vocabulary without that strip (byte-level BPE, characters).
        """
        return self.decode(ids, skip_special=skip_special)

    def decode_batch(self, batch: Iterable[Any], *, skip_special: bool = True) -> list[str]:
        """Decode each row of ``batch`` (a list of id lists, or a 2-D tensor or array)."""
        return [self.decode(row, skip_special=skip_special) for row in batch]

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """The JSON-serializable content of ``tokenizer.json``; ``tokenizer_from_dict`` inverts it."""

    def save(self, path: str | Path) -> Path:
        """Write ``tokenizer.json``.

        Args:
            path: a directory (existing, or a new path without a suffix) to write
                ``path/tokenizer.json`` into, or a file path such as ``out/tok.json``.

        Returns:
            The path of the file written.
        """
        path = Path(path)
        if path.is_dir() or not path.suffix:
            path = path / "tokenizer.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        # Encoded piece by piece as it is written: a 262,144-piece vocabulary's JSON is ~6 MB of text, but its
        # encoding whole (json.dumps) holds a chunk per value too, ~40 MB at the peak of an import.
        atomic_write_text(path, json.JSONEncoder(ensure_ascii=False).iterencode(self.to_dict()))
        return path

    @staticmethod
    def _wrap(ids: list[int], add_bos: bool, add_eos: bool) -> list[int]:
        if add_bos:
            ids.insert(0, BOS_ID)
        if add_eos:
            ids.append(EOS_ID)
        return ids



class SpecialIds:
    """The special ids of an imported vocabulary, read from ``self._ids`` (``bos_id``, ``eos_id``, ``pad_id``,
    ``unk_id``; None where the source has none): a missing begin or pad falls back to the end of sequence."""

    _ids: dict

    @property
    def bos_id(self) -> int:
        return self._ids["bos_id"] if self._ids["bos_id"] is not None else self._ids["eos_id"]

    @property
    def eos_id(self) -> int:
        return self._ids["eos_id"]

    @property
    def pad_id(self) -> int:
        return self._ids["pad_id"] if self._ids["pad_id"] is not None else self._ids["eos_id"]

    @property
    def unk_id(self) -> int | None:
        return self._ids["unk_id"]

class CharTokenizer(Tokenizer):
    """One token per Unicode character: ids 0..3 are the specials, then the characters in order.

    A character outside the vocabulary encodes to ``unk_id`` and decodes to U+FFFD (with
    ``skip_special=True``), so ``decode(encode(s)) == s`` holds exactly for strings over the
    trained alphabet.

    Args:
        chars: the distinct characters of the vocabulary, in id order.
    """

    kind = "char"

    def __init__(self, chars: Iterable[str]):
        chars = tuple(chars)
        if not chars:
            raise DataError("CharTokenizer needs at least one character; train it on non-empty text")
        bad = [char for char in chars if not isinstance(char, str) or len(char) != 1 or _SURROGATE.match(char)]
        if bad:
            raise DataError(f"CharTokenizer chars must be single non-surrogate characters, got {bad[:5]!r}")
        if len(set(chars)) != len(chars):
            raise DataError("CharTokenizer chars contain duplicates; pass each character once")
        self.chars = chars
        self._id_of = {char: i for i, char in enumerate(chars, start=len(SPECIAL_TOKENS))}
        codepoints = np.array([ord(char) for char in chars], dtype=np.uint32)
        order = np.argsort(codepoints)
        self._sorted_codepoints = codepoints[order]
        self._sorted_ids = (order + len(SPECIAL_TOKENS)).astype(np.int64)
        self._decode_full = [*SPECIAL_TOKENS, *chars]
        self._decode_skip = ["", "", "", "\ufffd", *chars]

    @classmethod
    def train(cls, text: str | bytes | Iterable[str]) -> CharTokenizer:
        """Build the vocabulary: the sorted set of characters seen, after the specials.

        Args:
            text: one string, or an iterable of strings.
        """
        seen: set[str] = set()
        for t in _as_texts(text):
            seen.update(_clean_text(t))
        if not seen:
            raise DataError("CharTokenizer.train got no text; pass a non-empty string or strings")
        return cls(sorted(seen))

    @property
    def vocab_size(self) -> int:
        return len(SPECIAL_TOKENS) + len(self.chars)

    def encode(self, text: str | bytes, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        text = _clean_text(text)
        if len(text) < 64:
            ids = [self._id_of.get(char, UNK_ID) for char in text]
        else:  # one vectorized lookup of code points in the sorted alphabet
            codepoints = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
            pos = np.searchsorted(self._sorted_codepoints, codepoints)
            pos = np.minimum(pos, len(self._sorted_codepoints) - 1)
            found = self._sorted_codepoints[pos] == codepoints
            ids = np.where(found, self._sorted_ids[pos], UNK_ID).tolist()
        return self._wrap(ids, add_bos, add_eos)

    def decode(self, ids: Any, *, skip_special: bool = True) -> str:
        table = self._decode_skip if skip_special else self._decode_full
        return "".join([table[i] for i in _as_id_list(ids, self.vocab_size)])

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokennet": {"kind": "char", "special_tokens": list(SPECIAL_TOKENS), "chars": list(self.chars)}
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CharTokenizer:
        """Rebuild from ``to_dict()`` output."""
        meta = data.get("tokennet", {})
        if meta.get("kind") != "char" or not isinstance(meta.get("chars"), list):
            raise DataError(
                "not a char tokenizer dict: expected {'tokennet': {'kind': 'char', 'chars': [...]}}"
            )
        specials = meta.get("special_tokens", list(SPECIAL_TOKENS))
        if not isinstance(specials, list) or tuple(specials) != SPECIAL_TOKENS:
            raise DataError(
                f"char tokenizer has special tokens {meta['special_tokens']}, expected {SPECIAL_TOKENS}"
            )
        return cls(meta["chars"])


def _resolve_pattern(pattern: str) -> str:
    """Map a pattern name to its regex, or check a custom regex compiles in the engine."""
    if pattern in PATTERNS:
        return PATTERNS[pattern]
    if not isinstance(pattern, str) or not pattern:
        raise ConfigError(
            f"pattern must be one of {sorted(PATTERNS)} or a regular expression, got {pattern!r}"
        )
    if re.fullmatch(r"[\w-]+", pattern):  # a mistyped name, not a useful regex
        raise ConfigError(
            f"unknown pattern name {pattern!r}; use one of {sorted(PATTERNS)} or a regular expression"
        )
    try:
        Regex(pattern)
    except Exception as error:  # the engine raises a bare Exception for a bad regex
        raise ConfigError(f"pattern {pattern!r} is not a valid regular expression for the engine: {error}") from error
    return pattern


MAX_PIECE = 256


def _new_engine(regex: str) -> HFTokenizer:
    """An untrained byte-level BPE: regex split, then bytes → GPT-2 characters; no unk token needed."""
    engine = HFTokenizer(models.BPE())
    engine.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(regex), behavior="isolated"),
            # A pathological "word" (a megabyte without a space) would make BPE quadratic: cut every
            # piece into runs of at most MAX_PIECE characters. Real words never come near it.
            pre_tokenizers.Split(Regex(rf"[\s\S]{{1,{MAX_PIECE}}}"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    engine.decoder = decoders.ByteLevel()
    return engine


def _drop_special_merges(hf: HFTokenizer) -> HFTokenizer:
    """Remove merges that would build a special token's string from text, and merges built on them.

    Only a custom pattern can keep ``"<eos>"`` in one pre-token; without this step text ``"<eos>"``
    would merge into the special id and vanish on decode.
    """
    data = json.loads(hf.to_str())
    model = data["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    specials = set(SPECIAL_TOKENS)
    if not any(left + right in specials for left, right in merges):
        return hf
    vocab = {t: i for t, i in model["vocab"].items() if i < MIN_BPE_VOCAB}
    kept, unreachable = [], set()
    for left, right in merges:
        if {left, right} & (specials | unreachable) or left + right in specials:
            if left + right not in vocab:
                unreachable.add(left + right)
            continue
        kept.append([left, right])
        unreachable.discard(left + right)
        vocab.setdefault(left + right, len(vocab))
    logger.warning("dropped %d merges that spell special tokens out of text", len(merges) - len(kept))
    model["vocab"], model["merges"] = vocab, kept
    return HFTokenizer.from_str(json.dumps(data))


class BPETokenizer(Tokenizer):
    """Byte-level BPE on the Hugging Face ``tokenizers`` engine; never produces ``<unk>``.

    ``decode(encode(s)) == s`` for every string of Unicode scalar values (lone surrogates become
    U+FFFD on the way in). Decoding ids that split a multi-byte character gives U+FFFD for the
    partial bytes.

    Args:
        engine: a ``tokenizers.Tokenizer`` with a BPE model whose ids 0..3 are ``SPECIAL_TOKENS``,
            as made by ``train`` or read from a saved ``tokenizer.json``.
    """

    kind = "bpe"

    def __init__(self, engine: HFTokenizer):
        data = json.loads(engine.to_str())
        if data.get("model", {}).get("type") != "BPE":
            raise DataError(f"BPETokenizer needs a BPE model, got {data.get('model', {}).get('type')!r}")
        found = tuple(engine.id_to_token(i) for i in range(len(SPECIAL_TOKENS)))
        if found != SPECIAL_TOKENS:
            raise DataError(
                f"BPE tokenizer has {found} at ids 0..3, expected {SPECIAL_TOKENS}; "
                "tokennet reads only tokenizers trained with BPETokenizer.train"
            )
        engine.encode_special_tokens = True  # text "<eos>" is text; not stored in the JSON
        self._engine = engine
        try:
            self.pattern_regex: str | None = data["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
        except (KeyError, IndexError, TypeError):
            self.pattern_regex = None
        self.pattern = next((n for n, regex in PATTERNS.items() if regex == self.pattern_regex), self.pattern_regex)
        byte_of = {char: byte for byte, char in bytes_to_unicode().items()}
        full = [b""] * engine.get_vocab_size()
        for token, i in engine.get_vocab().items():
            if not 0 <= i < len(full):
                raise DataError(f"token {token!r} has id {i}, outside 0..{len(full) - 1}: the vocabulary's ids have "
                                "gaps")
            try:
                full[i] = token.encode() if i < len(SPECIAL_TOKENS) else bytes(byte_of[char] for char in token)
            except KeyError as error:
                raise DataError(f"token {token!r} is not byte-level; this is not a byte-level BPE") from error
        self._decode_full = full
        self._decode_skip = [b"", b"", b"", "\ufffd".encode(), *full[len(SPECIAL_TOKENS) :]]

    @classmethod
    def train(
        cls,
        texts: str | bytes | Iterable[str],
        vocab_size: int = 4096,
        *,
        pattern: str = "gpt4",
        min_frequency: int = 2,
        show_progress: bool = False,
    ) -> BPETokenizer:
        """Learn merges: repeatedly join the most frequent adjacent pair within pre-tokens.

        Args:
            texts: one string, or an iterable of strings (documents, lines).
            vocab_size: upper bound on the vocabulary, specials and the 256 bytes included, in
                ``[260, 131072]``; training stops earlier when no pair reaches ``min_frequency``.
            pattern: ``"gpt2"``, ``"gpt4"`` (cl100k's regex) or a custom regex for pre-tokenization.
            min_frequency: a pair seen fewer times than this is never merged.
            show_progress: let the engine draw its progress bar.
        """
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
            raise ConfigError(f"vocab_size must be an int, got {vocab_size!r}")
        if not MIN_BPE_VOCAB <= vocab_size <= MAX_BPE_VOCAB:
            raise ConfigError(
                f"vocab_size={vocab_size} is out of range; byte-level BPE needs at least "
                f"{MIN_BPE_VOCAB} (256 bytes + {len(SPECIAL_TOKENS)} specials) and at most {MAX_BPE_VOCAB}"
            )
        if isinstance(min_frequency, bool) or not isinstance(min_frequency, int) or min_frequency < 1:
            raise ConfigError(f"min_frequency must be an int >= 1, got {min_frequency!r}")
        regex = _resolve_pattern(pattern)
        cuttable = regex in PATTERNS.values()
        chars = [0]

        def pieces() -> Iterator[str]:
            for t in _as_texts(texts):
                t = _clean_text(t)
                chars[0] += len(t)
                yield from (_cut(t) if cuttable else [t])

        engine = _new_engine(regex)
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            show_progress=show_progress,
            special_tokens=list(SPECIAL_TOKENS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        engine.train_from_iterator(pieces(), trainer=trainer)
        if chars[0] == 0:
            raise DataError("BPETokenizer.train got no text; pass a non-empty string or strings")
        tok = cls(_drop_special_merges(engine))
        logger.info("trained byte-level BPE on %d characters: %d tokens", chars[0], tok.vocab_size)
        return tok

    @property
    def vocab_size(self) -> int:
        return self._engine.get_vocab_size()

    @property
    def engine(self) -> HFTokenizer:
        """The underlying ``tokenizers.Tokenizer``."""
        return self._engine

    def _encode_texts(self, texts: list[str]) -> list[list[int]]:
        """Encode cleaned texts in one engine call, cutting long ones into pieces encoded in parallel."""
        cuttable = self.pattern in PATTERNS
        pieces, counts = [], []
        for t in texts:
            parts = list(_cut(t)) if cuttable else [t]
            pieces.extend(parts)
            counts.append(len(parts))
        encode_batch = getattr(self._engine, "encode_batch_fast", self._engine.encode_batch)
        encodings = iter(encode_batch(pieces, add_special_tokens=False))
        chain = itertools.chain.from_iterable
        return [list(chain(encoding.ids for encoding in itertools.islice(encodings, n))) for n in counts]

    def encode(self, text: str | bytes, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        return self._wrap(self._encode_texts([_clean_text(text)])[0], add_bos, add_eos)

    def encode_batch(
        self, texts: Sequence[str | bytes], *, add_bos: bool = False, add_eos: bool = False
    ) -> list[list[int]]:
        encoded = self._encode_texts([_clean_text(t) for t in texts])
        return [self._wrap(ids, add_bos, add_eos) for ids in encoded]

    def decode(self, ids: Any, *, skip_special: bool = True) -> str:
        table = self._decode_skip if skip_special else self._decode_full
        data = b"".join([table[i] for i in _as_id_list(ids, self.vocab_size)])
        return data.decode("utf-8", errors="replace")

    def to_dict(self) -> dict[str, Any]:
        return json.loads(self._engine.to_str())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BPETokenizer:
        """Rebuild from ``to_dict()`` output (the Hugging Face tokenizer JSON)."""
        try:
            engine = HFTokenizer.from_str(json.dumps(data))
        except Exception as error:  # the engine raises a bare Exception on malformed JSON
            raise DataError(f"not a valid Hugging Face tokenizer JSON: {one_line(error)}") from error
        return cls(engine)


SAVED_KINDS: dict[str, Callable[[dict[str, Any]], Tokenizer]] = {}
"""``tokenizer.json``'s ``tokennet.kind`` → the class's ``from_dict``: ``char`` here; ``pretrained`` and
``sentencepiece`` registered by their own modules (:func:`register_saved_kind`), so this module imports neither."""


def register_saved_kind(kind: str, from_dict: Callable[[dict[str, Any]], Tokenizer]) -> None:
    """Let :func:`tokenizer_from_dict` rebuild tokenizers saved with ``tokennet.kind == kind``."""
    SAVED_KINDS[kind] = from_dict


register_saved_kind("char", CharTokenizer.from_dict)


def tokenizer_from_dict(data: dict[str, Any]) -> Tokenizer:
    """Rebuild a tokenizer from the content of a ``tokenizer.json`` (``Tokenizer.to_dict()`` output)."""
    if isinstance(data, dict) and "tokennet" in data:
        kind = data["tokennet"].get("kind") if isinstance(data["tokennet"], dict) else None
        if isinstance(kind, str) and kind in SAVED_KINDS:
            return SAVED_KINDS[kind](data)
        raise DataError(
            f"unknown tokenizer kind {kind!r} in tokenizer JSON; expected one of {TOKENIZER_KINDS}"
        )
    if isinstance(data, dict) and isinstance(data.get("model"), dict) and data["model"].get("type") == "BPE":
        return BPETokenizer.from_dict(data)
    raise DataError("not a tokennet tokenizer: expected a 'tokennet' key (char) or a BPE model (bpe)")


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Read a tokenizer saved by ``Tokenizer.save``.

    Args:
        path: a ``tokenizer.json`` file, or a directory (such as a saved run) that contains one.
    """
    path = Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        where = f"directory {path} has no tokenizer.json" if path.is_dir() else f"{path} does not exist"
        raise DataError(
            f"cannot load tokenizer: {where}; pass a tokenizer.json or a directory holding one"
        )
    try:
        data = jsonio.loads(file.read_text(encoding="utf-8"), what=f"{file} is not a tokenizer")  # too deep: says so
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DataError(f"{file} is not a tokenizer: not valid JSON ({error})") from None
    try:
        return tokenizer_from_dict(data)
    except ValueError as error:
        raise DataError(f"{file}: {one_line(error)}") from error


def train_tokenizer(
    kind: str, texts: str | bytes | Iterable[str], vocab_size: int | None = None, **kwargs: Any
) -> Tokenizer:
    """Train a tokenizer of the given kind.

    Args:
        kind: ``"char"`` or ``"bpe"``.
        texts: one string, or an iterable of strings.
        vocab_size: BPE vocabulary bound (default 4096); must stay None for ``"char"``, whose
            vocabulary is the set of characters seen.
        **kwargs: passed on to ``BPETokenizer.train`` (``pattern``, ``min_frequency``, ...).
    """
    if kind == "char":
        if vocab_size is not None or kwargs:
            given = ", ".join(["vocab_size"] * (vocab_size is not None) + sorted(kwargs))
            raise ConfigError(f"a char tokenizer's vocabulary is the characters seen; drop {given}")
        return CharTokenizer.train(texts)
    if kind == "bpe":
        return BPETokenizer.train(texts, 4096 if vocab_size is None else vocab_size, **kwargs)
    raise ConfigError(f"unknown tokenizer kind {kind!r}; use one of {', '.join(TOKENIZER_KINDS)}")
