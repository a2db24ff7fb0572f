"""Issue 62 item 6, the lecture's two missing ideas as settings of the default recipes: a hard-coded patch matrix
(``tokennet train vit --set patch_projection=dct``) and a character model on the text read backwards
(``tokennet train gpt-char --set reverse=true``). Each run's ``metrics.json`` equals what a fresh evaluation
recomputes from the saved run; a bad value is one line, exit 2, nothing written."""

import json

import pytest
import torch

import tokennet
from tokennet.cli import main
from tokennet.recipes import get_recipe, train
from tokennet.tokens.image import dct_basis

VIT_TINY = {"dim": 16, "num_layers": 1, "num_heads": 2, "max_iters": 4, "time_budget": None, "eval_interval": 4,
            "log_interval": 4, "progress": False, "batch_size": 16, "svm_baseline": False}
GPT_TINY = {"dim": 16, "num_layers": 1, "num_heads": 2, "block_size": 16, "batch_size": 8, "eval_iters": 2,
            "sample_tokens": 0, "max_iters": 3, "time_budget": None, "eval_interval": 3, "log_interval": 3,
            "progress": False}


def test_a_dct_patch_matrix_trains_untouched_and_evaluates_again(tmp_path):
    run, metrics = train("vit", out=tmp_path / "r", sets={**VIT_TINY, "patch_projection": "dct"}, device="cpu")
    loaded = tokennet.load(run)
    assert loaded.model.config.patch_projection == "dct"
    torch.testing.assert_close(loaded.model.patch_embed.weight, dct_basis(1, (4, 4)))  # D = 16: all 16 frequencies
    again = get_recipe("vit").evaluate_run(loaded, None)
    assert again["test_accuracy"] == pytest.approx(metrics["test_accuracy"])


def test_a_bad_patch_projection_is_one_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["train", "vit", "--out", str(out), "--max-iters", "1", "--set", "patch_projection=fourier"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "patch_projection must be one of" in err[0] and not out.exists()


def test_reversed_text_validates_on_the_forward_runs_characters_backwards(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(60)))
    runs = {}
    for reverse in (False, True):
        run, metrics = train("gpt-char", data=str(corpus), out=tmp_path / f"r{reverse}",
                             sets={**GPT_TINY, "reverse": reverse}, device="cpu")
        runs[reverse] = tokennet.load(run)
        assert json.loads((run / "run.json").read_text())["data_spec"]["reverse"] is reverse
        again = get_recipe("gpt-char").evaluate_run(runs[reverse], None)
        assert again["val_loss"] == pytest.approx(metrics["val_loss"])
    forward, backward = (runs[flag].data.held_out(runs[flag].tokenizer, 16) for flag in (False, True))
    assert torch.equal(backward, forward.flip(0))
    text = runs[True].tokenizer.decode(backward.tolist())
    assert ".god yzal eht revo" in text  # the text read from its end
    task = runs[True].task  # tokennet eval --data FILE --stride S reads the file backwards too
    on_file = task.evaluate(runs[True], str(corpus), stride=8)
    assert on_file["loss"] == pytest.approx(task.evaluate_text(runs[True], corpus.read_text()[::-1], stride=8)["loss"])


def test_reverse_on_a_chat_file_is_refused_in_one_line(tmp_path, capsys):
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                              {"role": "assistant", "content": "hello"}]}) + "\n")
    out = tmp_path / "r"
    assert main(["train", "gpt-char", "--data", str(chats), "--out", str(out), "--max-iters", "1",
                 "--set", "reverse=true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "reverse=true" in err[0] and not out.exists()


def test_a_bpe_run_read_backwards_is_not_evaluated_on_a_forward_file_with_a_stride(tmp_path):
    from tokennet.errors import RunError

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(60)))
    run, _ = train("gpt", data=str(corpus), out=tmp_path / "r", sets={**GPT_TINY, "reverse": True, "vocab_size": 300},
                   device="cpu")
    loaded = tokennet.load(run)
    with pytest.raises(RunError, match="tokens read backwards"):
        loaded.task.evaluate(loaded, str(corpus), stride=8)
