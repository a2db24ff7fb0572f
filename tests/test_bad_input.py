"""The CLI's error contract, table-driven: every bad invocation gives one line on stderr
(``tokennet: error: ...``), exit status 2, no traceback, and leaves existing files untouched."""

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tokennet.cli import main

TINY_GPT = ["dim=32", "num_layers=1", "num_heads=2", "block_size=16", "batch_size=4", "eval_iters=2",
            "sample_tokens=0", "eval_interval=0"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Data files, a finished gpt-char run and a finished vit run to misuse."""
    root = tmp_path_factory.mktemp("bad")
    (root / "corpus.txt").write_text("the quick brown fox jumps over the lazy dog. " * 100)
    (root / "empty.txt").write_text("")
    (root / "binary.dat").write_bytes(bytes(range(256)) * 10)
    (root / "latin1.txt").write_bytes("café crème brûlée ".encode("latin-1") * 50)
    (root / "tiny.txt").write_text("abc")
    (root / "notext").mkdir()
    (root / "notext" / "blob.bin").write_bytes(b"\x00\x01")
    (root / "a_file").write_text("not a directory")
    (root / "broken_plugin.py").write_text("import tokennet\nraise RuntimeError('this plugin is broken')\n")
    (root / "fmnist").mkdir()
    (root / "fmnist" / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03" + b"\x00" * 10)
    cwd = os.getcwd()
    os.chdir(root)
    try:
        assert main(["-q", "train", "gpt-char", "--data", "corpus.txt", "--out", "gpt_run", "--max-iters", "2",
                     "--set", *TINY_GPT, "checkpoint_interval=1"]) == 0
        assert main(["-q", "train", "vit", "--out", "vit_run", "--max-iters", "2", "--set", "svm_baseline=false",
                     "dim=32", "num_layers=1"]) == 0
        _audio_files(root)
        assert main(["-q", "train", "audio", "--data", "wavs", "--out", "audio_run", "--max-iters", "2", "--set",
                     "baseline=false", "dim=32", "num_layers=1", "num_heads=2", "n_mels=16", "clip_samples=8000",
                     "batch_size=4"]) == 0
    finally:
        os.chdir(cwd)
    # Copies to damage: a run with pickle weights, one with truncated weights, one with a truncated checkpoint.
    import shutil

    for name in ("pickled", "truncated", "badckpt", "badconfig"):
        shutil.copytree(root / "gpt_run", root / name)
    w = root / "pickled" / "model.safetensors"
    from safetensors.torch import load_file

    torch.save(load_file(str(w)), root / "pickled" / "model.pt")
    w.unlink()
    t = root / "truncated" / "model.safetensors"
    t.write_bytes(t.read_bytes()[:100])
    ck = sorted((root / "badckpt" / "checkpoints").glob("step-*"))[-1] / "model.safetensors"
    ck.write_bytes(ck.read_bytes()[: ck.stat().st_size // 2])
    (root / "badconfig" / "config.json").write_text("{not json")
    _bounded_inputs(root)
    # Foreign checkpoints for `tokennet import`: another architecture, and a GPT-2 whose weights are cut short.
    (root / "hf_t5").mkdir()
    (root / "hf_t5" / "config.json").write_text('{"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]}')
    (root / "hf_gpt2").mkdir()
    (root / "hf_gpt2" / "config.json").write_text('{"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}')
    (root / "hf_gpt2" / "model.safetensors").write_bytes(t.read_bytes())
    return root


def _bounded_inputs(root: Path) -> None:
    """Issue 44: inputs past a bound (a config nested 1,000 deep, a graph of 20,000 nodes) and an answers.tsv whose
    row names an image outside its directory."""
    import shutil

    from tokennet.data.vqa import write_question_dir

    shutil.copytree(root / "gpt_run", root / "deepconfig")
    (root / "deepconfig" / "config.json").write_text('{"family": "gpt", "x": ' + "[" * 1000 + "]" * 1000 + "}")
    shutil.copytree(Path(__file__).parent / "fixtures" / "runs_0_1" / "graph", root / "graph_run")
    (root / "big_graph.json").write_text('{"nodes": [' + ",".join(["[1.0, 0.0]"] * 20_000) + '], "edges": []}')
    q = write_question_dir(root / "questions", 6, seed=0)
    lines = (q / "answers.tsv").read_text().splitlines()
    lines[2] = "\t".join(["../corpus.txt", *lines[2].split("\t")[1:]])
    (q / "answers.tsv").write_text("\n".join(lines) + "\n")


def _audio_files(root: Path) -> None:
    """A tiny LABEL/*.wav set and audio files that are wrong in one way each."""
    import numpy as np
    from scipy.io import wavfile
    from support import write_wav_dataset

    write_wav_dataset(root / "wavs", per_label=4)
    (root / "empty.wav").write_bytes(b"")
    good = (root / "wavs" / "low" / "000.wav").read_bytes()
    (root / "cut.wav").write_bytes(good[:30])
    (root / "notaudio.wav").write_text("this is text, not audio\n" * 20)
    wavfile.write(root / "silent.wav", 8000, np.zeros(4000, np.int16))
    wavfile.write(root / "one_hz.wav", 1, np.full(10, 3000, np.int16))
    (root / "rate0.wav").write_bytes(good[:24] + bytes(8) + good[32:])  # sample rate (and byte rate) 0 in the header


CASES = {
    # unknown things
    "unknown recipe": (["train", "nope"], "unknown recipe"),
    "unknown command": (["frobnicate"], "invalid choice"),
    "unknown flag": (["train", "gpt", "--bogus"], "unrecognized arguments"),
    # data
    "missing data file": (["train", "gpt-char", "--data", "missing.txt"], "does not exist"),
    "empty data file": (["train", "gpt", "--data", "empty.txt"], "is empty"),
    "binary data file": (["train", "gpt-char", "--data", "binary.dat"], "binary"),
    "non-UTF-8 data file": (["train", "gpt-char", "--data", "latin1.txt"], "not UTF-8"),
    "directory with no text": (["train", "gpt-char", "--data", "notext"], "no text files"),
    "glob matching nothing": (["train", "gpt-char", "--data", "*.nothing"], "no files match"),
    "corpus shorter than a block": (["train", "gpt-char", "--data", "tiny.txt"], "shorter than one block"),
    "vit: missing image directory": (["train", "vit", "--data", "no_such_dir"], "no_such_dir"),
    "vit: truncated idx files": (["train", "vit", "--data", "fmnist"], "fmnist"),
    # --set: keys, types, ranges
    "set: unknown key": (["train", "vit", "--set", "bogus=1"], "unknown setting"),
    "set: no equals sign": (["train", "gpt", "--set", "lr"], "key=value"),
    "set: int expected": (["train", "seq2seq", "--set", "num_layers=two"], "expected int"),
    "set: float expected": (["train", "gpt-char", "--set", "lr=fast"], "expected float"),
    "set: bool expected": (["train", "vit", "--set", "flip=maybe"], "expected true/false"),
    "set: batch_size 0": (["train", "gpt-char", "--data", "corpus.txt", "--set", "batch_size=0"], "batch_size"),
    "set: negative lr": (["train", "caption", "--set", "lr=-1"], "lr"),
    "set: dropout out of range": (["train", "gpt-char", "--data", "corpus.txt", "--set", "dropout=1.5"], "dropout"),
    "set: heads do not divide width": (["train", "gpt-char", "--data", "corpus.txt", "--set", "num_heads=3"],
                                       "must divide"),
    "set: unknown precision": (["train", "gpt-char", "--set", "precision=fp8"], "precision"),
    "set: unknown strategy": (["train", "gpt-char", "--set", "strategy=zero"], "strategy"),
    "set: unknown position": (["train", "gpt-char", "--data", "corpus.txt", "--set", "position=spiral"], "position"),
    "negative time budget": (["train", "gpt-char", "--time-budget", "-5"], "time_budget"),
    "zero max-iters": (["train", "gpt-char", "--max-iters", "0"], "max_iters"),
    # flags and directories
    "conflicting iteration flags": (["train", "gpt-char", "--max-iters", "3", "--set", "max_iters=4"], "conflicts"),
    "resume and overwrite together": (["train", "gpt-char", "--resume", "--overwrite"], "not allowed with"),
    "output dir is a file": (["train", "gpt-char", "--data", "corpus.txt", "--out", "a_file"], "not a directory"),
    "existing run without --resume": (["train", "gpt-char", "--data", "corpus.txt", "--out", "gpt_run"],
                                      "already exists"),
    "overwrite a non-run directory": (["train", "gpt-char", "--data", "corpus.txt", "--out", "notext",
                                       "--overwrite"], "not a tokennet run directory"),
    "resume a run of another recipe": (["train", "vit", "--out", "gpt_run", "--resume"], "run of recipe"),
    "resume a directory that is no run": (["train", "gpt-char", "--out", "notext", "--resume"], "not a tokennet run"),
    "unavailable device": (["train", "gpt-char", "--data", "corpus.txt", "--device", "cuda:7"], "cuda"),
    "unknown device": (["train", "gpt-char", "--data", "corpus.txt", "--device", "tpu"], "device"),
    "read-only output location": (["train", "gpt-char", "--data", "corpus.txt", "--out", "/proc/tokennet-run"],
                                  "proc"),
    # damaged or foreign run directories
    "pickle instead of safetensors": (["generate", "pickled"], "refusing to load pickle-based weights"),
    "truncated weights": (["generate", "truncated"], "checksum"),
    "truncated checkpoint": (["-q", "train", "gpt-char", "--out", "badckpt", "--resume", "--max-iters", "4"],
                             "checkpoint"),
    "config is not JSON": (["generate", "badconfig"], "not valid JSON"),
    "config nested too deep": (["generate", "deepconfig"], "nested 1001 levels deep"),
    "graph of 20,000 nodes": (["generate", "graph_run", "--graphs", "big_graph.json"], "MAX_GRAPH_NODES"),
    "answers.tsv names an image outside its directory": (["train", "vqa", "--data", "questions", "--out", "vqa_run"],
                                                         "answers.tsv, line 3: the image '../corpus.txt' is outside"),
    "generate from a vit run": (["generate", "vit_run"], "image classification run: pass --image"),
    "generate from a non-run": (["generate", "notext"], "not a run directory"),
    "eval a non-run": (["eval", "notext"], "not a run directory"),
    "report a non-run": (["report", "notext"], "not a tokennet run directory"),
    "report a missing directory": (["report", "no_such_run"], "not a run directory"),
    "report --out is a directory": (["report", "gpt_run", "--out", "notext"], "is a directory"),
    "report --out in a missing directory": (["report", "gpt_run", "--out", "nowhere/r.html"], "does not exist"),
    "import a directory that is no checkpoint": (["import", "notext", "--out", "imported"], "no config.json"),
    "import an unsupported architecture": (["import", "hf_t5", "--out", "imported"], "no tokennet converter"),
    "import a truncated safetensors": (["import", "hf_gpt2", "--out", "imported"], "truncated"),
    # generation arguments
    "max-new-tokens 0": (["generate", "gpt_run", "--max-new-tokens", "0"], "max-new-tokens"),
    "negative temperature": (["generate", "gpt_run", "--temperature", "-1"], "temperature"),
    "top-p above 1": (["generate", "gpt_run", "--top-p", "2"], "top_p"),
    "top-k 0": (["generate", "gpt_run", "--top-k", "0"], "top-k"),
    "temperature nan": (["generate", "gpt_run", "--temperature", "nan"], "finite"),
    "a flag the run's task does not take": (["generate", "gpt_run", "--beam-size", "3"], "does not apply"),
    "--input for a run that takes no files": (["generate", "gpt_run", "--input", "corpus.txt"], "no input files"),
    "a cpu device index": (["train", "gpt-char", "--data", "corpus.txt", "--device", "cpu:7"], "one device"),
    "a setting that does not apply": (["train", "gpt-char", "--data", "corpus.txt", "--set", "vocab_size=0"],
                                      "vocab_size does not apply"),
    "a None-default setting with a bad value": (["train", "gpt-char", "--set", "time_budget=abc"],
                                                "time_budget=abc: expected float or none"),
    "a plugin file that does not exist": (["--plugin", "nope.py", "list"], "does not exist"),
    "a plugin file that fails to import": (["--plugin", "broken_plugin.py", "list"], "failed to import"),
    "eval on missing data": (["eval", "gpt_run", "--data", "missing.txt"], "does not exist"),
    # audio
    "audio: missing file": (["generate", "audio_run", "--audio", "missing.wav"], "does not exist"),
    "audio: empty file": (["generate", "audio_run", "--audio", "empty.wav"], "is empty"),
    "audio: truncated file": (["generate", "audio_run", "--audio", "cut.wav"], "not a readable WAV"),
    "audio: not an audio file": (["generate", "audio_run", "--audio", "notaudio.wav"], "notaudio.wav"),
    "audio: sample rate 0 in the file": (["generate", "audio_run", "--audio", "rate0.wav"], "positive integer"),
    "audio: silence only": (["generate", "audio_run", "--audio", "silent.wav"], "silence only"),
    "audio: a sample rate of 1 Hz": (["generate", "audio_run", "--audio", "one_hz.wav"], "cannot hold speech"),
    "audio: viz of a silent file": (["viz", "audio_run", "--audio", "silent.wav", "--out", "vizout"], "silence"),
    "audio: sample_rate 0": (["train", "audio", "--data", "wavs", "--set", "sample_rate=0"], "positive integer"),
    "audio: directory with no LABEL/*.wav": (["train", "audio", "--data", "notext"], "LABEL/*.wav"),
    "audio: --audio on a language model": (["generate", "gpt_run", "--audio", "silent.wav"], "--audio does not apply"),
    "audio: no --audio for an audio run": (["generate", "audio_run"], "pass --audio"),
}


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_invocation(name, world, monkeypatch, capsys):
    argv, expected = CASES[name]
    monkeypatch.chdir(world)
    before = _snapshot(world)
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as e:  # argparse usage errors
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == 2, (name, code, err)
    assert err.startswith("tokennet: error:"), (name, err)
    assert "\n" not in err, (name, err)
    assert "Traceback" not in err
    assert expected.lower() in err.lower(), (name, err)
    assert _snapshot(world) == before, f"{name}: files changed"


def test_at_least_thirty_cases():
    assert len(CASES) >= 30


def test_full_disk_is_one_line_and_leaves_no_partial_files(world, tmp_path):
    """A file-size limit makes every write past 64 KiB fail like a full disk (EFBIG)."""

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))

    out = tmp_path / "full"
    r = subprocess.run([sys.executable, "-m", "tokennet", "-q", "train", "gpt-char", "--data",
                        str(world / "corpus.txt"), "--out", str(out), "--max-iters", "2", "--set", *TINY_GPT,
                        "dim=64"], capture_output=True, text=True, preexec_fn=limit)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
    assert "too large" in r.stderr.lower() or "space" in r.stderr.lower()
    leftovers = [p for p in out.rglob("*") if p.is_file() and ".tmp" in p.name] if out.exists() else []
    assert not leftovers, leftovers
