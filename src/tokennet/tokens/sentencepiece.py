"""A SentencePiece vocabulary as llama.cpp reads it (its ``llama`` vocabulary type): pieces with scores, byte fallback.

Gemma, Llama 2 and Mistral ship vocabularies of this kind: a list of pieces (``▁the``, ``ing``, ``<0x0A>``), each with
a score (a log-probability) and a type (normal, control, user-defined, byte, unused). llama.cpp tokenizes a text
(``llm_tokenizer_spm``) in four steps, which :meth:`SentencePieceTokenizer.encode` repeats:

1. special pieces are cut out first, longest first: user-defined pieces (Gemma's runs of spaces, tabs and newlines)
   always, control pieces (``<start_of_turn>``) when the text may hold them — here always, as tokennet's imported
   tokenizers encode the strings chat templates write;
2. each remaining fragment gets a leading space when the vocabulary asks for one (``add_space_prefix``: Llama 2,
   not Gemma) and the previous fragment was special, and every space becomes ``▁`` (U+2581);
3. the fragment starts as one symbol per character; the adjacent pair whose concatenation is a piece of the highest
   score is merged (ties: the leftmost), over and over, until no pair is a piece — a greedy merge by score:

       (a, b) = argmax_{adjacent (a, b), ab ∈ V} score(ab),  then a, b → ab;

4. a final symbol that is a piece is its id; one that is not (a character the vocabulary lacks) becomes its UTF-8
   bytes, each the byte piece ``<0xXX>`` (byte fallback).

Decoding concatenates the pieces' bytes (``▁`` back to a space, a byte piece to its byte; control pieces only when
``skip_special=False``) and reads them as UTF-8.

Saved in a run's ``tokenizer.json`` as ``{"tokennet": {"kind": "sentencepiece", "pieces": [...], "scores": [...],
"types": [...], ids, flags}}``.
"""

from __future__ import annotations

import functools
import heapq
from array import array
from typing import Any

from ..errors import DataError
from .chat_template import render_chat_template
from .text import SpecialIds, Tokenizer, _as_id_list, register_saved_kind

__all__ = ["SentencePieceTokenizer", "NORMAL", "UNKNOWN", "CONTROL", "USER_DEFINED", "UNUSED", "BYTE"]

# llama.cpp's token types (tokenizer.ggml.token_type; SentencePiece's ModelProto types).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"  # ▁, SentencePiece's escaped space


