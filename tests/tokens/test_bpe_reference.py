"""The readable BPE trainer learns exactly the merges of the fast engine behind BPETokenizer."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokennet.tokens import BPETokenizer
from tokennet.tokens.bpe_reference import merge_word, pretokenize, train_bpe
from tokennet.tokens.text import bytes_to_unicode

CORPUS = (
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs off.\n"
    "She sells sea shells by the sea shore, and the shells she sells are sea shells.\n"
    "In 1984, 2001 and 2049 the numbers were 12345 and 678; naïve café owners said 'hello'.\n"
    "Über straße, 東京 and 大阪 — unicode too!\n\n"
) * 6


def engine_merges(tok: BPETokenizer) -> list[tuple[bytes, bytes]]:
    """The engine's merges, mapped from GPT-2's byte alphabet back to bytes."""
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    merges = tok.to_dict()["model"]["merges"]
    return [tuple(bytes(byte_of[c] for c in side) for side in m) for m in merges]


def test_bytes_to_unicode_is_a_bijection_onto_printable_characters():
    table = bytes_to_unicode()
    assert sorted(table) == list(range(256)) and len(set(table.values())) == 256
    assert table[ord("A")] == "A" and table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ"
    assert all(c.isprintable() for c in table.values())


def test_merge_word_is_left_to_right_and_non_overlapping():
    a = b"a"
    assert merge_word((a, a, a), (a, a)) == (b"aa", a)
    assert merge_word((a, a, a, a), (a, a)) == (b"aa", b"aa")
    assert merge_word((b"x", a), (a, a)) == (b"x", a)


@pytest.mark.parametrize("pattern", ["gpt4", "gpt2"])
def test_pretokenize_partitions_the_text(pattern):
    pieces = pretokenize(CORPUS, pattern)
    assert "".join(pieces) == CORPUS and len(pieces) > 100
    assert " fox" in pieces


@pytest.mark.parametrize("pattern", ["gpt4", "gpt2"])
def test_reference_merges_equal_engine_merges(pattern):
    num_merges = 120
    reference = train_bpe(CORPUS, num_merges, pattern=pattern)
    fast = engine_merges(BPETokenizer.train(CORPUS, 260 + num_merges, pattern=pattern))
    assert len(reference) == num_merges
    assert reference == fast


@settings(max_examples=40, deadline=None)
@given(
    text=st.text(alphabet="ab é\n東x!1\t", min_size=1, max_size=200),
    pattern=st.sampled_from(["gpt2", "gpt4", r"\S+|\s+"]),
    min_frequency=st.integers(1, 3),
)
def test_reference_equals_engine_on_random_text(text, pattern, min_frequency):
    # Small alphabets make many equal counts, so this checks the tie-break rule as well.
    reference = train_bpe(text, 40, pattern=pattern, min_frequency=min_frequency)
    fast = engine_merges(BPETokenizer.train(text, 260 + 40, pattern=pattern, min_frequency=min_frequency))
    assert fast[: len(reference)] == reference
    # Two merges spelling the same string add one token, so the engine may fit more merges into
    # the same vocab_size; otherwise both stop at the same point.
    assert len(fast) == len(reference) or len(reference) == 40
