"""Byte-level BPE training in plain Python: the algorithm of the lecture, for reading.

1. Split the text into pre-tokens with a regex (``"gpt4"``: words, numbers, punctuation runs,
   whitespace), so merges never cross a word boundary.
2. Write each pre-token as its UTF-8 bytes and count how often each distinct pre-token occurs.
3. Count every adjacent pair of symbols inside the pre-tokens, weighted by those counts.
4. Merge the most frequent pair into one new symbol everywhere; record the merge; repeat.

Ties between equally frequent pairs go to the pair whose symbols entered the vocabulary first (the
256 bytes in the order of GPT-2's printable byte alphabet, then merged symbols in the order they
were made), which is the rule of the Rust engine ``BPETokenizer`` trains with; a test holds the two
equal. This version recounts every pair after each merge: O(merges × text), fine for a page of text.
"""

from __future__ import annotations

from collections import Counter

from tokenizers import Regex, pre_tokenizers

from tokennet.tokens.text import PATTERNS, bytes_to_unicode

Pair = tuple[bytes, bytes]


def pretokenize(text: str, pattern: str = "gpt4") -> list[str]:
    """Split ``text`` into pre-tokens with a named or custom regex.

    Python's ``re`` has no ``\\p{L}``, so the split uses the same regex engine as the fast tokenizer;
    everything after it is plain Python.
    """
    split = pre_tokenizers.Split(Regex(PATTERNS.get(pattern, pattern)), behavior="isolated")
    return [piece for piece, _span in split.pre_tokenize_str(text)]


def merge_word(word: tuple[bytes, ...], pair: Pair) -> tuple[bytes, ...]:
    """Replace each occurrence of ``pair`` in ``word``, scanning left to right, by one symbol."""
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def train_bpe(text: str, num_merges: int, pattern: str = "gpt4", min_frequency: int = 2) -> list[Pair]:
    """Learn up to ``num_merges`` byte-pair merges from ``text``.

    Args:
        text: the training text.
        num_merges: how many merges to learn at most.
        pattern: ``"gpt2"``, ``"gpt4"`` or a custom regex for pre-tokenization.
        min_frequency: stop when the most frequent pair occurs fewer times than this.

    Returns:
        The merges in the order learned, each a pair of byte strings.
    """
    words = Counter(tuple(bytes([byte]) for byte in piece.encode("utf-8")) for piece in pretokenize(text, pattern))
    alphabet = bytes_to_unicode()
    order = {bytes([byte]): rank for rank, byte in enumerate(sorted(range(256), key=lambda byte: alphabet[byte]))}
    merges: list[Pair] = []
    for _ in range(num_merges):
        pairs: Counter[Pair] = Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:], strict=False):
                pairs[pair] += count
        if not pairs:
            break
        best = max(pairs, key=lambda candidate: (pairs[candidate], -order[candidate[0]], -order[candidate[1]]))
        if pairs[best] < min_frequency:
            break
        merges.append(best)
        order.setdefault(best[0] + best[1], len(order))
        merged: Counter[tuple[bytes, ...]] = Counter()
        for word, count in words.items():
            merged[merge_word(word, best)] += count
        words = merged
    return merges
