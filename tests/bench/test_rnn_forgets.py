"""bench/rnn_forgets.py: the GRU encoder–decoder without attention forgets long inputs, the attention models do not.

The fast test trains the three models briefly (lengths 1–8, 250 steps, dim 32: about 20 CPU seconds in all) —
a size at which the no-attention GRU's exact match falls ~95 points from length 2 to 8 while both attention
models' falls < 30 — and asks :func:`claim` for its verdict with a 25-point margin. The slow test runs the
bench's recorded setting (lengths 1–12, tested up to 24).
"""

import json

import pytest
import torch
from support import load_bench

pytestmark = pytest.mark.usefixtures("one_thread")


def _bench():
    return load_bench("rnn_forgets")


B = _bench()


def test_make_batch_reverses_and_ends_with_eos():
    src, tgt_in, tgt_out = B.make_batch(torch.tensor([3, 1]), torch.Generator().manual_seed(0))
    assert src.shape == (2, 3) and tgt_in.shape == tgt_out.shape == (2, 4)
    assert src[1, 1:].tolist() == [B.PAD, B.PAD]
    assert tgt_out[0].tolist() == [*src[0].flip(0).tolist(), B.EOS]
    assert tgt_out[1].tolist() == [int(src[1, 0]), B.EOS, -100, -100]
    assert tgt_in[0].tolist() == [B.BOS, *src[0].flip(0).tolist()]
    assert ((src >= 3) | (src == B.PAD)).all() and (src < B.VOCAB).all()


def test_claim_verdicts():
    def rows(drops):
        return [{"arch": a, "length": L, "in_training": L <= 8, "exact_match": 100.0 - d * (L > 2)}
                for a, d in drops.items() for L in (2, 8, 16)]

    ok = B.claim(rows({"gru": 90, "gru_attention": 10, "transformer": 5}), (1, 8))
    assert ok["holds"] is True and ok["short"] == 2 and ok["long"] == 8 and ok["drop"]["gru"] == 90
    assert "length 8" in ok["measured"] and "length 16 (untrained)" in ok["measured"]
    assert B.claim(rows({"gru": 30, "gru_attention": 10, "transformer": 5}), (1, 8))["holds"] is False
    assert B.claim(rows({"gru": 90, "gru_attention": 10}), (1, 8))["holds"] is None


@pytest.mark.slow  # ~2 min on 2 cores; test_the_results_file_keeps_the_contract runs the same code tiny
def test_the_gru_without_attention_forgets_and_the_attention_models_do_not():
    res = B.run_experiment(train_lengths=(1, 8), test_lengths=(2, 8), steps=250, dim=32, lr=5e-3, n_eval=100,
                           log=lambda s: None)
    c = B.claim(res["rows"], (1, 8), margin=25.0)
    assert c["holds"], c
    assert c["drop"]["gru"] > 60  # it forgets: most length-8 inputs come back wrong


def test_the_results_file_keeps_the_contract(tmp_path):
    out = tmp_path / "rnn_forgets.json"
    assert B.main(["--steps", "3", "--dim", "16", "--train-lengths", "1", "4", "--test-lengths", "2", "4", "6",
                   "--n-eval", "5", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert set(r["claim"]) >= {"holds", "measured", "run"} and r["claim"]["holds"] in (True, False, None)
    assert "length 6 (untrained)" in r["claim"]["measured"] and "reversal" in r["claim"]["run"]
    assert r["command"].startswith("python bench/rnn_forgets.py") and "cpu" in r["machine"] and "commit" in r
    assert {(x["arch"], x["length"]) for x in r["rows"]} == {(a, L) for a in B.ARCHS for L in (2, 4, 6)}
    assert all(0 <= x["exact_match"] <= 100 and 0 <= x["chrf"] <= 100 for x in r["rows"])
    assert out.with_suffix(".png").stat().st_size > 0
    assert B.main(["--train-lengths", "5", "8", "--test-lengths", "2", "--out", str(out)]) == 2  # no trained length


@pytest.mark.slow
def test_the_recorded_setting_holds():
    res = B.run_experiment(train_lengths=(1, 12), test_lengths=(2, 12, 16), steps=1000, dim=64, n_eval=200,
                           log=lambda s: None)
    assert B.claim(res["rows"], (1, 12))["holds"]
