"""``export --overwrite`` and ``import --overwrite`` replace only what they wrote before: a previous export of the
same format, or a tokennet run; never the run being exported, a path inside it, or a user's own file or directory
(one line, exit 2, untouched). The new output is built and checked beside the old one, so a failure leaves it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

import tokennet
from tokennet.cli import main
from tokennet.models import create_model
from tokennet.models.registry import save_pretrained
from tokennet.run import RunLock, read_run_info, save_tokenizer, write_run_info
from tokennet.tokens.text import BPETokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

FORMATS = ["hf", "gguf", "pt2", "onnx"]
TEXT = "def forward(self, x):\n    return self.proj(x) + x\n" * 40


def _run(d: Path, seed: int) -> Path:
    """A tiny GPT run with a byte-level BPE tokenizer (what every export format takes)."""
    torch.manual_seed(seed)
    tok = BPETokenizer.train(TEXT, vocab_size=300)
    save_pretrained(create_model("gpt-micro", vocab_size=tok.vocab_size, block_size=16, num_layers=1,
                                 activation="gelu_tanh"), d)  # gelu_tanh: the GGUF export adds no note
    save_tokenizer(d, tok)
    write_run_info(d, recipe="import", model="gpt", data=None, settings={"seed": seed})
    return d


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return _run(root / "one", 0), _run(root / "two", 1)


def _digest(p: Path) -> dict[str, str]:
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
    return {str(f.relative_to(p.parent)): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


def _out(tmp_path: Path, fmt: str) -> Path:
    return tmp_path / ("exported" if fmt == "hf" else f"exported.{fmt}")


def _export(run: Path, out: Path, fmt: str, *extra: str) -> int:
    return main(["-q", "export", str(run), "--format", fmt, "--out", str(out), "--gguf-type", "f32", *extra])


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("tokennet: error:"), err
    return err


def _hidden(d: Path) -> list[str]:
    return [p.name for p in d.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_path_of_the_users_is_refused_and_untouched(fmt, runs, tmp_path, capsys):
    out = _out(tmp_path, fmt)
    if fmt == "hf":
        out.mkdir()
        (out / "notes.txt").write_text("my notes")
    else:
        out.write_text("my notes")
    before = _digest(out)
    assert _export(runs[0], out, fmt, "--overwrite") == 2
    assert "refusing to overwrite" in _one_line(capsys)
    assert _digest(out) == before and not _hidden(tmp_path)


@pytest.mark.parametrize("fmt", ["pt2", "onnx", "gguf"])
def test_an_export_of_another_format_is_not_replaced(fmt, runs, tmp_path, capsys):
    other = {"pt2": "gguf", "onnx": "pt2", "gguf": "pt2"}[fmt]
    out = tmp_path / "exported.bin"
    assert _export(runs[0], out, other) == 0
    before = _digest(out)
    assert _export(runs[0], out, fmt, "--overwrite") == 2
    assert "refusing to overwrite" in _one_line(capsys)
    assert _digest(out) == before


def test_an_hf_export_must_hold_config_and_weights(runs, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _export(runs[0], empty, "hf") == 0  # an empty directory is as good as none
    assert (empty / "model.safetensors").is_file() and not _hidden(tmp_path)
    capsys.readouterr()
    out = tmp_path / "exported"
    out.mkdir()
    (out / "config.json").write_text('{"model_type": "gpt2"}')  # no model.safetensors: not an export
    assert _export(runs[0], out, "hf", "--overwrite") == 2
    assert "model.safetensors" in _one_line(capsys)
    assert _export(runs[0], runs[1], "hf", "--overwrite") == 2  # another tokennet run is never an export
    assert "tokennet run" in _one_line(capsys)
    tokennet.load(runs[1])


@pytest.mark.parametrize("where", ["the run", "inside the run", "holding the run"])
def test_out_naming_the_run_is_refused_and_the_run_still_loads(where, runs, capsys):
    run = runs[0]
    out = {"the run": run, "inside the run": run / "checkpoints", "holding the run": run.parent}[where]
    before = _digest(run)
    for fmt in ("hf",) if where != "inside the run" else ("gguf", "pt2", "hf"):
        assert _export(run, out, fmt, "--overwrite") == 2
        assert "the run being exported" in _one_line(capsys)
    assert _digest(run) == before
    tokennet.load(run).generate("def", max_new_tokens=3, temperature=0)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_previous_export_of_the_same_format_is_replaced(fmt, runs, tmp_path, capsys):
    out = _out(tmp_path, fmt)
    assert _export(runs[0], out, fmt) == 0
    first = _digest(out if fmt != "onnx" else tmp_path)
    assert _export(runs[1], out, fmt) == 2  # without --overwrite: refused
    assert "--overwrite" in _one_line(capsys)
    assert _export(runs[1], out, fmt, "--overwrite") == 0
    capsys.readouterr()
    second = _digest(out if fmt != "onnx" else tmp_path)
    weights = next(k for k in first if k.endswith(("model.safetensors", ".onnx", ".gguf", ".pt2")))
    assert second.keys() == first.keys() and second[weights] != first[weights], second  # the other run's weights
    assert not _hidden(tmp_path)  # no temporary or trash sibling left
    if fmt == "hf":
        back = tokennet.interop.convert(out)[0]
        assert torch.equal(back.state_dict()["tok_emb.weight"], tokennet.load(runs[1]).model.tok_emb.weight)


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_export_that_fails_its_check_leaves_the_old_one(fmt, runs, tmp_path, capsys, monkeypatch):
    import tokennet.interop.export as export

    out = _out(tmp_path, fmt)
    assert _export(runs[0], out, fmt) == 0
    before = _digest(out if fmt != "onnx" else tmp_path)
    monkeypatch.setattr(export, "_check", lambda *a: (1.0, False, "a test"))  # every read-back differs
    assert _export(runs[1], out, fmt, "--overwrite") == 2
    assert "nothing was written" in _one_line(capsys)
    assert _digest(out if fmt != "onnx" else tmp_path) == before and not _hidden(tmp_path)


def test_a_stray_onnx_weights_file_is_never_replaced(runs, tmp_path, capsys):
    out = tmp_path / "m.onnx"
    (tmp_path / "m.onnx.data").write_text("mine")
    for extra in ((), ("--overwrite",)):
        assert _export(runs[0], out, "onnx", *extra) == 2
        assert "m.onnx.data" in _one_line(capsys)
    assert (tmp_path / "m.onnx.data").read_text() == "mine" and not out.exists()


def test_an_onnx_export_is_one_file_and_replaces_an_old_pair_whole(runs, tmp_path, capsys, monkeypatch):
    """A model within ONNX's 2 GB is one file: one rename replaces it. One past it (the limit lowered here) has its
    weights under a name no earlier export used, placed before the model, so the model's rename switches pairs
    in one step; the old weights file goes after it. Either way the pair read back is the new run's."""
    import onnx
    import onnxruntime as ort

    import tokennet.interop.export as export

    out = tmp_path / "m.onnx"
    monkeypatch.setattr(export, "ONNX_ONE_FILE_LIMIT", 0)  # every model "too large" for one file
    assert _export(runs[0], out, "onnx") == 0
    first = sorted(p.name for p in tmp_path.iterdir())
    assert len(first) == 2 and first[0] == "m.onnx" and first[1].startswith("m.onnx.") and first[1].endswith(".data")
    assert _export(runs[1], out, "onnx", "--overwrite") == 0
    second = sorted(p.name for p in tmp_path.iterdir())
    assert len(second) == 2 and second[1] != first[1], second  # a new weights name; the old one deleted
    graph = onnx.load_model(str(out), load_external_data=False)
    locations = {e.value for t in onnx.external_data_helper._get_all_tensors(graph)
                 for e in t.external_data if e.key == "location"}
    assert locations == {second[1]}
    monkeypatch.undo()
    assert _export(runs[0], out, "onnx", "--overwrite") == 0  # back to one file: the pair's weights file goes
    capsys.readouterr()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
    x = torch.randint(1, 50, (1, 5))
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    got = torch.from_numpy(sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0])
    with torch.no_grad():
        want = tokennet.load(runs[0]).model(x).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)  # ONNX runtime's own kernels: export's check


