"""Tests for the char and byte-level BPE tokenizers: round trips, specials, errors, save/load."""

import json

import numpy as np
import pytest
import tokenizers
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tokennet.errors import DataError
from tokennet.tokens import (
    SPECIAL_TOKENS,
    BPETokenizer,
    CharTokenizer,
    Tokenizer,
    load_tokenizer,
    tokenizer_from_dict,
    train_tokenizer,
)
from tokennet.tokens import text as text_module

CORPUS = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune,\n"
    "must be in want of a wife. However little known the feelings or views of such a man may be\n"
    "on his first entering a neighbourhood, this truth is so well fixed in the minds of the\n"
    "surrounding families, that he is considered the rightful property of some one or other of\n"
    "their daughters. Numbers: 12 < 345 > 6789. Café, naïve, 東京, emoji 🙂 and tabs\tand  spaces.\n\n"
) * 8

# Valid Unicode scalar values: every code point except the surrogates.
unicode_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=200)
SETTINGS = settings(max_examples=60, deadline=None)


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    return BPETokenizer.train(CORPUS, vocab_size=400)


@pytest.fixture(scope="module")
def char() -> CharTokenizer:
    return CharTokenizer.train(CORPUS)


@pytest.mark.parametrize("name", ["bpe", "char"])
def test_specials_at_fixed_ids(name, request):
    tok = request.getfixturevalue(name)
    assert isinstance(tok, Tokenizer) and tok.kind == name
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
    assert tok.decode([0, 1, 2, 3], skip_special=False) == "".join(SPECIAL_TOKENS)
    assert tok.decode([0, 1, 2, 3]) == "\ufffd"  # pad/bos/eos dropped, unk rendered as U+FFFD
    assert len(tok) == tok.vocab_size


