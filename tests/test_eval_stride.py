"""tokennet eval --stride: sliding-window perplexity and bits per byte of a language-model run on a text file."""

import json
import math

import pytest
import torch

import tokennet
from tokennet.cli import main
from tokennet.data.text import shakespeare

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["dim=32", "num_layers=1", "num_heads=2", "block_size=32", "batch_size=8", "eval_iters=1", "sample_tokens=0",
        "eval_interval=0"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A character-level gpt trained a little on Tiny Shakespeare (so that more context helps), and a held-out text."""
    root = tmp_path_factory.mktemp("stride")
    text = shakespeare()
    (root / "train.txt").write_text(text[:200_000])
    (root / "held.txt").write_text(text[-6_000:])
    assert main(["-q", "train", "gpt-char", "--data", str(root / "train.txt"), "--out", str(root / "run"),
                 "--max-iters", "400", "--set", *TINY, "lr=3e-3"]) == 0
    return tokennet.load(root / "run"), root / "held.txt"


def _hf_reference(model, ids: list[int], max_length: int, stride: int) -> tuple[float, int]:
    """Hugging Face's documented sliding-window loop (docs/transformers/perplexity), summing NLL over scored tokens."""
    x = torch.tensor([ids])
    seq_len = x.size(1)
    total, count, prev_end = 0.0, 0, 0
    for begin in range(0, seq_len, stride):
        end = min(begin + max_length, seq_len)
        trg_len = end - prev_end  # may differ from stride on the last loop
        input_ids = x[:, begin:end]
        target_ids = input_ids.clone()
        target_ids[:, :-trg_len] = -100
        with torch.no_grad():  # HF's model shifts the labels: position i predicts label i + 1; the last
            shift_logits = model(input_ids[:, :-1]).logits.float()  # position's logits are unused (and past 32)
        shift_labels = target_ids[:, 1:]
        total += float(torch.nn.functional.cross_entropy(shift_logits.flatten(0, 1), shift_labels.flatten(),
                                                         ignore_index=-100, reduction="sum"))
        count += int((shift_labels != -100).sum())
        prev_end = end
        if end == seq_len:
            break
    return total, count


def test_stride_equal_to_window_is_the_non_overlapping_figure(trained):
    run, held = trained
    text = held.read_text()
    whole = run.evaluate_text(text)  # non-overlapping windows (the figure tokennet eval printed before --stride)
    same = run.evaluate_text(text, stride=whole["window"])
    assert whole["window"] == 32 and whole["stride"] == 32
    assert same["loss"] == pytest.approx(whole["loss"], rel=1e-6)
    assert same["tokens"] == whole["tokens"] == len(run.tokenizer.encode(text)) - 1  # every token after the first
    # and by hand: non-overlapping windows of 32 inputs + 1 target token
    ids = run.tokenizer.encode(text)
    total = 0.0
    with torch.no_grad():
        for b in range(0, len(ids) - 1, 32):
            row = torch.tensor([ids[b:b + 33]])
            total += float(torch.nn.functional.cross_entropy(run.model(row[:, :-1]).logits[0].float(), row[0, 1:],
                                                             reduction="sum"))
    assert whole["loss"] == pytest.approx(total / (len(ids) - 1), rel=1e-5)


@pytest.mark.parametrize("stride", [1, 7, 16, 31])
def test_sliding_window_equals_hugging_face_loop(trained, stride):
    run, held = trained
    text = held.read_text()[:1500]
    got = run.evaluate_text(text, stride=stride, batch_size=5)
    ids = run.tokenizer.encode(text)
    total, count = _hf_reference(run.model, ids, max_length=33, stride=stride)  # 32 inputs + the scored token
    assert got["tokens"] == count == len(ids) - 1
    assert got["loss"] == pytest.approx(total / count, rel=1e-5)


def test_smaller_stride_does_not_raise_perplexity(trained):
    run, held = trained
    text = held.read_text()
    ppl = {s: run.evaluate_text(text, stride=s)["perplexity"] for s in (32, 16, 4)}
    # more context per scored token: lower (a trained model uses it), never much higher
    assert ppl[16] < ppl[32] and ppl[4] < ppl[32]
    assert ppl[4] <= ppl[16] * 1.01


def test_bits_per_byte_by_hand(trained, tmp_path):
    run, _ = trained
    text = "Thou art a villain — ’tis so, my lord.\n" * 3  # non-ASCII: bytes differ from characters
    m = run.evaluate_text(text, stride=8)
    assert m["bytes"] == len(text.encode("utf-8")) > len(text)
    assert m["bits_per_byte"] == pytest.approx(m["loss"] * m["tokens"] / math.log(2) / m["bytes"], rel=1e-9)
    # and from the log-probabilities, one token at a time: x_t is scored by the first window reaching it,
    # the one starting at b = 8·ceil((t − 32) / 8) (0 for t <= 32), which reads x_b … x_{t-1}
    ids = run.tokenizer.encode(text)
    nll = 0.0
    with torch.no_grad():
        for t in range(1, len(ids)):
            b = 8 * math.ceil((t - 32) / 8) if t > 32 else 0
            logits = run.model(torch.tensor([ids[b:t]])).logits[0, -1].float()
            nll -= float(torch.log_softmax(logits, -1)[ids[t]])
    assert m["bits_per_byte"] == pytest.approx(nll / math.log(2) / len(text.encode("utf-8")), rel=1e-5)


def test_cli_stride(trained, capsys, tmp_path):
    run, held = trained
    assert main(["eval", str(run.path), "--data", str(held), "--stride", "16"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["stride"] == 16 and m["window"] == 32 and "bits_per_byte" in m
    assert m["loss"] == pytest.approx(run.evaluate_text(held.read_text(), stride=16)["loss"], rel=1e-6)
    # bad input: one line, exit 2
    assert main(["eval", str(run.path), "--stride", "16"]) == 2
    assert "--data" in capsys.readouterr().err
    assert main(["eval", str(run.path), "--data", str(held), "--stride", "33"]) == 2
    assert "stride must be between 1 and the window of 32" in capsys.readouterr().err
