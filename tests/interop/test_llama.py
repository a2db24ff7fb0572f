"""Llama checkpoints on tokennet's GPT (RMSNorm, SwiGLU, RoPE base, GQA, no bias): equal to transformers'."""

import json

import pytest
import torch

import tokennet
from tokennet.interop import import_checkpoint
from tokennet.interop.llama import unpermute
from tokennet.sampling import generate

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("tied", [False, True])
def test_logits_and_cached_decoding_equal_transformers(tmp_path, randomized, tied):
    # 6 query heads sharing 2 key/value heads (GQA), head width 8, vocab 101, intermediate 80 (not 4·D).
    cfg = transformers.LlamaConfig(vocab_size=101, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                                   num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=32,
                                   rope_theta=1e5, rms_norm_eps=1e-5, tie_word_embeddings=tied, bos_token_id=1,
                                   eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    hf = randomized(transformers.LlamaForCausalLM(cfg))
    hf.save_pretrained(tmp_path / "hf")
    run = tokennet.load(import_checkpoint(tmp_path / "hf", tmp_path / "run").path)
    c = run.model.config
    assert (c.norm_layer, c.gated_mlp, c.activation, c.rope_base, c.bias, c.num_kv_heads, c.tie_weights) == \
        ("rmsnorm", True, "silu", 1e5, False, 2, tied)
    ids = torch.randint(101, (3, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref, ours = hf(ids).logits, run.model(ids).logits
        assert (ours - ref).abs().max() <= 1e-5
        prompt = ids[:1, :5]
        out, want = hf(prompt, use_cache=True), prompt
        for _ in range(12):
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)  # (1, 1)
            want = torch.cat([want, nxt], dim=1)
            out = hf(nxt, past_key_values=out.past_key_values, use_cache=True)
    assert generate(run.model, prompt, 12, temperature=0).tolist() == want.tolist()


def test_unpermute_inverts_llama_cpp_permutation():
    """llama.cpp's convert_hf_to_gguf.py: ``w.reshape(H, 2, E/2, D).swapaxes(1, 2).reshape(H·E, D)``."""
    H, E, D = 3, 8, 5
    w = torch.randn(H * E, D)
    permuted = w.reshape(H, 2, E // 2, D).swapaxes(1, 2).reshape(H * E, D)
    assert not torch.equal(permuted, w)
    assert torch.equal(unpermute(permuted, H), w)
    # Per head, the rotate-half pairs (j, j + E/2) become adjacent rows (2j, 2j + 1) in llama.cpp's layout.
    assert torch.equal(permuted[0], w[0]) and torch.equal(permuted[1], w[E // 2])


def test_unknown_llama_field_is_refused(tmp_path):
    cfg = transformers.LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, max_position_embeddings=8, bos_token_id=0, eos_token_id=0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "hf")
    f = tmp_path / "hf" / "config.json"
    f.write_text(json.dumps({**json.loads(f.read_text()), "sliding_window": 4}))
    with pytest.raises(tokennet.TokennetError, match="sliding_window"):
        import_checkpoint(tmp_path / "hf", tmp_path / "run")
    assert not (tmp_path / "run").exists()
