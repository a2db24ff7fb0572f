"""GGUF import without the real-weight packages: a tiny Llama written to GGUF the way llama.cpp's converter
writes it (Q/K rows permuted, names ``blk.i.*``, byte-level BPE vocabulary in ``tokenizer.ggml.*``), read
back on tokennet's GPT and held equal to the ``transformers`` model it came from; then every kind of bad
GGUF file: one line, exit 2, nothing written."""

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
tokenizers = pytest.importorskip("tokenizers")

pytestmark = pytest.mark.usefixtures("one_thread")

CORPUS = ["The capital of France is Paris. The capital of Italy is Rome. " * 3,
          "Attention is all you need: queries, keys and values 1234567890."]
HF_NAMES = {"attn_norm": "input_layernorm", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
            "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py permutation of Q/K rows (HF's rotate-half order → interleaved pairs)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, hf, engine, *, arch="llama", q8_1_tensor=False, extra_key=None, vocab_tokens=None,
               bad_merge=False, q8_0=False):
    """``q8_0``: every matrix whose rows are whole blocks of 32 is written as Q8_0 (kept as blocks on import)."""
    from gguf.quants import quantize

    c = hf.config
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in hf.state_dict().items()}
    w = gguf.GGUFWriter(str(path), arch)

    def put(name, t):
        if q8_0 and t.ndim == 2 and t.shape[1] % 32 == 0:
            w.add_tensor(name, quantize(t, gguf.GGMLQuantizationType.Q8_0), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, t)

    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(1e5)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    if extra_key:
        w.add_float32(f"{arch}.{extra_key}", 2.0)
    vocab = engine.get_vocab()
    tokens = vocab_tokens or [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [" ".join(p) for p in engine.model.get_merges()] if hasattr(engine.model, "get_merges") else None
    if merges is None:
        import json
        merges = json.loads(engine.to_str())["model"]["merges"]
        merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    if bad_merge:
        merges = merges + ["zzqq qqzz"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in ("<s>", "</s>") else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab["<s>"])
    w.add_eos_token_id(vocab["</s>"])
    put("token_embd.weight", sd["model.embed_tokens.weight"])
    put("output_norm.weight", sd["model.norm.weight"])
    put("output.weight", sd["lm_head.weight"])
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        put(f"blk.{i}.attn_q.weight", _permute(sd[p + "self_attn.q_proj.weight"], c.num_attention_heads))
        put(f"blk.{i}.attn_k.weight", _permute(sd[p + "self_attn.k_proj.weight"], c.num_key_value_heads))
        put(f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        for ours, theirs in HF_NAMES.items():
            t = sd[p + theirs + ".weight"]
            # Q8_1: a quantization the gguf package cannot dequantize (ffn_down rows of 64 = 2 blocks of 32)
            if q8_1_tensor and ours == "ffn_down" and i == 0:
                block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_1]
                raw = np.zeros(t.size // block * size, dtype=np.uint8).reshape(t.shape[0], -1)
                w.add_tensor(f"blk.{i}.{ours}.weight", raw, raw_dtype=gguf.GGMLQuantizationType.Q8_1)
            else:
                put(f"blk.{i}.{ours}.weight", t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.interop.conftest import randomize

    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS * 5, vocab_size=300, min_frequency=1, special_tokens=["<s>", "</s>"])
    engine = bpe._tokenizer
    cfg = transformers.LlamaConfig(vocab_size=engine.get_vocab_size(), hidden_size=48, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                                   max_position_embeddings=64, rope_theta=1e5, rms_norm_eps=1e-5,
                                   tie_word_embeddings=False)
    torch.manual_seed(0)
    hf = randomize(transformers.LlamaForCausalLM(cfg))
    d = tmp_path_factory.mktemp("gguf")
    return hf, engine, write_gguf(d / "tiny.gguf", hf, engine)


def test_gguf_logits_tokenizer_and_greedy_decoding_equal_transformers(tiny, tmp_path):
    hf, engine, path = tiny
    run = tokennet.load(import_checkpoint(path, tmp_path / "run").path)
    text = "The capital of France is"
    ids = run.tokenizer.encode(text)
    assert ids == engine.encode(text).ids  # the vocabulary and merges came through
    x = torch.tensor([ids])
    with torch.no_grad():
        assert (run.model(x).logits - hf(x).logits).abs().max() <= 1e-5
        want = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=10, do_sample=False,
                           eos_token_id=None, pad_token_id=0)
    assert tokennet.sampling.generate(run.model, x, 10, temperature=0).tolist() == want.tolist()


def _tokens(engine) -> list[str]:
    return [t for t, _ in sorted(engine.get_vocab().items(), key=lambda kv: kv[1])]


def _truncated(tiny, d):
    data = tiny[2].read_bytes()
    (d / "t.gguf").write_bytes(data[: len(data) * 2 // 3])
    return d / "t.gguf"


def _header_only(tiny, d):
    (d / "t.gguf").write_bytes(tiny[2].read_bytes()[:64])
    return d / "t.gguf"


def _not_gguf(tiny, d):
    (d / "t.gguf").write_bytes(b"PK\x03\x04 a zip file, not a GGUF one")
    return d / "t.gguf"


BAD = {
    "truncated in the tensor data": (_truncated, "GGUF"),
    "truncated in the header": (_header_only, "GGUF"),
    "not a GGUF file": (_not_gguf, "GGUF"),
    "unsupported architecture": (lambda t, d: write_gguf(d / "t.gguf", t[0], t[1], arch="falcon"),
                                 "architecture 'falcon'"),
    "unsupported quantization": (lambda t, d: write_gguf(d / "t.gguf", t[0], t[1], q8_1_tensor=True), "Q8_1"),
    "unknown llama field": (lambda t, d: write_gguf(d / "t.gguf", t[0], t[1], extra_key="rope.scaling.factor"),
                            "llama.rope.scaling.factor"),
    "vocabulary that does not match the model": (
        lambda t, d: write_gguf(d / "t.gguf", t[0], t[1], vocab_tokens=_tokens(t[1])[:-5]),
        "tokens but the model"),
    "merges naming unknown tokens": (lambda t, d: write_gguf(d / "t.gguf", t[0], t[1], bad_merge=True),
                                     "do not fit together"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_gguf_is_one_line_and_writes_nothing(tiny, tmp_path, capsys, name):
    make, expected = BAD[name]
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    path = make(tiny, src_dir)
    with pytest.raises(TokennetError) as e:
        import_checkpoint(path, tmp_path / "run")
    assert expected in str(e.value), str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]
    assert main(["import", str(path), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tokennet: error:") and "\n" not in err and expected in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_import_counts_the_parameters_that_kept_blocks_hold(tmp_path, capsys):
    """Q8_0 matrices stay blocks (buffers, not ``nn.Parameter``s); the count printed is still every weight's."""
    from tests.interop.conftest import randomize
    from tokennet.layers.blockquant import BlockEmbedding, BlockLinear
    from tokennet.models.registry import parameter_count

    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS * 5, vocab_size=300, min_frequency=1, special_tokens=["<s>", "</s>"])
    cfg = transformers.LlamaConfig(vocab_size=bpe._tokenizer.get_vocab_size(), hidden_size=64, intermediate_size=96,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False)
    torch.manual_seed(0)
    hf = randomize(transformers.LlamaForCausalLM(cfg))
    path = write_gguf(tmp_path / "q8.gguf", hf, bpe._tokenizer, q8_0=True)
    assert main(["import", str(path), "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert f"({hf.num_parameters():,} parameters)" in out, out
    model = tokennet.load(tmp_path / "run").model
    kept = [m for m in model.modules() if isinstance(m, (BlockLinear, BlockEmbedding))]
    assert len(kept) >= 2 * 4 + 2  # each layer's attention and MLP matrices, the head and the embedding
    assert parameter_count(model) == hf.num_parameters() > 10 * sum(p.numel() for p in model.parameters())
