"""Qwen2 checkpoints (Llama with biases on q, k, v): a tiny random ``Qwen2ForCausalLM`` from ``transformers``, imported
from its Hugging Face directory and from a ``qwen2`` GGUF file written here with the ``gguf`` package (float32, and
with Q8_0 blocks), against the transformers model: fp32 logits within 1e-4 and the same greedy tokens."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import tokennet
from tokennet.cli import main
from tokennet.interop import import_checkpoint

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
tokenizers = pytest.importorskip("tokenizers")

pytestmark = pytest.mark.usefixtures("one_thread")

HF_NAMES = {"attn_norm": "input_layernorm", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
            "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
            "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.interop.conftest import randomize

    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(["The capital of France is Paris. Qwen attends with biases 0123456789."] * 20,
                            vocab_size=300, min_frequency=1, special_tokens=["<|endoftext|>"])
    engine = bpe._tokenizer
    cfg = transformers.Qwen2Config(vocab_size=engine.get_vocab_size(), hidden_size=64, intermediate_size=96,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=64, rope_theta=1e6, rms_norm_eps=1e-6,
                                   tie_word_embeddings=False, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    hf = randomize(transformers.Qwen2ForCausalLM(cfg)).eval()
    d = tmp_path_factory.mktemp("qwen2")
    hf.save_pretrained(d / "hf")
    engine.save(str(d / "hf" / "tokenizer.json"))
    return hf, engine, d


def write_qwen2_gguf(path, hf, engine, *, q8_0=False):
    """A qwen2 GGUF as llama.cpp's converter writes one: ``qwen2.*`` fields, ``blk.i.attn_{q,k,v}.{weight,bias}`` (no
    row permutation), byte-level BPE vocabulary; with ``q8_0`` the matrices in Q8_0 blocks."""
    c = hf.config
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in hf.state_dict().items()}
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    vocab = engine.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in json.loads(engine.to_str())["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    special = [t for t in tokens if t.startswith("<") and t.endswith(">") and len(t) > 2]
    w.add_token_types([3 if t in special else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_eos_token_id(vocab[special[-1]])

    def mat(name, a):
        if q8_0:
            w.add_tensor(name, gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, a)

    mat("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    mat("output.weight", sd["lm_head.weight"])
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        for ours, theirs in HF_NAMES.items():
            a = sd[p + theirs + ".weight"]
            (w.add_tensor if a.ndim == 1 else mat)(f"blk.{i}.{ours}.weight", a)
        for n in "qkv":
            w.add_tensor(f"blk.{i}.attn_{n}.bias", sd[p + f"self_attn.{n}_proj.bias"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _same_as_transformers(run, hf, engine, atol):
    text = "The capital of France is"
    ids = run.tokenizer.encode(text)
    assert ids == engine.encode(text).ids
    x = torch.tensor([ids])
    with torch.no_grad():
        diff = (run.model(x).logits - hf(x).logits).abs().max()
        assert diff <= atol, diff
        want = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=12, do_sample=False,
                           eos_token_id=None, pad_token_id=0)
    assert tokennet.sampling.generate(run.model, x, 12, temperature=0).tolist() == want.tolist()


def test_hf_qwen2_logits_and_greedy_tokens_equal_transformers(tiny, tmp_path):
    hf, engine, d = tiny
    r = import_checkpoint(d / "hf", tmp_path / "run")
    assert r.converter == "qwen2/Qwen2ForCausalLM"
    run = tokennet.load(r.path)
    c = run.model.config
    assert c.qkv_bias and not c.bias and run.model.decoder.blocks[0].attn.out_proj.bias is None
    _same_as_transformers(run, hf, engine, 1e-4)


def test_gguf_qwen2_logits_and_greedy_tokens_equal_transformers(tiny, tmp_path):
    hf, engine, d = tiny
    path = write_qwen2_gguf(tmp_path / "q.gguf", hf, engine)
    r = import_checkpoint(path, tmp_path / "run")
    assert r.converter == "gguf/qwen2"
    _same_as_transformers(tokennet.load(r.path), hf, engine, 1e-4)


def test_gguf_qwen2_in_q8_0_blocks_keeps_them_and_follows_transformers(tiny, tmp_path):
    from tokennet.layers.blockquant import BlockLinear

    hf, engine, d = tiny
    run = tokennet.load(import_checkpoint(write_qwen2_gguf(tmp_path / "q8.gguf", hf, engine, q8_0=True),
                                          tmp_path / "run").path)
    qkv = run.model.decoder.blocks[0].attn.qkv_proj
    assert isinstance(qkv, BlockLinear) and qkv.fmt == "q8_0" and qkv.bias is not None
    x = torch.tensor([engine.encode("The capital of France is").ids])
    with torch.no_grad():
        ref = hf(x).logits
        assert (run.model(x).logits - ref).abs().max() <= 0.05 * ref.abs().max()  # Q8_0's rounding


def test_qwen2_sliding_window_is_refused_in_one_line(tiny, tmp_path, capsys):
    hf, engine, d = tiny
    src = tmp_path / "sw"
    hf.save_pretrained(src)
    cfg = json.loads((src / "config.json").read_text())
    cfg["use_sliding_window"] = True
    (src / "config.json").write_text(json.dumps(cfg))
    capsys.readouterr()  # transformers' progress bars
    assert main(["import", str(src), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert "use_sliding_window" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()
