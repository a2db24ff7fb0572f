"""A pretrained model's own tokenizer: its vocabulary, merges and special tokens, as they came.

tokennet's own tokenizers (``text.py``) reserve ids 0..3 for ``<pad> <bos> <eos> <unk>``; an imported
model was trained with another vocabulary whose ids are fixed by its weights, so its tokenizer keeps
them: ``bos_id``, ``eos_id``, ``pad_id`` and ``unk_id`` are whatever the source says. The Rust engine
of Hugging Face ``tokenizers`` does the work, as for tokennet's BPE.

Unlike tokennet's own tokenizers, special-token strings in the text (``<|im_start|>``) encode to their
ids: chat templates are written that way.

A chat template is rendered as transformers renders it, in jinja2's sandbox (:mod:`.chat_template`).

Built from a GGUF file's ``tokenizer.ggml.*`` fields (byte-level BPE, llama.cpp's ``gpt2`` model) and
saved as ``{"tokennet": {"kind": "pretrained", ...ids, chat template}, "engine": <tokenizer JSON>}``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from ..errors import ConfigError, DataError, one_line
from ..jsonio import MAX_JSON_DEPTH, JSONTooDeep, json_depth
from ..jsonio import load as load_json
from .chat_template import render_chat_template
from .text import SpecialIds, Tokenizer, _as_id_list, register_saved_kind

__all__ = ["PretrainedTokenizer"]


def _read_json(path) -> dict[str, Any]:
    """A JSON object from ``path``; {} if the file is absent; DataError if it is not a JSON object."""
    if not path.is_file():
        return {}
    try:
        data = load_json(path)  # nesting bounded (JSONTooDeep); not UTF-8 and parse errors are ValueErrors too
    except ValueError as error:
        raise DataError(f"{path} is not valid JSON: {one_line(error)[:200]}") from None
    if not isinstance(data, dict):
        raise DataError(f"{path} is not a JSON object")
    return data


def _engine_from_file(path: Path) -> HFTokenizer:
    """The Rust engine of a ``tokenizer.json``, its text's nesting bounded first as :mod:`tokennet.jsonio` bounds
    every JSON document tokennet reads (the engine parses the text itself); one DataError line otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
        if json_depth(text) > MAX_JSON_DEPTH:
            raise JSONTooDeep(f"{path}: JSON nested {json_depth(text)} levels deep; at most {MAX_JSON_DEPTH} "
                              "are accepted")
        return HFTokenizer.from_str(text)
    except JSONTooDeep:
        raise
    except Exception as error:  # noqa: BLE001 - the engine raises a bare Exception on malformed files
        raise DataError(f"{path} is not a Hugging Face tokenizer.json: {one_line(error)[:200]}") from None


# llama.cpp's pre-tokenizer names (tokenizer.ggml.pre) → the Hugging Face pre-tokenizer that splits the same way.
# "smollm" (like "starcoder", "refact"): each digit alone, then GPT-2's regex (llama-vocab.cpp's regex_exprs).
_DIGITS_THEN_GPT2 = ("smollm", "starcoder", "refact", "codeshell", "exaone", "minerva")
CONTROL = 3  # llama.cpp's token type of control tokens (<|endoftext|>, <|im_start|>, ...)
USER_DEFINED = 4  # llama.cpp's token type of added tokens that are not special (matched whole, printed as text)


def _pre_tokenizer(pre: str | None, where: str):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in (None, "default", "gpt2", "gpt-2"):
        return byte_level
    if pre in _DIGITS_THEN_GPT2:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    raise ConfigError(f"{where}: GGUF field tokenizer.ggml.pre={pre!r} is not supported (supported: gpt2, "
                      f"{', '.join(_DIGITS_THEN_GPT2)}); nothing was written")


