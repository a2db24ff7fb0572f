"""Constrained decoding: ``response_format`` ``json_object`` / ``json_schema`` by masking each step's logits.

A grammar G (here: the JSON texts, or those a JSON schema accepts) is compiled once per request; each
sequence keeps a matcher, the state of a parser that has read the tokens generated so far. Before a token
is sampled, the matcher gives the set of tokens that keep the text a prefix of some text in G, and every
other logit is set to −∞:

.. math::  p'(t \\mid x_{<i}) \\propto p(t \\mid x_{<i}) \\; [\\, x_{<i} t \\text{ is a prefix of } L(G) \\,]

so sampling (at any temperature, top-k, top-p) only ever picks allowed tokens and the finished text is in
L(G). When G is complete, only the end of sequence is allowed, and the sequence stops.

The matcher is **llguidance** (https://github.com/guidance-ai/llguidance): chosen over ``xgrammar`` and
``outlines-core`` because it has no dependencies (xgrammar's wheel requires ``triton`` and ``transformers``
on Linux; outlines-core builds an index of the whole vocabulary per schema), runs on the CPU offline, and
compiled a schema fastest and decoded a token at the lowest cost of the three on SmolLM2's vocabulary
(``bench/results/constrained_backends.json``, from ``bench/constrained_backends.py``, measured on a shared
machine; the whole server's cost: ``bench/serve.py --modes constrained``).
Whitespace between JSON tokens is not free (``{"a":1}``, not ``{ "a" : 1 }``): a sampling model cannot
wander in whitespace forever.

A schema llguidance cannot compile (an unknown type, a bad pattern, an unsatisfiable schema) is a
:class:`ValueError` naming the problem; the server answers it with a 400. So is a schema that compiles but
admits no first token (a ``$ref`` that only refers to itself): :meth:`Constraints.compile` computes the first
mask before the request is queued. A text that gets stuck later (the schema needs a character the vocabulary
cannot write) ends that sequence with a :class:`~tokennet.serve.engine.RequestFault`, which the server answers
with a 400 too: the request's schema, not the server, is at fault.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..jsonio import loads
from .engine import RequestFault

__all__ = ["Constraints", "Grammar", "Matcher", "token_bytes"]


def token_bytes(tokenizer, vocab_size: int) -> tuple[list[bytes], list[int]]:
    """Each token id's bytes, and the special ids (never allowed inside a text), for ``vocab_size`` ids.

    tokennet's own tokenizers keep a table (``_decode_full``: bytes for byte-level BPE, characters for the
    character tokenizer; ids 0..3 are the specials). An imported (``tokenizers``) vocabulary is byte-level
    (GPT-2's byte → character map) or SentencePiece-like (``▁`` for a space, ``<0xNN>`` byte pieces).
    """
    from ..tokens.text import SPECIAL_TOKENS, bytes_to_unicode

    out: list[bytes] = [b""] * vocab_size
    special: set[int] = set()
    table = getattr(tokenizer, "_decode_full", None)
    engine = getattr(tokenizer, "_engine", None)
    if table is not None:
        special = set(range(len(SPECIAL_TOKENS)))
        for i, t in enumerate(table[:vocab_size]):
            out[i] = t if isinstance(t, bytes) else t.encode("utf-8")
    elif engine is not None and hasattr(engine, "get_vocab"):
        data = loads(engine.to_str(), what="the tokenizer")
        byte_level = "ByteLevel" in json.dumps(data.get("decoder")) or "ByteLevel" in json.dumps(
            data.get("pre_tokenizer"))
        byte_of = {char: byte for byte, char in bytes_to_unicode().items()}
        special = {int(i) for i, t in engine.get_added_tokens_decoder().items() if t.special}
        for tok, i in engine.get_vocab(with_added_tokens=True).items():
            if not 0 <= i < vocab_size:
                continue
            if i in special:
                out[i] = tok.encode("utf-8")
            elif byte_level and all(char in byte_of for char in tok):
                out[i] = bytes(byte_of[char] for char in tok)
            elif len(tok) == 6 and tok.startswith("<0x") and tok.endswith(">"):
                out[i] = bytes([int(tok[3:5], 16)])
            else:
                out[i] = tok.replace("\u2581", " ").encode("utf-8")
    else:
        for i in range(min(vocab_size, tokenizer.vocab_size)):
            out[i] = tokenizer.decode_continuation([i], skip_special=False).encode("utf-8")
    n = getattr(tokenizer, "vocab_size", vocab_size)
    special |= set(range(n, vocab_size))  # a padded embedding's ids past the tokenizer: never sampled
    special |= {i for i in range(vocab_size) if not out[i]}
    return out, sorted(special)


class Matcher:
    """One sequence's parser state: :meth:`mask` the logits, :meth:`accept` the sampled token, :meth:`done`."""

    def __init__(self, m, vocab_size: int, never: Tensor):
        self.m, self.V, self.keep = m, vocab_size, ~never

    def mask(self, logits: Tensor) -> None:
        """Set the logits ``(V,)`` of every token the grammar does not allow now to −∞ (in place)."""
        words = np.frombuffer(self.m.compute_bitmask(), dtype=np.uint8)  # (⌈V/32⌉·4,) bytes of 32-bit words
        bits = np.unpackbits(words, count=self.V, bitorder="little").view(np.bool_)  # (V,)
        allowed = torch.from_numpy(bits) & self.keep  # special tokens other than the end of sequence: never
        if self.m.is_error() or not bool(allowed.any()):
            why = (self.m.get_error() or "").strip().splitlines()[:1] or ["the vocabulary lacks what it needs"]
            raise RequestFault("constrained decoding: no token of this model's vocabulary can continue the text "
                               f"under the schema ({why[0]})")
        # torch.where is several times faster than masked_fill_ with a boolean mask on the CPU
        torch.where(allowed.to(logits.device), logits, _NEG_INF.to(logits.device, logits.dtype), out=logits)

    def accept(self, token: int) -> None:
        if not self.m.consume_token(token):
            why = (self.m.get_error() or "").strip().splitlines()
            raise ValueError(f"constrained decoding: the grammar refused token {token}"
                             + (f": {why[0]}" if why else ""))

    def done(self) -> bool:
        """The text is complete (the grammar allows nothing more, or the end of sequence was accepted)."""
        return bool(self.m.is_stopped())


_NEG_INF = torch.tensor(float("-inf"))


class Grammar:
    """A compiled grammar, shared by a request's sequences; :meth:`matcher` starts one sequence's parser."""

    def __init__(self, lltok, grammar: str, vocab_size: int, never: Tensor):
        self.lltok, self.grammar, self.V, self.never = lltok, grammar, vocab_size, never

    def matcher(self) -> Matcher:
        import llguidance

        return Matcher(llguidance.LLMatcher(self.lltok, self.grammar), self.V, self.never)


class _Wrapped:
    """What ``llguidance.TokenizerWrapper`` reads of a tokenizer."""

    def __init__(self, tokenizer, tokens: list[bytes], special: list[int], eos: int):
        self.tokenizer, self.tokens, self.special_token_ids = tokenizer, tokens, special
        self.eos_token_id, self.bos_token_id = eos, None

    def __call__(self, s) -> list[int]:
        return list(self.tokenizer.encode(s))


class Constraints:
    """The grammars of one server: the vocabulary is read once (on the first constrained request)."""

    def __init__(self, tokenizer, vocab_size: int):
        self.tokenizer, self.V = tokenizer, vocab_size
        self._lltok = None
        self._never: Tensor | None = None  # (V,) the special ids, the end of sequence excepted
        self._lock = threading.Lock()

    def _tokenizer(self):
        with self._lock:
            if self._lltok is None:
                import llguidance

                tokens, special = token_bytes(self.tokenizer, self.V)
                stops = list(getattr(self.tokenizer, "stop_ids", None) or []) or [self.tokenizer.eos_id]
                self._lltok = llguidance.LLTokenizer(
                    llguidance.TokenizerWrapper(_Wrapped(self.tokenizer, tokens, special, stops[0])),
                    n_vocab=self.V, eos_token=stops)
                never = torch.zeros(self.V, dtype=torch.bool)
                never[special] = True
                never[[t for t in stops if 0 <= t < self.V]] = False
                self._never = never
            return self._lltok

    def compile(self, schema: dict[str, Any] | None) -> Grammar:
        """The grammar of JSON texts valid under ``schema`` (None: any JSON object); ValueError naming a bad one."""
        import llguidance

        text = json.dumps({"type": "object"} if schema is None else schema)
        try:
            json_grammar = llguidance.LLMatcher.grammar_from_json_schema(text, defaults={"whitespace_flexible": False})
        except (ValueError, TypeError, RuntimeError) as error:
            raise ValueError(str(error).splitlines()[0] if str(error) else type(error).__name__) from None
        lltok = self._tokenizer()
        err = llguidance.LLMatcher.validate_grammar(json_grammar, lltok)
        if err:
            raise ValueError(" ".join(err.split()))
        grammar = Grammar(lltok, json_grammar, self.V, self._never)
        try:  # the first mask, before the request is queued: a schema no text can begin is the request's 400
            grammar.matcher().mask(torch.zeros(self.V))
        except RequestFault:
            raise ValueError("no text valid under the schema can begin with a token of this model's vocabulary "
                             "(a schema no value satisfies, e.g. a $ref that only refers to itself, or one that "
                             "needs characters the vocabulary cannot write)") from None
        return grammar
