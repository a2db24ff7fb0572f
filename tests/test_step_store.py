"""Compiled decoding steps kept on disk (tokennet.step_store): a later process loads the step instead of compiling it,
and a file that does not fit — another torch, another processor, changed weights, damaged bytes, a foreign or
world-writable file, inputs of another form — is never run: it is rebuilt, and one line on stderr says why.

One tiny model is compiled once for the module (~10-30 s); every other case copies or edits its files."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from tokennet import sampling, step_store
from tokennet.layers.quantize import decoding_copy
from tokennet.models import create_model

pytestmark = pytest.mark.usefixtures("one_thread")


def _model(seed: int = 0):
    torch.manual_seed(seed)
    return create_model("gpt-micro", vocab_size=64, block_size=32, num_layers=1).eval()


def _eager(net, prompt=(1, 2, 3), token=4, capacity=16):
    caches = net.make_caches(capacity)
    with torch.inference_mode():
        net.forward_features(torch.tensor([list(prompt)]), caches=caches)
        return net.forward_head(net.forward_features(torch.tensor([[token]]), caches=caches))[:, -1]


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    """A store holding the one-row step of a tiny model, built once; its directory and the model."""
    root = tmp_path_factory.mktemp("store")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TOKENNET_CACHE", str(root))
        net = decoding_copy(_model(), "none")
        step = sampling.CompiledStep(net)
        caches = net.make_caches(16)
        with torch.inference_mode():
            net.forward_features(torch.tensor([[1, 2, 3]]), caches=caches)
            step(torch.tensor([[4]]), caches)
        assert step.compiled and step.compile_s > 0, "torch.compile did not work here"
        return root, step.artifact("B1")  # inside: the artifact's path is under TOKENNET_CACHE, this store


def _fresh(root, monkeypatch, tmp_path, seed: int = 0):
    """A copy of the kept store, and a new step over a new copy of the model (as a new process has)."""
    copy = tmp_path / "store"
    shutil.copytree(root, copy)
    monkeypatch.setenv("TOKENNET_CACHE", str(copy))
    net = decoding_copy(_model(seed), "none")
    return copy / "steps", net, sampling.CompiledStep(net)


def test_a_later_process_loads_the_kept_step_and_decodes_the_eager_logits(kept, monkeypatch, tmp_path, capfd):
    steps, net, step = _fresh(kept[0], monkeypatch, tmp_path)
    assert step.load("B1") and step.compiled and step.loaded_s is not None and step.compile_s is None
    # other lengths, another capacity, and a cache filled to its capacity by the step (generate's last token)
    for prompt, capacity in (((1, 2, 3), 16), ((5, 6, 7, 8, 9, 10, 11), 24), ((1, 2, 3), 4)):
        caches = net.make_caches(capacity)
        with torch.inference_mode():
            net.forward_features(torch.tensor([list(prompt)]), caches=caches)
            got = step(torch.tensor([[4]]), caches)
        torch.testing.assert_close(got, _eager(net, prompt, 4, capacity), rtol=1e-4, atol=1e-4)
    assert "rebuilding" not in capfd.readouterr().err


def test_the_plan_loads_a_kept_step_where_its_measured_speedup_repays_the_load(kept, monkeypatch, tmp_path):
    _, net, _ = _fresh(kept[0], monkeypatch, tmp_path)
    monkeypatch.delenv("TOKENNET_COMPILE", raising=False)
    measured = {"speedup": 3.0, "load": 0.5}
    monkeypatch.setattr(sampling, "_remembered", lambda net, what: measured.get(what))
    plan = sampling.CompilePlan(net, None, 100)
    assert plan.first_step() is None  # kept, but a load is a cost: decided after the probe like a compilation
    steps = [plan.observe(0.02, 99 - i) for i in range(4)]  # 96 · 20 ms · ⅔ ≈ 1.3 s saved > 0.5 s of loading
    assert steps[:3] == [None] * 3 and steps[3] is not None and not plan.declined
    assert steps[3].load("B1") and steps[3].compile_s is None  # its first call loads the kept step: no compilation
    short = sampling.CompilePlan(net, None, 10)  # 6 · 20 ms · ⅔ < 0.5 s: eager, and no builder is asked for
    assert [short.observe(0.02, 9 - i) for i in range(4)] == [None] * 4 and not short.declined
    measured["speedup"] = 1.0  # a machine where the compiled step is no faster: never taken
    never = sampling.CompilePlan(net, None, 10**6)
    assert [never.observe(0.02, 10**6 - i) for i in range(4)] == [None] * 4


def _edit_record(steps, change):
    record_path = next(steps.glob("*.json"))
    record = json.loads(record_path.read_text())
    change(record)
    record_path.write_text(json.dumps(record))
    os.chmod(record_path, 0o600)


@pytest.mark.parametrize("case, why", [
    ("torch", "another torch"),
    ("cpu", "another instruction set"),
    ("weights", "weights changed"),
    ("truncated", "damaged"),
    ("writable", "writable by others"),
    ("no record", "could not be read"),
    ("not json", "could not be read"),
])
def test_a_step_that_does_not_fit_is_never_run_and_says_why(kept, monkeypatch, tmp_path, capfd, case, why):
    steps, net, step = _fresh(kept[0], monkeypatch, tmp_path, seed=1 if case == "weights" else 0)
    step_file = next(steps.glob("*.step"))
    if case in ("torch", "cpu"):
        _edit_record(steps, lambda r: r["machine"].update({case: "something else"}))
    elif case == "truncated":
        step_file.write_bytes(step_file.read_bytes()[:1000])
    elif case == "writable":
        os.chmod(step_file, 0o666)
    elif case == "no record":
        next(steps.glob("*.json")).unlink()
    elif case == "not json":
        next(steps.glob("*.json")).write_text("{" * 400)
    ran = []
    monkeypatch.setattr(torch.compiler, "load_compiled_function", lambda *a, **k: ran.append(1))
    assert not step.load("B1") and step.compiled is None
    assert not ran  # loading a step unpickles it (runs code): a file that does not fit never gets there
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tokennet: rebuilding the compiled decoding step") and why in err[0]


def test_a_rebuilt_step_replaces_the_stale_one(kept, monkeypatch, tmp_path):
    steps, net, step = _fresh(kept[0], monkeypatch, tmp_path)
    _edit_record(steps, lambda r: r["machine"].update(torch="0.0"))
    caches = net.make_caches(16)
    with torch.inference_mode():
        net.forward_features(torch.tensor([[1, 2, 3]]), caches=caches)
        got = step(torch.tensor([[4]]), caches)  # loads nothing: compiles, and keeps the new one
    torch.testing.assert_close(got, _eager(net), rtol=1e-4, atol=1e-4)
    assert step.compile_s > 0
    assert json.loads(next(steps.glob("*.json")).read_text())["machine"]["torch"] == torch.__version__


def test_inputs_of_another_form_are_refused_by_a_loaded_step(kept, monkeypatch, tmp_path):
    _, net, step = _fresh(kept[0], monkeypatch, tmp_path)
    assert step.load("B1")
    loaded = step._fns["B1"].func
    caches = net.make_caches(16)
    with torch.inference_mode():
        net.forward_features(torch.tensor([[1, 2, 3]]), caches=caches)
        keys = torch.arange(4)
        torch._dynamo.mark_dynamic(keys, 0)
        buffers = [(c.k, c.v) for c in caches]
        with pytest.raises(step_store.StepMismatch, match="input"):
            loaded(step, torch.tensor([[4, 5]]), keys, buffers)  # two tokens where one was built for
        with pytest.raises(step_store.StepMismatch, match="input tensors"):
            loaded(step, torch.tensor([[4]]), keys, buffers[:0])


def test_the_key_names_the_thread_count_and_the_record_the_machine(kept):
    record = json.loads(kept[1].record_path.read_text())
    assert record["machine"]["threads"] == torch.get_num_threads() == 1
    assert record["machine"]["torch"] == torch.__version__ and record["format"] == step_store.FORMAT
    assert record["inputs"][0] == ["int64", [1, 1]]  # the token: static; the keys' length: dynamic
    assert record["inputs"][1] == ["int64", [None]]
    assert oct(os.stat(kept[1].path).st_mode & 0o777) == "0o600"


def test_the_compiled_verification_gives_the_eager_logits_for_every_draft_length(monkeypatch, tmp_path):
    """One graph for every number of drafts (K symbolic), over caches of any length; kept in the store as ``K``."""
    monkeypatch.setenv("TOKENNET_CACHE", str(tmp_path))
    net = decoding_copy(_model(), "none")
    verify = sampling.compiled_step(net, sampling.VerifyStep)
    for prompt, drafts in (((1, 2, 3), (4, 5)), ((1, 2, 3, 4, 5, 6), (7, 8, 9, 10, 11)), ((9,), (3, 3, 3))):
        caches, reference = net.make_caches(24), net.make_caches(24)
        with torch.inference_mode():
            net.forward_features(torch.tensor([list(prompt)]), caches=caches)
            net.forward_features(torch.tensor([list(prompt)]), caches=reference)
            got = verify(torch.tensor([list(drafts)]), caches)
            want = net.forward_head(net.forward_features(torch.tensor([list(drafts)]), caches=reference))[0]
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert caches[0].length == reference[0].length == len(prompt) + len(drafts)
    assert verify.compiled and len(verify._fns) == 1 and any((tmp_path / "steps").glob("VerifyStep-K-*.step"))
    full = net.make_caches(6)
    with torch.inference_mode():
        net.forward_features(torch.tensor([[1, 2, 3]]), caches=full)
        assert verify(torch.tensor([[4, 5, 6]]), full) is None  # fills the cache: left to the eager forward
    assert full[0].length == 3
