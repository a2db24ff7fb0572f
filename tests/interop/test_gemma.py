"""Gemma 3 from GGUF without the real weights: a tiny random ``transformers`` Gemma3ForCausalLM written to a GGUF file
the way llama.cpp's converter writes it (``gemma3`` names, norm gains stored as 1 + w, a SentencePiece vocabulary in
``tokenizer.ggml.*``), imported with ``tokennet import`` and held equal to the model it came from: logits (fp32,
1e-4) over more tokens than the sliding window, greedy tokens with the KV cache, and the serving engine's per-row
forward. Then a GGUF of an architecture tokennet cannot run: one line naming it and the supported ones, exit 2."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tokennet
from tokennet.cli import main
from tokennet.errors import TokennetError
from tokennet.interop import import_checkpoint

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

pytestmark = pytest.mark.usefixtures("one_thread")

WINDOW = 4
# A tiny SentencePiece vocabulary: specials, byte pieces, characters and a few merges.
CHARS = list("abcdefghijklmnopqrstuvwxyz.,!?") + ["\u2581"]
MERGES = ["\u2581t", "th", "\u2581th", "he", "\u2581the", "in", "ing", "\u2581a", "an", "\u2581an", "nd", "\u2581and",
          "er", "es", "on", "\u2581on"]


def tiny_vocab():
    pieces = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "\n\n", "  "]
    types = [3, 3, 3, 3, 3, 3, 4, 4]
    pieces += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    pieces += CHARS + MERGES
    types += [1] * (len(CHARS) + len(MERGES))
    scores = [0.0] * 264 + [-100.0 - i for i in range(len(CHARS))] + [-1.0 - 0.5 * i for i in range(len(MERGES))]
    return pieces, scores, types


GGUF_NAMES = {  # GGUF name in blk.i → HF name in model.layers.i
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "post_ffw_norm": "post_feedforward_layernorm",
}


def write_gemma_gguf(path, hf, *, arch="gemma3", extra_key=None, quantized=None):
    """``hf`` as llama.cpp's convert_hf_to_gguf.py writes a Gemma 3: norm gains + 1, tied head, F32 tensors
    (``quantized``: GGUF layer name, e.g. ``attn_q``, → the quantized type its matrices are written in)."""
    c = hf.config
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in hf.state_dict().items()}
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(1e6)
    w.add_sliding_window(c.sliding_window)
    if extra_key:
        w.add_float32(f"{arch}.{extra_key}", 30.0)
    pieces, scores, types = tiny_vocab()
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(pieces)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)
    norm = lambda a: (a + 1.0).astype(np.float32)  # noqa: E731 - llama.cpp stores Gemma's gains as 1 + w
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(c.num_hidden_layers):
        for g, h in GGUF_NAMES.items():
            a = sd[f"model.layers.{i}.{h}.weight"]
            if quantized and g in quantized:
                kind = gguf.GGMLQuantizationType[quantized[g]]
                w.add_tensor(f"blk.{i}.{g}.weight", gguf.quants.quantize(a, kind), raw_dtype=kind)
            else:
                w.add_tensor(f"blk.{i}.{g}.weight", norm(a) if "norm" in g else a)
    w.add_tensor("output_norm.weight", norm(sd["model.norm.weight"]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random 7-layer Gemma 3 (layers 0–4 and 6 in a window of 4, layer 5 global), head width 32 ≠ D/H = 24."""
    cfg = transformers.Gemma3TextConfig(
        vocab_size=len(tiny_vocab()[0]), hidden_size=48, intermediate_size=96, num_hidden_layers=7,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=WINDOW, max_position_embeddings=64,
        query_pre_attn_scalar=32, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    hf = transformers.Gemma3ForCausalLM(cfg).eval()
    hf.config._attn_implementation = "eager"
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)  # norm offsets w too (HF leaves them at 0)
    d = tmp_path_factory.mktemp("gemma")
    path = write_gemma_gguf(d / "tiny-gemma3.gguf", hf)
    return hf, path, tokennet.load(import_checkpoint(path, d / "run").path)


def test_imported_config_is_gemma3(tiny):
    _, _, run = tiny
    c = run.model.config
    assert c.attention_windows == [WINDOW] * 5 + [0] + [WINDOW]
    assert (c.norm_layer, c.qk_norm, c.norm_placement, c.head_dim) == ("rmsnorm1p", "rmsnorm1p", "sandwich", 32)
    assert c.embedding_scale == pytest.approx(48 ** 0.5) and c.tie_weights
    assert (c.rope_base, c.rope_local_base) == (1e6, 1e4)
    assert run.tokenizer.kind == "sentencepiece"


