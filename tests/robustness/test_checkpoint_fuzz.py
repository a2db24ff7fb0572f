"""Training checkpoints (``checkpoints/step-N/``: ``trainer.json``, ``model.safetensors``, ``state.safetensors``)
damaged every way, then ``tokennet train ... --resume``: it resumes, or exits 2 with one line; the checkpoint is
unchanged."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from robustness.fuzzing import FUZZ, check_reader, mutated, mutated_json, sha256, time_limit

from tokennet.cli import main
from tokennet.errors import TokennetError
from tokennet.train.checkpoint import read_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--set", "dim=16", "num_layers=1", "num_heads=2", "block_size=8", "batch_size=2", "eval_iters=1",
        "sample_tokens=0", "eval_interval=0", "checkpoint_interval=1"]


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory, corpus):
    """A gpt-char run with checkpoints and no final metrics, as a run stopped after step 2 leaves it."""
    run = tmp_path_factory.mktemp("ckpt") / "run"
    assert main(["-q", "train", "gpt-char", "--data", str(corpus), "--out", str(run), "--max-iters", "2",
                 *TINY]) == 0
    (run / "metrics.json").unlink()
    return run


def _latest(run: Path) -> Path:
    return sorted((run / "checkpoints").glob("step-*"))[-1]


def _resume(src: Path, corpus: Path, name: str, data: bytes) -> tuple[int, str]:
    """``train --resume`` on a copy of ``src`` whose latest checkpoint's ``name`` holds ``data``."""
    d = Path(tempfile.mkdtemp(prefix="ckpt-fuzz-")) / "run"
    try:
        shutil.copytree(src, d)
        f = _latest(d) / name
        f.write_bytes(data)
        before = sha256(f)
        err = io.StringIO()
        with time_limit(60), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(["-q", "train", "gpt-char", "--data", str(corpus), "--out", str(d), "--resume",
                         "--max-iters", "3", *TINY])
        text = err.getvalue().strip()
        assert code in (0, 2), (code, text)
        if code == 2:
            assert text.startswith("tokennet: error: ") and "\n" not in text, text
            if f.exists():  # a resumed run may prune old checkpoints; a refused one touches nothing
                assert sha256(f) == before, f"{f} was changed"
        return code, text
    finally:
        shutil.rmtree(d.parent)


@pytest.mark.parametrize("name", ["model.safetensors", "state.safetensors"])
@FUZZ
@given(data=st.data())
def test_damaged_checkpoint_tensors_are_one_line(interrupted, name, data):
    """``read_checkpoint`` on its own (fast): the tensors' files are checked against trainer.json's checksums."""
    seed = (_latest(interrupted) / name).read_bytes()
    damaged = data.draw(mutated(seed, hot=8 + int.from_bytes(seed[:8], "little")), label="mutation").data
    d = Path(tempfile.mkdtemp(prefix="ckpt-fuzz-")) / "ck"
    try:
        shutil.copytree(_latest(interrupted), d)
        (d / name).write_bytes(damaged)
        out = check_reader(lambda: read_checkpoint(d), d / name)
        if damaged != seed:
            assert isinstance(out, TokennetError), "a changed file passed its checksum"
    finally:
        shutil.rmtree(d.parent)


@settings(FUZZ, max_examples=min(FUZZ.max_examples, 15))  # each example resumes a (tiny) training run
@given(data=st.data())
def test_resume_from_a_damaged_trainer_json_is_one_line(interrupted, corpus, data):
    """trainer.json with a value of another type anywhere (the step, the optimizer's settings, the random states,
    their checksums), a key dropped, or nesting 100,000 deep."""
    seed = json.loads((_latest(interrupted) / "trainer.json").read_text())
    _resume(interrupted, corpus, "trainer.json", data.draw(mutated_json(seed), label="mutation").data)


@pytest.mark.parametrize("path, value", [
    (("rng", 0, "python"), [3, [1, 2], None]),  # random.setstate refuses it
    (("rng", 0, "numpy"), ["MT19937", [], 0, 0, 0.0]),  # numpy's state: an empty key
    (("optimizer", "param_groups", 0, "weight_decay"), None),  # AdamW would fail at its first step
    (("elapsed",), "ten seconds"),
    (("step",), -1),
])
def test_resume_from_a_checkpoint_whose_states_cannot_be_restored_is_one_line(interrupted, corpus, path, value):
    """Found by the fuzzing: each of these resumed into a traceback (in random.setstate, numpy's set_state, the
    optimizer's first step, the training loop)."""
    doc = json.loads((_latest(interrupted) / "trainer.json").read_text())
    node = doc
    for k in path[:-1]:
        node = node[k] if not isinstance(node, list) else node[k]
    if isinstance(node, dict) and path[-1] not in node and path[0] == "rng":
        pytest.skip(f"this checkpoint's random state has no {path[-1]!r} entry")
    node[path[-1]] = value
    code, err = _resume(interrupted, corpus, "trainer.json", json.dumps(doc).encode())
    assert code == 2 and "checkpoint" in err, err
