"""Decoding takes the compiled step by default (TOKENNET_COMPILE unset or 1) and gives the eager greedy tokens.

The rest of the suite decodes eagerly (tests/conftest.py sets TOKENNET_COMPILE=0); this module is the one place
the default path itself is compiled, on a one-layer model so the compilation takes seconds.
"""

from __future__ import annotations

import types

import pytest
import torch

from tokennet import sampling
from tokennet.models import create_model
from tokennet.sampling import compile_default, generate

pytestmark = pytest.mark.usefixtures("one_thread")


def _model():
    torch.manual_seed(0)
    return create_model("gpt-micro", vocab_size=64, block_size=32, num_layers=1).eval()


def test_the_environment_sets_the_default_and_an_argument_overrides_it(monkeypatch):
    monkeypatch.delenv("TOKENNET_COMPILE", raising=False)
    assert compile_default() is True  # a user's default
    for off in ("0", "false", "off", "no"):
        monkeypatch.setenv("TOKENNET_COMPILE", off)
        assert compile_default() is False
        assert compile_default(True) is True
    monkeypatch.setenv("TOKENNET_COMPILE", "1")
    assert compile_default() is True
    assert compile_default(False) is False


def test_the_default_path_is_compiled_and_gives_the_eager_greedy_tokens(monkeypatch):
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
    monkeypatch.delenv("TOKENNET_COMPILE")
    compiled = generate(m, prompt, 12, temperature=0)  # no compile= argument: the default a user gets
    assert len(made) == 1 and made[0].compiled, "the default decoding path did not compile"
    assert made[0].compile_s > 0
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
    monkeypatch.delenv("TOKENNET_COMPILE")
    assert torch.equal(generate(m, prompt, 10, temperature=0), eager)
    assert made and made[0].compiled, "the one-token prompt did not reach the compiled step"
    sampled = generate(m, prompt, 10, temperature=0.8, generator=torch.Generator().manual_seed(0))
    assert sampled.shape == (1, 11) and torch.equal(sampled, sampled_eager)
