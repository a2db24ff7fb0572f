"""Mistral-style HF checkpoints: a tiny random ``transformers`` MistralForCausalLM (Llama's config with a sliding
window) imported with ``tokennet import`` and held equal to it: logits (fp32, 1e-4) over more tokens than the
window, and greedy tokens with the KV cache."""

from __future__ import annotations

import pytest
import torch

import tokennet
from tokennet.errors import TokennetError
from tokennet.interop import import_checkpoint
from tokennet.sampling import generate

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")

WINDOW = 4


def _tiny(path, window=WINDOW, seed=0):
    cfg = transformers.MistralConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, sliding_window=window,
                                     max_position_embeddings=64, rope_theta=10000.0)
    torch.manual_seed(seed)
    hf = transformers.MistralForCausalLM(cfg).eval()
    hf.config._attn_implementation = "eager"
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            noise = torch.randn(p.shape, generator=g) * 0.2
            p.copy_(1 + noise if name.endswith("norm.weight") else noise)
    hf.save_pretrained(path)
    return hf


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("mistral")
    hf = _tiny(d / "hf")
    return hf, tokennet.load(import_checkpoint(d / "hf", d / "run").path)


def test_config_has_the_window(tiny):
    _, run = tiny
    assert run.model.config.attention_windows == [WINDOW, WINDOW]


def test_logits_equal_transformers(tiny):
    hf, run = tiny
    ids = torch.randint(0, 97, (2, 14), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits
        ours = run.model(ids).logits
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)
    # The window matters here: the same weights attending globally give other logits.
    glob = tokennet.models.gpt.GPT(run.model.config.replace(attention_windows=None)).eval()
    glob.load_state_dict(run.model.state_dict())
    with torch.no_grad():
        assert (glob(ids).logits - ref).abs().max() > 1e-2


def test_greedy_tokens_equal_transformers(tiny):
    hf, run = tiny
    prompt = torch.tensor([[5, 17, 3]])
    with torch.no_grad():
        ref = hf.generate(prompt, max_new_tokens=16, min_new_tokens=16, do_sample=False)[0, 3:].tolist()
    assert generate(run.model, prompt, 16, temperature=0.0)[0, 3:].tolist() == ref


def test_bad_sliding_window_is_one_line(tmp_path):
    import json

    _tiny(tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    cfg["sliding_window"] = "wide"
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(TokennetError, match="sliding_window"):
        import_checkpoint(tmp_path / "hf", tmp_path / "run")
