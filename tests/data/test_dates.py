"""The embedded date-translation generator: formats, the held-out split, determinism, batches."""

import datetime as dt

import pytest
import torch

from tokennet.data.dates import (
    FORMATS,
    DatePairs,
    all_dates,
    alphabet,
    encode_pairs,
    format_date,
    held_out_pairs,
    sample_pairs,
    split_dates,
)
from tokennet.tokens.text import CharTokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


D = dt.date(1999, 3, 3)


def test_the_issue_examples():
    assert format_date(D, "ordinal_of") == "3rd of March 1999"
    assert format_date(D, "mon_d_yy") == "Mar 3, 99"
    assert format_date(D, "ymd_slash") == "1999/3/3"
    assert format_date(D, "weekday_long") == "Wednesday, March 3rd, 1999"
    assert format_date(D, "french") == "3 mars 1999"
    assert format_date(dt.date(2001, 5, 1), "french") == "1er mai 2001"
    assert format_date(D, "german") == "3. März 1999"


@pytest.mark.parametrize("day,want", [(1, "1st"), (2, "2nd"), (3, "3rd"), (4, "4th"), (11, "11th"), (12, "12th"),
                                      (13, "13th"), (21, "21st"), (22, "22nd"), (23, "23rd"), (31, "31st")])
def test_ordinals(day, want):
    assert format_date(dt.date(2000, 1, day), "ordinal_of").startswith(want + " ")


def test_sources_are_unambiguous():
    """No source string stands for two dates (two-digit years: 50-99 → 19xx, 00-49 → 20xx)."""
    seen = {}
    days = [d for d in all_dates() if d.year in (1950, 1999, 2000, 2049)]
    for d in days:
        for f in FORMATS:
            s = format_date(d, f)
            assert seen.setdefault(s, d) == d, f"{s!r} means both {seen[s]} and {d}"


def test_split_is_disjoint_deterministic_and_seeded():
    tr, va, te = split_dates(0, 0.1, 0.02)
    assert len(tr) + len(va) + len(te) == len(all_dates()) == 36525
    assert not (set(tr) & set(te)) and not (set(tr) & set(va)) and not (set(va) & set(te))
    assert split_dates(0, 0.1, 0.02) == (tr, va, te)
    assert split_dates(1, 0.1, 0.02)[2] != te
    with pytest.raises(ValueError):
        split_dates(0, 0.0)


def test_pairs_are_deterministic_and_held_out_pairs_use_test_dates():
    tr, _, te = split_dates(0, 0.1, 0.02)
    assert sample_pairs(tr, 50, "x") == sample_pairs(tr, 50, "x")
    assert sample_pairs(tr, 50, "x") != sample_pairs(tr, 50, "y")
    test_iso = {d.isoformat() for d in te}
    triples = held_out_pairs(0, 300, 0.1, 0.02)
    assert all(t in test_iso for _, t, _ in triples)
    assert {f for _, _, f in triples} == set(FORMATS)  # every format is tested


def test_alphabet_covers_every_source_and_sources_fit_40_chars():
    chars = set(alphabet())
    longest = 0
    for d in all_dates()[::97] + [dt.date(1999, 9, 29)]:  # includes "Wednesday, September 29th, 1999"
        for f in FORMATS.values():
            s = f(d)
            assert set(s) <= chars, s
            longest = max(longest, len(s))
    assert longest <= 40


def test_batches_are_padded_and_deterministic_in_the_index():
    tok = CharTokenizer(alphabet())
    src = DatePairs(split_dates(0)[0], tok, 8, seed=3)
    (s1, t1), y1 = src.batch(5)
    (s2, t2), y2 = src.batch(5)
    assert torch.equal(s1, s2) and torch.equal(t1, t2) and torch.equal(y1, y2)
    assert not torch.equal(src.batch(6)[0][0], s1) or s1.shape != src.batch(6)[0][0].shape
    assert (t1[:, 0] == tok.bos_id).all()
    assert ((y1 == tok.eos_id).sum(1) == 1).all()  # one <eos> per target
    assert torch.equal(t1[:, 1:][y1[:, :-1] != -100], y1[:, :-1][y1[:, :-1] != -100])  # shifted by one


def test_encode_pairs_pads_sources_with_pad():
    tok = CharTokenizer(alphabet())
    (src, _), _ = encode_pairs([("1999/3/3", "1999-03-03"), ("May 4, 16", "2016-05-04")], tok)
    assert src.shape == (2, 9)
    assert (src[0, 8:] == tok.pad_id).all() and (src[1] != tok.pad_id).all()
