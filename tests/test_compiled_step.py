"""The compiled decoding step (torch.compile) computes what the eager step computes, and falls back to it."""

from __future__ import annotations

import logging

import pytest
import torch

from tokennet.layers.quantize import decoding_copy
from tokennet.models import create_model
from tokennet.sampling import CompiledStep, compiled_step, generate

pytestmark = pytest.mark.usefixtures("one_thread")

LLAMA = dict(position="rope", norm_layer="rmsnorm", gated_mlp=True, activation="silu", bias=False, num_kv_heads=2)


def _model(**kw):
    torch.manual_seed(0)
    return create_model("gpt-micro", vocab_size=96, block_size=48, **kw).eval()


def _eager_and_compiled_logits(net, prompt, steps, tol):
    """Per step: the eager logits and the compiled step's, both fed the eager greedy tokens (teacher-forced)."""
    step = compiled_step(net)
    out = []
    with torch.inference_mode():
        a, b = net.make_caches(48), net.make_caches(48)
        h = net.forward_features(prompt, caches=a)
        net.forward_features(prompt, caches=b)
        tok = net.forward_head(h[:, -1:])[:, -1].float().argmax(-1, keepdim=True)
        for _ in range(steps):
            ea = net.forward_head(net.forward_features(tok, caches=a))[:, -1].float()
            cb = step(tok, b).float()
            out.append((ea, cb))
            tok = ea.argmax(-1, keepdim=True)
    assert b[0].length == a[0].length
    for ca, cb in zip(a, b):  # the compiled step wrote the same keys and values into the caches
        n = ca.length
        torch.testing.assert_close(cb.k[:, :, :n].float(), ca.k[:, :, :n].float(), rtol=tol, atol=tol)
        torch.testing.assert_close(cb.v[:, :, :n].float(), ca.v[:, :, :n].float(), rtol=tol, atol=tol)
    return step, out


@pytest.mark.parametrize("mode", ["int4", pytest.param("int8", marks=pytest.mark.slow),
                                  pytest.param("bf16", marks=pytest.mark.slow)])
def test_compiled_step_equals_the_eager_step(mode):
    net = decoding_copy(_model(**LLAMA), mode)
    tol = 1e-4 if mode == "int4" else 3e-2  # int8 and bf16 compute in bfloat16: roundings differ a little
    step, pairs = _eager_and_compiled_logits(net, torch.randint(96, (1, 5)), 12, tol)
    assert step.compiled, "torch.compile did not work here"
    assert (step.compile_s or step.loaded_s) > 0  # compiled here, or loaded from the step store
    for eager, compiled in pairs:
        torch.testing.assert_close(compiled, eager, rtol=tol, atol=tol)
    assert compiled_step(net) is step  # kept with the decoding copy


@pytest.mark.slow
def test_generate_compiled_gives_the_eager_greedy_tokens_and_runs_past_the_context():
    m = _model(**LLAMA)
    prompt = torch.randint(96, (1, 6))
    eager = generate(m, prompt, 70, temperature=0, quantize="int4")  # 76 > block_size 48: the window slides
    compiled = generate(m, prompt, 70, temperature=0, quantize="int4", compile=True)
    assert compiled.shape == eager.shape == (1, 76)
    assert (compiled == eager).float().mean().item() >= 0.95  # float sums in another order: a rare near-tie may flip
    assert torch.equal(compiled[:, :20], eager[:, :20])


def test_a_failing_compiler_falls_back_to_eager_with_one_note(caplog, monkeypatch, tmp_path):
    monkeypatch.setenv("TOKENNET_CACHE", str(tmp_path))  # no step kept by another test
    m = _model()
    net = decoding_copy(m, "bf16")
    step = CompiledStep(net)

    def broken(*args):
        raise RuntimeError("no C++ compiler found\nsecond line")

    step._build = lambda variant, args: broken
    prompt = torch.randint(96, (2, 4))
    with torch.inference_mode():
        caches = net.make_caches(16)
        net.forward_features(prompt, caches=caches)
        with caplog.at_level(logging.WARNING, logger="tokennet.sampling"):
            logits = step(prompt[:, -1:], caches)
            logits = step(prompt[:, -1:], caches)
    assert step.compiled is False and logits.shape == (2, 96) and caches[0].length == 6
    notes = [r.getMessage() for r in caplog.records]
    assert len(notes) == 1 and "no C++ compiler found" in notes[0] and "second line" not in notes[0]