def test_logits_equal_transformers(tiny):
    hf, _, run = tiny
    ids = torch.randint(0, hf.config.vocab_size, (2, 13), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits
        ours = run.model(ids).logits
    assert ours.shape == ref.shape
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)


def test_cached_decoding_and_rows_equal_transformers(tiny):
    """Greedy tokens with the KV cache (past the window) equal transformers'; the engine's per-row forward (each row
    at its own position, a key mask) gives the same logits as the plain forward."""
    hf, _, run = tiny
    prompt = torch.tensor([[2, 40, 41, 42]])
    with torch.no_grad():
        ref = hf.generate(prompt, max_new_tokens=12, do_sample=False, min_new_tokens=12)[0, 4:].tolist()
    from tokennet.sampling import generate

    ours = generate(run.model, prompt, 12, temperature=0.0)[0, 4:].tolist()
    assert ours == ref
    m = run.model
    ids = torch.randint(0, hf.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = m(ids).logits[0]  # (9, V)
        caches = m.make_caches(16)
        m.forward_features(ids[:, :6], caches=caches)
        steps = []
        for t in range(6, 9):  # one token at a time at explicit positions, with a key mask over the cache
            mask = torch.ones(1, 1, 1, t + 1, dtype=torch.bool)
            h = m.forward_features(ids[:, t:t + 1], caches=caches, positions=torch.tensor([[t]]), mask=mask)
            steps.append(m.forward_head(h)[0, 0])
    torch.testing.assert_close(torch.stack(steps), full[6:], atol=1e-4, rtol=1e-4)


def test_tokenizer_saved_with_the_run(tiny):
    _, _, run = tiny
    tok = run.tokenizer
    text = "the thing and an ant  on\n\nit? é"
    ids = tok.encode(text)
    assert ids[0] == 2 and tok.decode(ids) == text
    assert 4 in tok.encode("<start_of_turn>the") and tok.stop_ids == [1, 5]


def test_unknown_gemma3_field_is_one_line(tiny, tmp_path, capsys):
    hf, _, _ = tiny
    path = write_gemma_gguf(tmp_path / "t.gguf", hf, extra_key="final_logit_softcapping")
    assert main(["import", str(path), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert "gemma3.final_logit_softcapping" in err and "\n" not in err
    assert not (tmp_path / "run").exists()


def test_unsupported_architecture_names_it_and_the_supported_ones(tiny, tmp_path, capsys):
    hf, _, _ = tiny
    path = write_gemma_gguf(tmp_path / "phi.gguf", hf, arch="phi3")
    with pytest.raises(TokennetError, match="phi3"):
        import_checkpoint(path, tmp_path / "run")
    assert main(["import", str(path), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tokennet: error:") and "\n" not in err, err
    assert "'phi3'" in err and all(a in err for a in ("llama", "gpt2", "gemma3")), err
    assert not (tmp_path / "run").exists()


def test_mixed_type_qkv_stays_blocks(tmp_path):
    """Gemma 3 270M's layers mix Q5_0 Q and K with a Q8_0 V: the stacked ``qkv_proj`` is held as Q8_0 blocks (Q5_0
    widens to Q8_0 exactly), not float32, and the model's logits are those of the all-float32 import."""
    from tokennet.interop import convert
    from tokennet.layers.blockquant import BlockLinear

    cfg = transformers.Gemma3TextConfig(
        vocab_size=len(tiny_vocab()[0]), hidden_size=64, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=WINDOW, max_position_embeddings=64,
        query_pre_attn_scalar=32, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    hf = transformers.Gemma3ForCausalLM(cfg).eval()
    mix = {"attn_q": "Q5_0", "attn_k": "Q5_0", "attn_v": "Q8_0"}
    path = write_gemma_gguf(tmp_path / "mixed.gguf", hf, quantized=mix)
    blocks, _, _, notes = convert(path)
    floats, _, _, _ = convert(path, keep_blocks=False)
    for blk in blocks.decoder.blocks:
        assert isinstance(blk.attn.qkv_proj, BlockLinear) and blk.attn.qkv_proj.fmt == "q8_0"
    assert any("held as Q8_0 blocks" in n for n in notes) and not any("dequantized" in n for n in notes)
    for a, b in zip(blocks.decoder.blocks, floats.decoder.blocks):
        assert torch.equal(a.attn.qkv_proj.dequantized_weight(), b.attn.qkv_proj.weight)
    ids = torch.randint(0, cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(blocks(ids).logits, floats(ids).logits, atol=1e-5, rtol=1e-5)