class SentencePieceTokenizer(SpecialIds, Tokenizer):
    """A SentencePiece (llama.cpp ``llama``-type) vocabulary: see the module docstring.

    Args:
        pieces: the vocabulary, one piece per id.
        scores: each piece's score (merge priority).
        types: each piece's type (``NORMAL`` … ``BYTE``; default all normal).
        bos_id, eos_id, pad_id, unk_id: the special ids (None where there is none).
        add_bos: ``encode`` puts ``bos_id`` first (the file's ``add_bos_token``: Gemma reads its text after ``<bos>``).
        add_space_prefix: a space before the text and after each special piece (Llama 2; Gemma: False).
        chat_template: the source's Jinja chat template, if any.
    """

    kind = "sentencepiece"

    def __init__(self, pieces: list[str], scores: list[float], types: list[int] | None = None, *,
                 bos_id: int | None = None, eos_id: int | None = None, pad_id: int | None = None,
                 unk_id: int | None = None, add_bos: bool = False, add_space_prefix: bool = False,
                 chat_template: str | None = None, where: str = "the tokenizer"):
        types = list(types) if types is not None else [NORMAL] * len(pieces)
        if not pieces or len(scores) != len(pieces) or len(types) != len(pieces):
            raise DataError(f"{where}: a SentencePiece vocabulary needs as many scores and types as pieces "
                            f"(got {len(pieces)}, {len(scores)}, {len(types)})")
        if (not all(isinstance(piece, str) for piece in pieces)
                or not all(isinstance(score, (int, float)) for score in scores)):
            raise DataError(f"{where}: SentencePiece pieces must be strings and scores numbers")
        # Scores as one array of doubles (not 262,144 float objects: 2 MB, not 8).
        self.pieces, self.scores, self.types = list(pieces), array("d", scores), types
        self._ids = {"bos_id": bos_id, "eos_id": eos_id, "pad_id": pad_id, "unk_id": unk_id}
        for k, v in self._ids.items():
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < len(pieces)):
                raise DataError(f"{where}: {k}={v!r} is outside the vocabulary of {len(pieces)} pieces")
        self.add_bos, self.add_space_prefix = bool(add_bos), bool(add_space_prefix)
        self.chat_template = chat_template
        self.chat_template_source = where if chat_template else None
        # Special pieces cut out before the merges, longest first (llama.cpp's cache_special_tokens).
        special = [i for i, t in enumerate(types) if t in (CONTROL, USER_DEFINED, UNKNOWN) and self.pieces[i]]
        self._special = sorted(special, key=lambda i: -len(self.pieces[i].encode("utf-8")))

    # Built on first use, not with the tokenizer: an import that only saves the vocabulary never needs the map
    # (for Gemma 3's 262,144 pieces it is ~20 MB of the import's peak memory).
    @functools.cached_property
    def _index(self) -> dict[str, int]:
        return {piece: i for i, piece in enumerate(self.pieces)}  # a repeated piece: the last id (llama.cpp's map)

    @functools.cached_property
    def _bytes(self) -> list[int | None]:
        return [self._index.get(f"<0x{byte:02X}>") for byte in range(256)]

    # -- ids ----------------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    @property
    def stop_ids(self) -> list[int]:
        """Ids that end a generated text: the end of sequence, and Gemma's ``<end_of_turn>`` where it exists."""
        out = [] if self._ids["eos_id"] is None else [self._ids["eos_id"]]
        eot = self._index.get("<end_of_turn>")
        if eot is not None and eot not in out and self.types[eot] == CONTROL:
            out.append(eot)
        return out

    @property
    def special_tokens(self) -> dict[str, str]:
        """``{"bos_token": "<bos>", ...}`` where the vocabulary has them: what a chat template is given."""
        return {f"{n}_token": self.pieces[i] for n in ("bos", "eos", "unk", "pad")
                if (i := self._ids[f"{n}_id"]) is not None}

    # -- encoding -----------------------------------------------------------------------------------
    def _fragments(self, text: str, special: bool) -> list[str | int]:
        """``text`` cut at its special pieces: a list of raw strings and ids (llama.cpp's tokenizer_st_partition)."""
        parts: list[str | int] = [text] if text else []
        for i in self._special:
            if not special and self.types[i] != USER_DEFINED:
                continue
            piece = self.pieces[i]
            if piece not in text:
                continue
            out: list[str | int] = []
            for part in parts:
                if isinstance(part, int) or piece not in part:
                    out.append(part)
                    continue
                start = 0
                while (j := part.find(piece, start)) >= 0:
                    if j > start:
                        out.append(part[start:j])
                    out.append(i)
                    start = j + len(piece)
                if start < len(part):
                    out.append(part[start:])
            parts = out
        return parts

    def _merge(self, text: str, out: list[int]) -> None:
        """Step 3 and 4 of the module docstring on one escaped fragment: append its ids to ``out``."""
        n = len(text)
        if n == 0:
            return
        start = list(range(n))  # symbol k covers text[start[k] : start[k] + size[k]]
        size = [1] * n
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n)) + [-1]
        index, scores = self._index, self.scores
        heap: list[tuple[float, int, int, int]] = []

        def bigram(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            pair_text = text[start[left] : start[left] + size[left] + size[right]]
            i = index.get(pair_text)
            if i is not None:  # highest score first, then the leftmost
                heapq.heappush(heap, (-scores[i], left, right, len(pair_text)))

        for k in range(1, n):
            bigram(k - 1, k)
        while heap:
            _, left, right, length = heapq.heappop(heap)
            if size[left] == 0 or size[right] == 0 or size[left] + size[right] != length:
                continue  # a stale pair: one side was merged since
            size[left] += size[right]
            size[right] = 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            bigram(prev[left], left)
            bigram(left, nxt[left])
        k = 0
        while k != -1:
            piece_text = text[start[k] : start[k] + size[k]]
            i = index.get(piece_text)
            if i is not None:
                out.append(i)
            else:  # byte fallback: the character's UTF-8 bytes as <0xXX> pieces
                for byte in piece_text.encode("utf-8"):
                    byte_id = self._bytes[byte]
                    out.append(byte_id if byte_id is not None else self.unk_id if self.unk_id is not None else 0)
            k = nxt[k]

    def encode(self, text: str | bytes, *, add_bos: bool = False, add_eos: bool = False,
               special: bool = True) -> list[int]:
        """Token ids of ``text``, as llama.cpp's ``llama_tokenize(text, add_special, parse_special=special)``.

        ``<bos>`` comes first when ``add_bos`` or the vocabulary's own ``add_bos`` asks for it (once).
        ``special``: control pieces written in the text encode to their ids (False: they are spelled out).
        """
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        text = text.encode("utf-8", errors="replace").decode("utf-8")  # lone surrogates → U+FFFD
        out: list[int] = [self.bos_id] if (add_bos or self.add_bos) and self.bos_id is not None else []
        prev_special = True
        for part in self._fragments(text, special):
            if isinstance(part, int):
                out.append(part)
                prev_special = True
                continue
            if self.add_space_prefix and prev_special:
                part = " " + part
            self._merge(part.replace(" ", SPACE), out)
            prev_special = False
        if add_eos and self.eos_id is not None:
            out.append(self.eos_id)
        return out

    # -- decoding -----------------------------------------------------------------------------------
    def piece_bytes(self, i: int, *, skip_special: bool = True) -> bytes:
        """The bytes token ``i`` stands for in a text (llama.cpp's ``token_to_piece``)."""
        kind, piece = self.types[i], self.pieces[i]
        if kind in (NORMAL, USER_DEFINED):
            return piece.replace(SPACE, " ").encode("utf-8")
        if kind == BYTE and len(piece) == 6 and piece.startswith("<0x"):
            return bytes([int(piece[3:5], 16)])
        if kind == UNKNOWN:
            return "\u2585".encode()  # ▅, as llama.cpp prints an unknown piece
        if kind == CONTROL and not skip_special:
            return piece.encode("utf-8")
        return b""

    def decode(self, ids: Any, *, skip_special: bool = True) -> str:
        """The text of ``ids``, as llama.cpp's ``llama_detokenize(remove_special=skip_special,
        unparse_special=not skip_special)``: with ``add_space_prefix``, the first piece loses one leading space
        (the one encode put there) — unless the ids start with a ``<bos>`` that is removed, where llama.cpp keeps it."""
        return self._decode(ids, skip_special, strip=self.add_space_prefix)

    def decode_continuation(self, ids: Any, *, skip_special: bool = True) -> str:
        """The text ``ids`` add after earlier text: every piece's own bytes, no leading space removed (llama.cpp's
        ``token_to_piece`` of each new token, as its server streams them)."""
        return self._decode(ids, skip_special, strip=False)

    def _decode(self, ids: Any, skip_special: bool, strip: bool) -> str:
        ids = _as_id_list(ids, self.vocab_size)
        if skip_special and ids and self.add_bos and ids[0] == self.bos_id:
            ids, strip = ids[1:], False
        out = []
        for i in ids:
            piece = self.piece_bytes(i, skip_special=skip_special)
            if strip and piece.startswith(b" "):
                piece = piece[1:]
            strip = False
            out.append(piece)
        return b"".join(out).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
                            tools: list[dict[str, Any]] | None = None, documents: list[dict[str, Any]] | None = None,
                            where: str | None = None, **variables: Any) -> str:
        """The prompt of a conversation, rendered with the source's chat template (see :mod:`.chat_template`)."""
        if not self.chat_template:
            raise DataError(f"{where or 'this tokenizer'} has no chat template")
        return render_chat_template(self.chat_template, messages, where=where or "this tokenizer",
                                    add_generation_prompt=add_generation_prompt, tools=tools, documents=documents,
                                    special_tokens=self.special_tokens, **variables)

    # -- saving -------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"tokennet": {"kind": self.kind, "pieces": self.pieces, "scores": self.scores.tolist(),
                             "types": self.types,
                             **self._ids, "add_bos": self.add_bos, "add_space_prefix": self.add_space_prefix,
                             "chat_template": self.chat_template}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SentencePieceTokenizer:
        meta = data["tokennet"]
        try:
            return cls(meta["pieces"], meta["scores"], meta.get("types"),
                       **{k: meta.get(k) for k in ("bos_id", "eos_id", "pad_id", "unk_id")},
                       add_bos=bool(meta.get("add_bos")), add_space_prefix=bool(meta.get("add_space_prefix")),
                       chat_template=meta.get("chat_template") if isinstance(meta.get("chat_template"), str) else None)
        except (KeyError, TypeError) as error:
            raise DataError(f"not a valid SentencePiece tokenizer: {type(error).__name__} {error}") from None

    @classmethod
    def from_gguf_fields(cls, fields: dict[str, Any], where: str = "GGUF") -> SentencePieceTokenizer:
        """From a GGUF file's ``tokenizer.ggml.*`` fields (keys without the prefix: ``model``, ``tokens``, ``scores``,
        ``token_type``, ``bos_token_id``, …, ``add_bos_token``, ``add_space_prefix``) and ``chat_template``, where
        ``model`` is ``llama`` (SentencePiece). ``add_bos_token`` and ``add_space_prefix`` default to llama.cpp's
        defaults for this type (both true)."""
        if fields.get("model") != "llama":
            raise DataError(f"{where}: tokenizer.ggml.model={fields.get('model')!r} is not a SentencePiece ('llama') "
                            "vocabulary")
        pieces, scores = fields.get("tokens") or [], fields.get("scores")
        if scores is None:
            scores = [0.0] * len(pieces)
        add_bos, prefix = fields.get("add_bos_token"), fields.get("add_space_prefix")
        return cls(pieces, scores, fields.get("token_type"), bos_id=fields.get("bos_token_id"),
                   eos_id=fields.get("eos_token_id"), pad_id=fields.get("padding_token_id"),
                   unk_id=fields.get("unknown_token_id"), add_bos=True if add_bos is None else bool(add_bos),
                   add_space_prefix=True if prefix is None else bool(prefix),
                   chat_template=fields.get("chat_template"), where=where)


register_saved_kind("sentencepiece", SentencePieceTokenizer.from_dict)  # tokenizer_from_dict rebuilds a saved one