class PretrainedTokenizer(SpecialIds, Tokenizer):
    """A foreign vocabulary's tokenizer with its own special-token ids (see the module docstring).

    Args:
        engine: a ``tokenizers.Tokenizer``.
        bos_id, eos_id, pad_id, unk_id: the source's special ids (None where it has none).
        chat_template: the source's Jinja chat template, if any.
        chat_template_source: where the template came from (a file), named in the template's errors.
    """

    kind = "pretrained"

    def __init__(self, engine: HFTokenizer, *, bos_id: int | None, eos_id: int | None, pad_id: int | None = None,
                 unk_id: int | None = None, chat_template: str | None = None, add_special: bool = False,
                 chat_template_source: str | None = None):
        self._engine = engine
        self.add_special = add_special  # encode() applies the source's template, e.g. BERT's [CLS] … [SEP]
        self._ids = {"bos_id": bos_id, "eos_id": eos_id, "pad_id": pad_id, "unk_id": unk_id}
        n = self.vocab_size
        for k, v in self._ids.items():
            if v is not None and not 0 <= v < n:
                raise DataError(f"{k}={v} is outside the tokenizer's vocabulary of {n} tokens")
        self.chat_template = chat_template
        self.chat_template_source = chat_template_source

    @property
    def vocab_size(self) -> int:
        return self._engine.get_vocab_size(with_added_tokens=True)

    @property
    def stop_ids(self) -> list[int]:
        """Ids that end a generated text (the source's end of sequence / end of turn)."""
        return [] if self._ids["eos_id"] is None else [self._ids["eos_id"]]

    def encode(self, text: str | bytes, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        text = text.encode("utf-8", errors="replace").decode("utf-8")  # lone surrogates → U+FFFD
        ids = self._engine.encode(text, add_special_tokens=self.add_special).ids
        return ([self.bos_id] if add_bos else []) + ids + ([self.eos_id] if add_eos else [])

    def decode(self, ids: Any, *, skip_special: bool = True) -> str:
        return self._engine.decode(_as_id_list(ids, self.vocab_size), skip_special_tokens=skip_special)

    def decode_continuation(self, ids: Any, *, skip_special: bool = True) -> str:
        """The text ``ids`` add after earlier text. A SentencePiece-style decoder (``Metaspace``, or a ``Strip`` of
        the first space: Llama 2, Mistral) drops the first piece's leading space in ``decode``; here the ids are
        decoded after an anchor token and the anchor's text is cut off, so that space stays."""
        ids = _as_id_list(ids, self.vocab_size)
        anchor = self._anchor()
        if anchor is None or not ids:
            return self.decode(ids, skip_special=skip_special)
        head = self._engine.decode([anchor], skip_special_tokens=False)
        text = self._engine.decode([anchor] + ids, skip_special_tokens=skip_special)
        return text[len(head):] if text.startswith(head) else self.decode(ids, skip_special=skip_special)

    def _anchor(self) -> int | None:
        """A token to decode continuations after, for a decoder that strips a text's first space (else None)."""
        if not hasattr(self, "_anchor_id"):
            self._anchor_id = None
            decoder = json.dumps(json.loads(self._engine.to_str()).get("decoder"))
            if '"Metaspace"' in decoder or '"Strip"' in decoder:
                for text in ("a", "x", "0", "."):
                    ids = self._engine.encode(text, add_special_tokens=False).ids
                    if ids and self._engine.decode(ids[-1:], skip_special_tokens=False).strip():
                        self._anchor_id = ids[-1]
                        break
        return self._anchor_id

    @property
    def special_tokens(self) -> dict[str, str]:
        """The source's special tokens as text, ``{"bos_token": "<s>", "eos_token": ..., "pad_token": ...,
        "unk_token": ...}`` where it has them: what transformers passes a chat template."""
        out = {}
        for name in ("bos", "eos", "unk", "pad"):
            i = self._ids[f"{name}_id"]
            token = None if i is None else self._engine.id_to_token(i)
            if token is not None:
                out[f"{name}_token"] = token
        return out

    def apply_chat_template(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
                            tools: list[dict[str, Any]] | None = None, documents: list[dict[str, Any]] | None = None,
                            where: str | None = None, **variables: Any) -> str:
        """The prompt text of a conversation, rendered with the source's chat template as transformers renders it,
        in jinja2's sandbox (see :mod:`tokennet.tokens.chat_template`; needs ``jinja2``).

        ``where`` names the template in errors (e.g. the run directory; by default this tokenizer and the file
        the template came from); one-line DataErrors as there.
        """
        if not self.chat_template:
            raise DataError(f"{where or 'this tokenizer'} has no chat template")
        name = where or "this tokenizer" + (f" (from {self.chat_template_source})" if self.chat_template_source
                                            else "")
        return render_chat_template(self.chat_template, messages, where=name,
                                    add_generation_prompt=add_generation_prompt, tools=tools, documents=documents,
                                    special_tokens=self.special_tokens, **variables)

    def to_dict(self) -> dict[str, Any]:
        meta = {"kind": self.kind, **self._ids, "chat_template": self.chat_template, "add_special": self.add_special}
        if self.chat_template_source:
            meta["chat_template_source"] = self.chat_template_source
        return {"tokennet": meta,
                "engine": json.loads(self._engine.to_str())}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PretrainedTokenizer:
        meta = data["tokennet"]
        try:
            engine = HFTokenizer.from_str(json.dumps(data["engine"]))
        except Exception as error:  # noqa: BLE001 - the engine raises a bare Exception on malformed JSON
            raise DataError(f"not a valid pretrained tokenizer: {one_line(error)}") from None
        ids = {k: meta.get(k) for k in ("bos_id", "eos_id", "pad_id", "unk_id")}
        for k, v in ids.items():
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise DataError(f"not a valid pretrained tokenizer: {k} is {type(v).__name__}, not a token id")
        template = meta.get("chat_template")
        if template is not None and not isinstance(template, str):
            raise DataError("not a valid pretrained tokenizer: chat_template is not a string")
        source = meta.get("chat_template_source")
        return cls(engine, **ids, chat_template=template, add_special=bool(meta.get("add_special", False)),
                   chat_template_source=source if isinstance(source, str) else None)

    @classmethod
    def from_file(cls, path, *, add_special: bool = True) -> PretrainedTokenizer:
        """A Hugging Face ``tokenizer.json`` (e.g. BERT's WordPiece); specials looked up by BERT's names.

        The file's own truncation and padding settings are dropped: tokennet pads and truncates itself.
        """
        engine = _engine_from_file(Path(path))
        engine.no_truncation()
        engine.no_padding()
        ids = {k: engine.token_to_id(t) for k, t in
               (("bos_id", "[CLS]"), ("eos_id", "[SEP]"), ("pad_id", "[PAD]"), ("unk_id", "[UNK]"))}
        return cls(engine, **ids, add_special=add_special)

    @classmethod
    def from_hf_dir(cls, source, *, vocab_size: int | None = None) -> PretrainedTokenizer | None:
        """A causal LM's tokenizer from a Hugging Face checkpoint directory, or None if it has none.

        Reads ``tokenizer.json`` (any model the Rust engine knows: byte-level BPE for GPT-2 and Llama 3,
        SentencePiece-style BPE for Llama 2) or, failing that, GPT-2's ``vocab.json`` + ``merges.txt``.
        Special tokens and the chat template come from ``tokenizer_config.json`` (the template from
        ``chat_template.jinja`` where present), ids missing there from
        ``config.json``'s ``bos_token_id`` / ``eos_token_id``. ``encode`` applies the file's own
        post-processor (Llama's leading ``<s>``), so ids equal ``AutoTokenizer(text).input_ids``.
        ``vocab_size``: the model's; a tokenizer with ids outside it is refused.
        """
        source = Path(source)
        if (source / "tokenizer.json").is_file():
            engine = _engine_from_file(source / "tokenizer.json")
            engine.no_truncation()
            engine.no_padding()
        elif (source / "vocab.json").is_file() and (source / "merges.txt").is_file():
            try:
                engine = HFTokenizer(models.BPE.from_file(str(source / "vocab.json"), str(source / "merges.txt")))
            except Exception as error:  # noqa: BLE001
                raise DataError(f"{source}: vocab.json / merges.txt are not a BPE vocabulary: "
                                f"{one_line(error)}") from None
            engine.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
            engine.decoder = decoders.ByteLevel()
        else:
            return None
        meta = _read_json(source / "tokenizer_config.json")
        cfg = _read_json(source / "config.json")
        added = meta.get("added_tokens_decoder") or {}
        if not isinstance(added, dict):
            raise DataError(f"{source / 'tokenizer_config.json'}: added_tokens_decoder is not an object")
        for entry in added.values():  # vocab.json + merges.txt keep specials here
            content = entry.get("content") if isinstance(entry, dict) else None
            if isinstance(content, str) and content and entry.get("special") and engine.token_to_id(content) is None:
                engine.add_special_tokens([AddedToken(entry["content"], special=True, normalized=False)])
        if engine.token_to_id("<|endoftext|>") is not None and not (source / "tokenizer.json").is_file():
            engine.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])

        def special(name: str) -> int | None:
            tok = meta.get(f"{name}_token")
            if isinstance(tok, dict):
                tok = tok.get("content")
            if isinstance(tok, str):
                i = engine.token_to_id(tok)
                if i is None:
                    raise DataError(f"{source / 'tokenizer_config.json'}: {name}_token {tok!r} is not in the "
                                    "vocabulary")
                return i
            i = cfg.get(f"{name}_token_id")
            return i if isinstance(i, int) else None

        template, template_file = meta.get("chat_template"), source / "tokenizer_config.json"
        if isinstance(template, list):  # named templates ([{"name": "default", "template": ...}, ...]): the default
            template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"),
                            None)
        if (source / "chat_template.jinja").is_file():  # where transformers ≥ 4.50 saves it
            template, template_file = (source / "chat_template.jinja").read_text(), source / "chat_template.jinja"
        template = template if isinstance(template, str) else None
        tokenizer = cls(engine, bos_id=special("bos"), eos_id=special("eos"), pad_id=special("pad"),
                        unk_id=special("unk"), chat_template=template, add_special=True,
                        chat_template_source=str(template_file) if template else None)
        if vocab_size is not None and tokenizer.vocab_size > vocab_size:
            raise DataError(f"{source}: the tokenizer has {tokenizer.vocab_size} tokens but the model {vocab_size}; "
                            "they do not belong together; nothing was written")
        return tokenizer

    @classmethod
    def from_gguf_fields(cls, *, model: str | None, pre: str | None, tokens: list[str], token_types: list[int] | None,
                         merges: list[str] | None, bos_id: int | None, eos_id: int | None, pad_id: int | None = None,
                         unk_id: int | None = None, chat_template: str | None = None,
                         where: str = "GGUF") -> PretrainedTokenizer:
        """Rebuild a byte-level BPE tokenizer from a GGUF file's ``tokenizer.ggml.*`` fields."""
        if model != "gpt2":
            raise ConfigError(f"{where}: GGUF field tokenizer.ggml.model={model!r} is not supported (tokennet reads "
                              "byte-level BPE vocabularies, 'gpt2'); nothing was written")
        if not tokens or not merges:
            raise DataError(f"{where} has no tokenizer vocabulary or merges")
        vocab = {t: i for i, t in enumerate(tokens)}
        if len(vocab) != len(tokens):
            raise DataError(f"{where}: the tokenizer vocabulary has duplicate tokens")
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        try:
            engine = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, unk_token=None, fuse_unk=False,
                                            byte_fallback=False, ignore_merges=False))
        except Exception as error:  # noqa: BLE001 - the engine raises a bare Exception (e.g. a merge of unknown tokens)
            raise DataError(f"{where}: the tokenizer's vocabulary and merges do not fit together: "
                            f"{one_line(error)}") from None
        engine.pre_tokenizer = _pre_tokenizer(pre, where)
        engine.decoder = decoders.ByteLevel()
        types = token_types or []
        special = [AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == CONTROL]
        engine.add_special_tokens(special)
        # llama.cpp matches user-defined tokens whole in any text, special or not: added tokens that are not special
        added = [AddedToken(tokens[i], special=False, normalized=False) for i, t in enumerate(types)
                 if t == USER_DEFINED]
        engine.add_tokens(added)
        return cls(engine, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id, unk_id=unk_id, chat_template=chat_template,
                   chat_template_source=where if chat_template else None)


register_saved_kind("pretrained", PretrainedTokenizer.from_dict)  # tokenizer_from_dict rebuilds a saved one
