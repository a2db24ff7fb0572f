"""A run directory's files damaged every way — ``run.json``, ``config.json``, ``metrics.json`` and the weights
(``model.safetensors``, with its recorded SHA-256 and, as in a hand-made or older run, without one): ``tokennet.load``
and ``tokennet generate`` load the run or fail with one line; none changes a file of the run."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from robustness.fuzzing import FUZZ, check_cli, check_reader, mutated, mutated_json
from robustness.graph_cases import oversized_graphs

import tokennet
from tokennet.cli import main
from tokennet.errors import TokennetError

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["dim=16", "num_layers=1", "num_heads=2", "block_size=8", "batch_size=2", "eval_iters=1", "sample_tokens=0",
        "eval_interval=0"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus):
    """A finished tiny gpt-char run, and a copy whose config.json records no weights checksum."""
    root = tmp_path_factory.mktemp("runs")
    run = root / "run"
    assert main(["-q", "train", "gpt-char", "--data", str(corpus), "--out", str(run), "--max-iters", "1",
                 "--set", *TINY]) == 0
    shutil.rmtree(run / "checkpoints", ignore_errors=True)
    bare = root / "unchecked"
    shutil.copytree(run, bare)
    cfg = json.loads((bare / "config.json").read_text())
    cfg.get("tokennet", {}).pop("weights_sha256")
    (bare / "config.json").write_text(json.dumps(cfg))
    return {"checked": run, "unchecked": bare}


def _use(run):
    """A run that loaded must also work: generate a few tokens."""
    run.generate("line", max_new_tokens=2, temperature=0)
    return run


def _load_damaged(src: Path, name: str, data: bytes):
    """``tokennet.load`` of a copy of ``src`` whose ``name`` holds ``data``: the run or the TokennetError; every
    file of the copy unchanged."""
    d = Path(tempfile.mkdtemp(prefix="run-fuzz-")) / "run"
    try:
        shutil.copytree(src, d)
        (d / name).write_bytes(data)
        return check_reader(lambda: _use(tokennet.load(d)), *sorted(p for p in d.rglob("*") if p.is_file()))
    finally:
        shutil.rmtree(d.parent)


def test_the_seed_runs_load(runs):
    for run in runs.values():
        out = _load_damaged(run, "run.json", (run / "run.json").read_bytes())
        assert not isinstance(out, TokennetError), out


@pytest.mark.parametrize("which", ["checked", "unchecked"])
@FUZZ
@given(data=st.data())
def test_damaged_weights_are_one_line(runs, which, data):
    """Without a recorded checksum the safetensors header itself is what is read: its JSON length, its offsets."""
    w = runs[which] / "model.safetensors"
    seed = w.read_bytes()
    header = 8 + int.from_bytes(seed[:8], "little")
    damaged = data.draw(mutated(seed, hot=header), label="mutation").data
    out = _load_damaged(runs[which], "model.safetensors", damaged)
    if which == "checked" and damaged != seed:
        assert isinstance(out, TokennetError), "a changed file passed its checksum"


def test_weights_holding_nan_are_one_line(runs):
    """Found by the fuzzing: without a checksum, a flipped exponent bit gives NaN weights that loaded, and sampling
    then failed with a traceback. The loader refuses non-finite weights, naming the tensor."""
    from safetensors.torch import load_file, save_file

    sd = load_file(str(runs["unchecked"] / "model.safetensors"))
    sd["decoder.norm.weight"][0] = float("nan")
    d = Path(tempfile.mkdtemp())
    try:
        save_file(sd, str(d / "w.safetensors"))
        out = _load_damaged(runs["unchecked"], "model.safetensors", (d / "w.safetensors").read_bytes())
    finally:
        shutil.rmtree(d)
    assert isinstance(out, TokennetError) and "decoder.norm.weight" in str(out) and "NaN" in str(out), out


@pytest.mark.parametrize("name", ["run.json", "config.json", "metrics.json"])
@FUZZ
@given(data=st.data())
def test_damaged_json_files_are_one_line(runs, name, data):
    seed = (runs["unchecked"] / name).read_bytes()
    if data.draw(st.booleans(), label="structural"):
        damaged = data.draw(mutated_json(json.loads(seed)), label="mutation").data
    else:
        damaged = data.draw(mutated(seed, hot=len(seed)), label="mutation").data
    _load_damaged(runs["unchecked"], name, damaged)


@pytest.mark.parametrize("name, damage", [
    ("model.safetensors", lambda b: b[:100]),
    ("model.safetensors", lambda b: (2**62).to_bytes(8, "little") + b[8:]),
    ("run.json", lambda b: b"[" * 100_000),
    ("config.json", lambda b: b.replace(b'"dim": 16', b'"dim": "16"')),
])
def test_cli_generate_on_a_damaged_run_is_one_line(runs, tmp_path, name, damage):
    d = tmp_path / "run"
    shutil.copytree(runs["unchecked"], d)
    (d / name).write_bytes(damage((d / name).read_bytes()))
    code, err = check_cli(["-q", "generate", str(d), "--prompt", "line", "--max-new-tokens", "2"],
                          *sorted(p for p in d.rglob("*") if p.is_file()))
    assert code == 2, err


# -- tokennet generate --graphs: graph files past the bounds, or damaged ---------------------------------------------
GRAPH_RUN = Path(__file__).parents[1] / "fixtures" / "runs_0_1" / "graph"


@pytest.fixture(scope="module")
def graph_seed(tmp_path_factory):
    from tokennet.data.graphs import marked_distance_set
    from tokennet.tasks.graph import write_graphs

    batch, _ = marked_distance_set(2, 0)
    return json.loads(write_graphs(batch, tmp_path_factory.mktemp("g") / "g.json").read_text())


@FUZZ
@given(data=st.data())
def test_cli_generate_graphs_past_the_bounds_or_damaged_is_one_line(graph_seed, data):
    """Issue 44: ``generate --graphs FILE`` on a graph run: a file past a bound (nodes, edges, node pairs, nesting)
    is exit 2 with one line naming the file and the bound; a damaged one exit 0 or one line; the run unchanged."""
    kind = data.draw(st.sampled_from(["bounds", "damaged"]), label="kind")
    if kind == "bounds":
        text, bound = data.draw(oversized_graphs(), label="graphs")
        body = text.encode()
    else:
        body, bound = data.draw(mutated_json(graph_seed), label="mutation").data, None
    d = Path(tempfile.mkdtemp(prefix="graph-fuzz-"))
    try:
        f = d / "graphs.json"
        f.write_bytes(body)
        code, err = check_cli(["-q", "generate", str(GRAPH_RUN), "--graphs", str(f)], f,
                              *sorted(p for p in GRAPH_RUN.rglob("*") if p.is_file()))
    finally:
        shutil.rmtree(d)
    if bound is not None:
        assert code == 2 and str(f) in err and bound in err, err
