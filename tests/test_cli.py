"""The `tokennet` command end to end on tiny settings, and its error contract."""

import json
import subprocess
import sys

import pytest

import tokennet
from tokennet.cli import main

TINY = ["--set", "dim=32", "num_layers=1", "num_heads=2", "block_size=16", "batch_size=4", "eval_iters=2",
        "sample_tokens=20", "warmup_iters=2", "eval_interval=0"]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # default run directories (runs/...) land here, not in the repo


@pytest.fixture(scope="module")
def char_run(tmp_path_factory, corpus):
    out = tmp_path_factory.mktemp("runs") / "char"
    assert main(["-q", "train", "gpt-char", "--data", str(corpus), "--out", str(out), "--max-iters", "6", *TINY]) == 0
    return out


def test_help_works():
    r = subprocess.run([sys.executable, "-m", "tokennet", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "train" in r.stdout and "generate" in r.stdout


def test_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "gpt-char" in out and "gpt-mini" in out and "recipes:" in out


def test_train_writes_a_run_directory(char_run, capsys):
    for f in ("config.json", "model.safetensors", "tokenizer.json", "metrics.json", "log.jsonl", "run.json"):
        assert (char_run / f).is_file(), f
    assert (char_run / "checkpoints" / "latest").is_file()
    m = json.loads((char_run / "metrics.json").read_text())
    assert m["step"] == 6 and m["val_loss"] > 0 and isinstance(m["sample"], str)
    run = tokennet.load(char_run)
    assert run.tokenizer.kind == "char" and run.model.config.dim == 32


def test_generate_and_eval(char_run, capsys):
    capsys.readouterr()
    assert main(["generate", str(char_run), "--prompt", "the ", "--max-new-tokens", "10", "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("the ") and len(out) >= 10
    assert main(["eval", str(char_run)]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["val_loss"] > 0 and metrics["val_perplexity"] > 1


def test_resume_continues_the_run(char_run, capsys):
    assert main(["-q", "train", "gpt-char", "--out", str(char_run), "--resume", "--max-iters", "9"]) == 0
    m = json.loads((char_run / "metrics.json").read_text())
    assert m["step"] == 9


def test_bpe_recipe_and_set_tokenizer(tmp_path, corpus):
    out = tmp_path / "bpe"
    assert main(["-q", "train", "gpt", "--data", str(corpus), "--out", str(out), "--max-iters", "2", *TINY,
                 "vocab_size=300"]) == 0
    assert tokennet.load(out).tokenizer.kind == "bpe"
    out2 = tmp_path / "c"
    assert main(["-q", "train", "gpt", "--data", str(corpus), "--out", str(out2), "--max-iters", "2", *TINY,
                 "tokenizer=char"]) == 0
    assert tokennet.load(out2).tokenizer.kind == "char"


def _bad(tmp_path, corpus, char_run):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    binary = tmp_path / "bin.dat"
    binary.write_bytes(b"\x00\x01\x02" * 100)
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("abc")
    nodir = tmp_path / "notext"
    nodir.mkdir()
    (nodir / "x.bin").write_bytes(b"\x00")
    d = str(corpus)
    return {
        "missing data": (["train", "gpt-char", "--data", str(tmp_path / "nope.txt")], "does not exist"),
        "empty file": (["train", "gpt-char", "--data", str(empty)], "is empty"),
        "binary file": (["train", "gpt-char", "--data", str(binary)], "binary"),
        "dir without text": (["train", "gpt-char", "--data", str(nodir)], "no text files"),
        "glob matching nothing": (["train", "gpt-char", "--data", str(tmp_path / "*.none")], "no files match"),
        "shorter than a block": (["train", "gpt-char", "--data", str(tiny)], "shorter than one block"),
        "unknown recipe": (["train", "nope"], "unknown recipe"),
        "unknown set key": (["train", "gpt-char", "--data", d, "--set", "bogus=1"], "unknown setting"),
        "bad set type": (["train", "gpt-char", "--data", d, "--set", "lr=fast"], "expected float"),
        "set without =": (["train", "gpt-char", "--data", d, "--set", "lr"], "key=value"),
        "bad model value": (["train", "gpt-char", "--data", d, "--set", "num_heads=3"], "must divide"),
        "existing run dir": (["train", "gpt-char", "--data", d, "--out", str(char_run)], "already exists"),
        "resume non-run": (["train", "gpt-char", "--out", str(nodir), "--resume"], "not a tokennet run"),
        "conflicting flags": (["train", "gpt-char", "--max-iters", "3", "--set", "max_iters=4"], "conflicts"),
        "generate non-run": (["generate", str(nodir)], "not a run directory"),
        "max-new-tokens 0": (["generate", str(char_run), "--max-new-tokens", "0"], "max-new-tokens"),
        "eval non-run": (["eval", str(nodir)], "not a run directory"),
        "bad device": (["train", "gpt-char", "--data", d, "--device", "tpu9"], "device"),
    }


def test_bad_input_gives_one_line_errors(tmp_path, corpus, char_run, capsys):
    before = {p.name: p.stat().st_mtime_ns for p in char_run.iterdir()}
    for name, (argv, msg) in _bad(tmp_path, corpus, char_run).items():
        capsys.readouterr()
        code = main(argv)
        err = capsys.readouterr().err.strip()
        assert code == 2, name
        assert err.startswith("tokennet: error:") and "\n" not in err, (name, err)
        assert msg in err, (name, err)
        assert "Traceback" not in err
    assert not list(tmp_path.glob("runs/*"))  # failed runs leave no run directory behind
    assert {p.name: p.stat().st_mtime_ns for p in char_run.iterdir()} == before  # nothing overwritten


def test_error_from_a_subprocess_has_no_traceback(tmp_path):
    r = subprocess.run([sys.executable, "-m", "tokennet", "train", "gpt-char", "--data", str(tmp_path / "x")],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1


def test_a_prompt_longer_than_the_context_is_cut_to_its_last_window(char_run, capsys):
    """As nanoGPT does: the model reads the prompt's last block_size tokens, and one note on stderr says so."""
    prompt = "the " * 40
    assert main(["generate", str(char_run), "--prompt", prompt, "--max-new-tokens", "5", "--temperature", "0"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(prompt) and len(out) > len(prompt)
    assert "longer than the model's context" in err and "last" in err and err.strip().count("\n") == 0


def test_repeated_set_flags_add_up_and_the_last_value_of_a_key_wins(capsys):
    assert main(["train", "audio", "--set", "n_mels=32", "--set", "freq_mask=3", "lr=0.01", "--set", "lr=0.02",
                 "--show-settings"]) == 0
    out = capsys.readouterr().out
    assert "n_mels = 32" in out and "freq_mask = 3" in out and "lr = 0.02" in out
    assert main(["train", "audio", "--max-iters", "7", "--show-settings"]) == 0  # as the run would: no time budget
    out = capsys.readouterr().out
    assert "max_iters = 7" in out and "time_budget = None" in out