@pytest.mark.parametrize("name", ["bpe", "char"])
def test_bos_eos_and_batch(name, request):
    tok = request.getfixturevalue(name)
    ids = tok.encode("a man", add_bos=True, add_eos=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert tok.decode(ids) == "a man"
    assert tok.decode(ids, skip_special=False) == "<bos>a man<eos>"
    texts = ["a wife", "", CORPUS[:500]]
    assert tok.encode_batch(texts, add_eos=True) == [tok.encode(t, add_eos=True) for t in texts]
    assert tok.decode_batch(tok.encode_batch(texts)) == texts


@pytest.mark.parametrize("name", ["bpe", "char"])
def test_special_strings_in_text_stay_text(name, request):
    tok = request.getfixturevalue(name)
    s = "the <eos> is <pad><bos><unk> text"
    ids = tok.encode(s)
    assert not set(ids) & {0, 1, 2, 3}
    assert tok.decode(ids) == s


@pytest.mark.parametrize("name", ["bpe", "char"])
def test_decode_accepts_tensors_and_arrays(name, request):
    tok = request.getfixturevalue(name)
    ids = tok.encode("a good fortune")
    assert tok.decode(torch.tensor(ids)) == tok.decode(np.array(ids)) == "a good fortune"
    with pytest.raises(ValueError, match="1-D"):
        tok.decode(torch.tensor([ids]))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([-1])


# ---- char ----


def test_char_vocabulary_is_sorted_characters_after_specials(char):
    assert list(char.chars) == sorted(set(CORPUS))
    assert char.vocab_size == 4 + len(set(CORPUS))
    assert char.encode(char.chars[0]) == [4]


@SETTINGS
@given(st.text(alphabet=sorted(set(CORPUS)), max_size=300))
def test_char_round_trip_over_trained_alphabet(char, s):
    assert char.decode(char.encode(s)) == s
    assert len(char.encode(s)) == len(s)


def test_char_unknown_character_is_unk(char):
    assert char.encode("aZ") == [char.encode("a")[0], char.unk_id]
    assert char.decode(char.encode("aZ")) == "a\ufffd"
    long = "a" * 100 + "Z"  # the vectorized path agrees with the short one
    assert char.encode(long) == [char.encode("a")[0]] * 100 + [char.unk_id]


def test_char_invalid_utf8_and_surrogates(char):
    assert char.encode(b"a\xff") == char.encode("a\ufffd")
    assert char.encode("a\udc80") == char.encode("a\ufffd")
    tok = CharTokenizer.train("ab\ud800")
    assert "\ufffd" in tok.chars and "\ud800" not in tok.chars


# ---- bpe ----


def test_bpe_trains_to_vocab_size_and_never_unk(bpe):
    assert bpe.vocab_size == 400
    assert bpe.unk_id not in bpe.encode(CORPUS + "\x00\x7f𝔘ǅ")
    assert len(bpe.encode(CORPUS)) < len(CORPUS.encode()) / 2


@SETTINGS
@given(unicode_text)
def test_bpe_round_trip_any_unicode(bpe, s):
    assert bpe.decode(bpe.encode(s)) == s


@SETTINGS
@given(
    st.lists(
        st.sampled_from(["<eos>", "<bos>", "<pad>", "<unk>", "<", ">", "eos", " ", "\n", "é"]), max_size=30
    )
)
def test_bpe_round_trip_with_special_strings(bpe, parts):
    s = "".join(parts)
    ids = bpe.encode(s)
    assert bpe.decode(ids) == s and not set(ids) & {0, 1, 2, 3}


def test_bpe_invalid_bytes_and_surrogates_become_replacement_char(bpe):
    assert bpe.decode(bpe.encode(b"ok \xff\xfe end")) == "ok \ufffd\ufffd end"
    assert bpe.encode(b"caf\xc3\xa9") == bpe.encode("café")
    escaped = b"a\xffb".decode("utf-8", "surrogateescape")  # 'a\udcffb'
    assert bpe.decode(bpe.encode(escaped)) == "a\ufffdb"
    with pytest.raises(TypeError):
        bpe.encode(123)


def test_bpe_split_multibyte_character_decodes_to_replacement(bpe):
    ids = bpe.encode("東")
    assert len(ids) >= 1
    byte_ids = [bpe.engine.token_to_id(text_module.bytes_to_unicode()[b]) for b in "東".encode()]
    assert bpe.decode(byte_ids[:2]) == "\ufffd"
    assert bpe.decode(byte_ids) == "東"


@SETTINGS
@given(st.text(alphabet="ab \n\t.,!\r'xyz東🙂1", max_size=300))
def test_bpe_cut_encoding_equals_whole_encoding(bpe, s):
    # Cut every few characters so short texts exercise the cut-and-batch path.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(text_module, "_CUT_CHARS", 5)
        assert bpe.encode(s) == bpe.engine.encode(s, add_special_tokens=False).ids


@pytest.mark.parametrize("pattern", ["gpt2", "gpt4", r"\w+|\s+|[^\w\s]+"])
def test_bpe_patterns(pattern):
    tok = BPETokenizer.train(CORPUS, vocab_size=300, pattern=pattern)
    assert tok.decode(tok.encode(CORPUS)) == CORPUS
    assert tok.pattern == pattern
    again = load_tokenizer_from_dict(tok)
    assert again.pattern == pattern and again.encode(CORPUS) == tok.encode(CORPUS)


def load_tokenizer_from_dict(tok):
    return tokenizer_from_dict(json.loads(json.dumps(tok.to_dict())))


def test_bpe_custom_pattern_cannot_learn_special_strings():
    # With whitespace splitting, "<eos>" is one pre-token and BPE would spell the special token.
    tok = BPETokenizer.train("x <eos> y <eos> <pad>z " * 50, vocab_size=300, pattern=r"\S+|\s+")
    s = "a <eos> <pad>z b"
    ids = tok.encode(s)
    assert tok.decode(ids) == s and not set(ids) & {0, 1, 2, 3}
    assert tok.encode("<eos>")  # still compressible: "<eos" may be one token, just not the special


def test_bpe_accepts_iterables_and_stops_early():
    tok = BPETokenizer.train(iter(["aaaa bbbb", "aaaa"]), vocab_size=1000, min_frequency=2)
    assert 260 < tok.vocab_size < 1000


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"vocab_size": 259}, "at least 260"),
        ({"vocab_size": 10**7}, "at most"),
        ({"vocab_size": 300.0}, "must be an int"),
        ({"pattern": "gpt3"}, "unknown pattern name"),
        ({"pattern": "(unclosed"}, "not a valid regular expression"),
        ({"min_frequency": 0}, "min_frequency"),
    ],
)
def test_bpe_train_validates(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BPETokenizer.train("some text", **kwargs)


def test_empty_training_text_raises():
    with pytest.raises(ValueError, match="no text"):
        BPETokenizer.train("")
    with pytest.raises(ValueError, match="no text"):
        CharTokenizer.train([])


# ---- save / load / factory ----


@pytest.mark.parametrize("name", ["bpe", "char"])
def test_save_load_round_trip(name, request, tmp_path):
    tok = request.getfixturevalue(name)
    written = tok.save(tmp_path / "run")
    assert written == tmp_path / "run" / "tokenizer.json"
    tok.save(tmp_path / "other.json")
    for path in [tmp_path / "run", written, tmp_path / "other.json"]:
        again = load_tokenizer(path)
        assert type(again) is type(tok) and again.vocab_size == tok.vocab_size
        assert again.encode(CORPUS) == tok.encode(CORPUS)
        assert again.encode("<eos>") == tok.encode("<eos>")


def test_saved_bpe_is_hugging_face_json(bpe, tmp_path):
    hf = tokenizers.Tokenizer.from_file(str(bpe.save(tmp_path)))
    assert hf.encode("a good fortune").ids == bpe.encode("a good fortune")
    assert hf.decode(bpe.encode("a good fortune")) == "a good fortune"


def test_load_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_tokenizer(tmp_path / "missing.json")
    with pytest.raises(DataError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "bad.json").write_text("not json")
    with pytest.raises(DataError, match="not valid JSON"):
        load_tokenizer(tmp_path / "bad.json")
    (tmp_path / "config.json").write_text('{"dim": 64}')
    with pytest.raises(DataError, match="not a tokennet tokenizer"):
        load_tokenizer(tmp_path / "config.json")
    (tmp_path / "odd.json").write_text('{"tokennet": {"kind": "wordpiece"}}')
    with pytest.raises(DataError, match="unknown tokenizer kind"):
        load_tokenizer(tmp_path / "odd.json")


def test_foreign_bpe_without_our_specials_is_rejected():
    hf = text_module._new_engine(text_module.GPT4_PATTERN)
    hf.train_from_iterator(["hello hello"], tokenizers.trainers.BpeTrainer(vocab_size=300))
    with pytest.raises(ValueError, match="expected"):
        BPETokenizer(hf)


def test_train_tokenizer_factory():
    assert isinstance(train_tokenizer("char", "abc"), CharTokenizer)
    tok = train_tokenizer("bpe", CORPUS, vocab_size=300, pattern="gpt2")
    assert isinstance(tok, BPETokenizer) and tok.pattern == "gpt2"
    with pytest.raises(ValueError, match="'char', 'bpe'|char, bpe"):
        train_tokenizer("wordpiece", "abc")
    with pytest.raises(ValueError, match="drop vocab_size"):
        train_tokenizer("char", "abc", vocab_size=100)
