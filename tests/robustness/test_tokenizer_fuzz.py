"""``tokenizer.json`` files damaged every way: tokennet's own (char, BPE, an imported model's), a Hugging Face
``tokenizer.json`` (``PretrainedTokenizer.from_file``) and an HF directory's ``tokenizer.json`` and
``tokenizer_config.json`` (``from_hf_dir``). Each reads, or fails with one line; none changes the file."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from robustness.fuzzing import FUZZ, check_cli, check_reader, mutated, mutated_json

from tokennet.errors import TokennetError
from tokennet.tokens.pretrained import PretrainedTokenizer
from tokennet.tokens.sentencepiece import SentencePieceTokenizer
from tokennet.tokens.text import load_tokenizer, train_tokenizer

tokenizers = pytest.importorskip("tokenizers")

TEXT = "the quick brown fox jumps over the lazy dog. " * 20


@pytest.fixture(scope="module")
def engine():
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator([TEXT], vocab_size=280, min_frequency=1, special_tokens=["<s>", "</s>"])
    return bpe._tokenizer


@pytest.fixture(scope="module")
def seeds(engine):
    """The seed documents: what each kind of tokenizer writes."""
    return {
        "char": train_tokenizer("char", TEXT).to_dict(),
        "bpe": train_tokenizer("bpe", TEXT, vocab_size=280).to_dict(),
        "pretrained": PretrainedTokenizer(engine, bos_id=engine.token_to_id("<s>"), eos_id=engine.token_to_id("</s>"),
                                          chat_template="{% for m in messages %}{{ m.content }}{% endfor %}").to_dict(),
        "hf": json.loads(engine.to_str()),
        "sentencepiece": _sentencepiece().to_dict(),
        "hf_config": {"bos_token": "<s>", "eos_token": {"content": "</s>"}, "chat_template": "{{ messages }}",
                      "added_tokens_decoder": {"0": {"content": "<s>", "special": True}}},
    }


def _sentencepiece() -> SentencePieceTokenizer:
    """A small SentencePiece vocabulary as a GGUF file's Gemma holds it: specials, byte pieces, characters, merges."""
    pieces = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "\n\n"]
    types = [3, 3, 3, 3, 3, 4]
    pieces += [f"<0x{b:02X}>" for b in range(256)] + list("abcdefghijklmnopqrstuvwxyz") + ["\u2581", "\u2581t", "th"]
    types += [6] * 256 + [1] * 29
    scores = [0.0] * (len(pieces) - 29) + [-10.0 - i for i in range(29)]
    return SentencePieceTokenizer(pieces, scores, types, bos_id=2, eos_id=1, pad_id=0, unk_id=3, add_bos=True,
                                  chat_template="{% for m in messages %}{{ m.content }}{% endfor %}")


def _use(tok):
    """A tokenizer that loaded must also work: encode and decode a text with a character it never saw."""
    tok.decode(tok.encode("the fox é 1"))
    return tok


def _read(kind: str, data: bytes, engine) -> object:
    d = Path(tempfile.mkdtemp(prefix="tok-fuzz-"))
    try:
        if kind in ("char", "bpe", "pretrained", "sentencepiece"):
            f = d / "tokenizer.json"
            f.write_bytes(data)
            return check_reader(lambda: _use(load_tokenizer(f)), f)
        if kind == "hf":  # both readers of a Hugging Face tokenizer.json
            f = d / "tokenizer.json"
            f.write_bytes(data)
            (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
            check_reader(lambda: _use(PretrainedTokenizer.from_file(f)), f)
            return check_reader(lambda: _use(PretrainedTokenizer.from_hf_dir(d, vocab_size=300)), f)
        f = d / "tokenizer_config.json"
        f.write_bytes(data)
        (d / "tokenizer.json").write_text(engine.to_str())
        return check_reader(lambda: _use(PretrainedTokenizer.from_hf_dir(d, vocab_size=300)), f)
    finally:
        shutil.rmtree(d)


KINDS = ["char", "bpe", "pretrained", "sentencepiece", "hf", "hf_config"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_seeds_read(seeds, engine, kind):
    out = _read(kind, json.dumps(seeds[kind]).encode(), engine)
    assert not isinstance(out, TokennetError), out


@pytest.mark.parametrize("kind", KINDS)
@FUZZ
@given(data=st.data())
def test_damaged_bytes_are_one_line(seeds, engine, kind, data):
    seed = json.dumps(seeds[kind]).encode()
    damaged = data.draw(mutated(seed, hot=len(seed)), label="mutation").data
    _read(kind, damaged, engine)


@pytest.mark.parametrize("kind", KINDS)
@FUZZ
@given(data=st.data())
def test_wrong_json_values_are_one_line(seeds, engine, kind, data):
    """Valid JSON with a value of another type anywhere in the tree, a key dropped, or nesting 100,000 deep."""
    damaged = data.draw(mutated_json(seeds[kind]), label="mutation").data
    _read(kind, damaged, engine)


def test_a_bpe_vocabulary_with_gaps_in_its_ids_is_one_line(seeds, engine):
    """Found by the fuzzing: ids past the vocabulary's size made ``BPETokenizer`` index out of its table."""
    doc = json.loads(json.dumps(seeds["bpe"]))
    vocab = doc["model"]["vocab"]
    last = max(vocab, key=vocab.get)
    vocab[last] = 10_000
    out = _read("bpe", json.dumps(doc).encode(), engine)
    assert isinstance(out, TokennetError) and "id 10000" in str(out), out


@pytest.mark.parametrize("kind_value", [[], {}, 3, None])
def test_a_tokenizer_kind_of_the_wrong_type_is_one_line(seeds, engine, kind_value):
    """Found by the fuzzing in CI: a list as ``"kind"`` raised ``TypeError: unhashable type`` from the lookup."""
    doc = json.loads(json.dumps(seeds["sentencepiece"]))
    doc["tokennet"]["kind"] = kind_value
    out = _read("sentencepiece", json.dumps(doc).encode(), engine)
    assert isinstance(out, TokennetError) and "unknown tokenizer kind" in str(out), out


def test_cli_generate_with_a_damaged_tokenizer_is_one_line(tmp_path, corpus):
    from tokennet.cli import main

    run = tmp_path / "run"
    assert main(["-q", "train", "gpt-char", "--data", str(corpus), "--out", str(run), "--max-iters", "1", "--set",
                 "dim=16", "num_layers=1", "num_heads=2", "block_size=8", "batch_size=2", "eval_iters=1",
                 "sample_tokens=0", "eval_interval=0"]) == 0
    f = run / "tokenizer.json"
    for damaged in (f.read_bytes()[:40], b"[" * 100_000 + b"]" * 100_000, b'{"tokennet": {"kind": "char"}}'):
        f.write_bytes(damaged)
        code, err = check_cli(["-q", "generate", str(run), "--prompt", "line", "--max-new-tokens", "2"], f)
        assert code == 2 and "tokenizer" in err, err