def test_a_crashed_exports_temporary_directory_is_swept_by_the_next_export(runs, tmp_path, capsys):
    """A writer killed before it cleaned up leaves ``.NAME.tmp-PID-…``; the next export of NAME removes it (its
    process is gone) and leaves a live writer's alone."""
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    out = tmp_path / "m.gguf"
    crashed = tmp_path / f".m.gguf.tmp-{pid}-abc123"
    crashed.mkdir()
    (crashed / "m.gguf").write_bytes(b"half")
    live = tmp_path / f".m.gguf.tmp-{1}-abc123"  # pid 1 is always running
    live.mkdir()
    assert _export(runs[0], out, "gguf") == 0
    capsys.readouterr()
    assert not crashed.exists() and live.exists() and out.is_file()


# -- import --out over a run ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_source(runs, tmp_path_factory):
    d = tmp_path_factory.mktemp("src") / "hf"
    assert _export(runs[1], d, "hf") == 0
    return d


def test_import_over_a_run_needs_overwrite_and_replaces_it(hf_source, runs, tmp_path, capsys):
    import shutil

    target = tmp_path / "runs" / "r"
    shutil.copytree(runs[0], target)
    before = _digest(target)
    assert main(["import", str(hf_source), "--out", str(target)]) == 2
    assert "--overwrite" in _one_line(capsys) and _digest(target) == before
    assert main(["import", str(hf_source), "--out", str(target), "--overwrite"]) == 0
    capsys.readouterr()
    assert read_run_info(target)["recipe"] == "import" and "imported_from" in read_run_info(target)["settings"]
    assert torch.equal(tokennet.load(target).model.tok_emb.weight, tokennet.load(runs[1]).model.tok_emb.weight)
    assert not _hidden(target.parent)


def test_import_overwrite_refuses_what_is_not_a_run_and_leaves_a_run_on_failure(hf_source, runs, tmp_path, capsys):
    import shutil

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    assert main(["import", str(hf_source), "--out", str(mine), "--overwrite"]) == 2
    assert "does not read as a tokennet run" in _one_line(capsys)
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    assert main(["import", str(hf_source), "--out", str(hf_source.parent), "--overwrite"]) == 2  # holds the source
    _one_line(capsys)
    assert hf_source.is_dir()
    target = tmp_path / "r"
    shutil.copytree(runs[0], target)
    RunLock(target).acquire().release()  # its lock file exists, as in any trained run
    before = _digest(target)
    bad = tmp_path / "bad"
    shutil.copytree(hf_source, bad)
    (bad / "model.safetensors").write_bytes(b"truncated")
    assert main(["import", str(bad), "--out", str(target), "--overwrite"]) == 2
    _one_line(capsys)
    with RunLock(target):  # a run being written is not replaced under its writer
        assert main(["import", str(hf_source), "--out", str(target), "--overwrite"]) == 2
        assert "being written by another process" in _one_line(capsys)
    assert _digest(target) == before and not _hidden(tmp_path)
    tokennet.load(target)
