"""Decoding takes the compiled step where it pays (TOKENNET_COMPILE unset: the steps ahead decide; 1: always) and
gives the eager greedy tokens.

The rest of the suite decodes eagerly (tests/conftest.py sets TOKENNET_COMPILE=0); this module is the one place
the default path itself is compiled, on a one-layer model so the compilation takes seconds.
"""

from __future__ import annotations

import types

import pytest
import torch

from tokennet import sampling
from tokennet.models import create_model
from tokennet.sampling import CompilePlan, compile_default, compile_mode, generate

pytestmark = pytest.mark.usefixtures("one_thread")


def _model():
    torch.manual_seed(0)
    return create_model("gpt-micro", vocab_size=64, block_size=32, num_layers=1).eval()


def test_the_environment_sets_the_default_and_an_argument_overrides_it(monkeypatch):
    monkeypatch.delenv("TOKENNET_COMPILE", raising=False)
    assert compile_default() is True and compile_mode() == "auto"  # a user's default: where it pays
    for off in ("0", "false", "off", "no"):
        monkeypatch.setenv("TOKENNET_COMPILE", off)
        assert compile_default() is False
        assert compile_default(True) is True
        assert compile_mode() == "off" and compile_mode(True) == "on"
    monkeypatch.setenv("TOKENNET_COMPILE", "1")
    assert compile_default() is True and compile_mode() == "on"
    assert compile_default(False) is False and compile_mode(False) == "off"


def test_the_compiled_path_gives_the_eager_greedy_tokens(monkeypatch):
    m = _model()
    prompt = torch.randint(64, (1, 4))
    made = []
    real = sampling.compiled_step

    def spy(net):
        step = real(net)
        made.append(step)
        return step

    monkeypatch.setattr(sampling, "compiled_step", spy)
    monkeypatch.setenv("TOKENNET_COMPILE", "0")
    eager = generate(m, prompt, 12, temperature=0)
    assert not made  # TOKENNET_COMPILE=0: eager
    monkeypatch.setenv("TOKENNET_COMPILE", "1")
    compiled = generate(m, prompt, 12, temperature=0)  # no compile= argument: the environment's choice
    assert len(made) == 1 and made[0].compiled, "the compiled decoding path did not compile"
    assert (made[0].compile_s or made[0].loaded_s) > 0  # compiled here, or loaded: kept by an earlier run
    assert torch.equal(compiled, eager)
    made.clear()
    assert torch.equal(generate(m, prompt, 12, temperature=0, compile=False), eager)
    assert not made  # compile=False opts out



@pytest.mark.parametrize("backend", ["eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_a_one_token_prompt_on_the_compiled_default(monkeypatch, backend):
    """gpt-char's end-of-training sample: one prompt token (the caches are empty until its eager prefill), sampled
    at temperature 0.8 on the compiled default path (the main job failed here once: 5605bc0). Dynamo traces the
    real step either way; ``eager`` skips Inductor's code generation (seconds instead of tens of seconds)."""
    made = []
    real = sampling.compiled_step

    def spy(net):
        step = real(net)
        if backend == "eager" and not made:
            step.fn = torch.compile(types.MethodType(sampling.CompiledStep._step, step), fullgraph=True,
                                    dynamic=False, backend="eager")
        made.append(step)
        return step

    monkeypatch.setattr(sampling, "compiled_step", spy)
    m = _model()
    prompt = torch.randint(64, (1, 1))
    monkeypatch.setenv("TOKENNET_COMPILE", "0")
    eager = generate(m, prompt, 10, temperature=0)
    sampled_eager = generate(m, prompt, 10, temperature=0.8, generator=torch.Generator().manual_seed(0))
    assert not made
    monkeypatch.setenv("TOKENNET_COMPILE", "1")
    assert torch.equal(generate(m, prompt, 10, temperature=0), eager)
    assert made and made[0].compiled, "the one-token prompt did not reach the compiled step"
    sampled = generate(m, prompt, 10, temperature=0.8, generator=torch.Generator().manual_seed(0))
    assert sampled.shape == (1, 11) and torch.equal(sampled, sampled_eager)


def _plan_with(monkeypatch, compile_seconds, tmp_path_factory=None):
    made = []
    monkeypatch.setenv("TOKENNET_CACHE", "/nonexistent/tokennet-cache")  # no step kept on this machine
    monkeypatch.setattr(sampling, "compiled_step", lambda net: made.append(net) or "the compiled step")
    monkeypatch.setattr(sampling, "_compile_seconds", lambda net: compile_seconds)
    monkeypatch.setattr(sampling, "_remembered", lambda net, what: None)  # no speedup or load measured here
    return made


def test_auto_compiles_only_where_the_steps_ahead_repay_it(monkeypatch):
    """saved = steps left · t_eager · (1 − 1/speedup) against the cost of compiling: a short answer never waits for
    a compile, a long one pays for it; nothing is decided before PROBE eager steps are timed."""
    monkeypatch.delenv("TOKENNET_COMPILE", raising=False)
    made = _plan_with(monkeypatch, 10.0)
    short = CompilePlan(_model(), None, 16)
    assert short.first_step() is None
    assert [short.observe(0.05, 15 - i) for i in range(5)] == [None] * 5  # 13 · 50 ms · ½ ≪ 10 s
    assert not made and short.decided
    long = CompilePlan(_model(), None, 4000)
    got = [long.observe(t, 3999 - i) for i, t in enumerate([2.0, 0.05, 0.06, 0.07])]  # 3996 · 50 ms · ½ ≈ 100 s
    assert got == [None, None, None, "the compiled step"] and len(made) == 1
    assert CompilePlan(_model(), None, 4000).observe(0.05, 10) is None  # still probing
    never = _plan_with(monkeypatch, None)  # never measured here: UNMEASURED_COMPILE_S
    plan = CompilePlan(_model(), None, 200)
    assert [plan.observe(0.05, 199 - i) for i in range(4)] == [None] * 4 and not never  # 5 s < 30 s
    slow_start = CompilePlan(_model(), None, 400)  # a slow first step (one-time costs) does not decide it
    assert [slow_start.observe(t, 399 - i) for i, t in enumerate([1.0, 0.006, 0.2, 0.006])] == [None] * 4


def test_forced_modes_and_a_step_compiled_earlier_in_this_process(monkeypatch):
    made = _plan_with(monkeypatch, 0.0)
    assert CompilePlan(_model(), True, 4).first_step() == "the compiled step"  # on: at once, however short
    off = CompilePlan(_model(), False, 10**6)
    assert off.first_step() is None and off.observe(1.0, 10**6) is None and len(made) == 1
    monkeypatch.delenv("TOKENNET_COMPILE", raising=False)
    m = _model()
    ready = types.SimpleNamespace(compiled=True)
    monkeypatch.setitem(sampling._STEPS, m, {sampling.CompiledStep: ready})
    assert CompilePlan(m, None, 4).first_step() is ready  # compiled already: free, taken at once


def test_a_compile_time_is_remembered_for_the_next_decision(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    m = _model()
    assert sampling._compile_seconds(m) is None
    sampling._remember_compile_seconds(m, 12.345)
    assert sampling._compile_seconds(m) == 12.35
    other = create_model("gpt-micro", vocab_size=64, block_size=32, num_layers=2)
    assert sampling._compile_seconds(other) is None  # another model: another cost
    (tmp_path / "tokennet-compile-seconds.json").write_text("[" * 500 + "]" * 500)  # damaged: estimate again
    assert sampling._compile_seconds(m) is None


def test_a_short_generation_on_the_default_path_does_not_compile_and_gives_the_eager_tokens(monkeypatch):
    monkeypatch.delenv("TOKENNET_COMPILE", raising=False)
    made = _plan_with(monkeypatch, None)
    m = _model()
    prompt = torch.randint(64, (1, 4))
    got = generate(m, prompt, 12, temperature=0)
    assert not made
    assert torch.equal(got, generate(m, prompt, 12, temperature=0, compile=False))
