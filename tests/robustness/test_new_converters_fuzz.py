"""The newer converters fed damaged inputs: Hugging Face Qwen2, Mistral, BERT and ViT directories (a damaged
``config.json`` or ``model.safetensors``), a Gemma 3 GGUF with its SentencePiece vocabulary (damaged bytes, or
vocabulary fields of the wrong kind), and ``tokennet lm-eval`` with random ``--model_args``. Every case is a
correct import (or run) or one TokennetError line — never another exception, never a hang."""

from __future__ import annotations

import json
import shutil
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from robustness.fuzzing import FUZZ, check_cli, check_reader, mutated, mutated_json
from robustness.test_hf_import_fuzz import _import as import_hf

from tokennet.errors import TokennetError
from tokennet.interop import import_checkpoint

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

pytestmark = pytest.mark.usefixtures("one_thread")

ARCHS = ["qwen2", "mistral", "bert", "vit"]



def _gemma_tests():
    """tests/interop/test_gemma.py, loaded by its path: the name ``interop`` may already be another module in the
    session (bench/interop.py, which a bench test puts on the path)."""
    import importlib.util
    import sys
    from pathlib import Path

    name = "tokennet_tests_interop_test_gemma"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "interop" / "test_gemma.py"
        spec = importlib.util.spec_from_file_location(name, path)
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="module")

def hf_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf-new")
    torch.manual_seed(0)
    small = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, max_position_embeddings=32)
    transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**small)).save_pretrained(root / "qwen2")
    transformers.MistralForCausalLM(transformers.MistralConfig(**small, sliding_window=None)).save_pretrained(
        root / "mistral")
    transformers.BertModel(transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24,
        max_position_embeddings=20)).save_pretrained(root / "bert")
    transformers.ViTForImageClassification(transformers.ViTConfig(
        hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24, image_size=8, patch_size=4,
        num_labels=3)).save_pretrained(root / "vit")
    return {a: root / a for a in ARCHS}


@pytest.mark.parametrize("arch", ARCHS)
def test_the_hf_seeds_import(hf_dirs, arch):
    out = import_hf(hf_dirs[arch], "config.json", (hf_dirs[arch] / "config.json").read_bytes())
    assert not isinstance(out, TokennetError), out


@pytest.mark.parametrize("arch", ARCHS)
@FUZZ
@given(data=st.data())
def test_wrong_config_values_are_one_line(hf_dirs, arch, data):
    seed = json.loads((hf_dirs[arch] / "config.json").read_text())
    import_hf(hf_dirs[arch], "config.json", data.draw(mutated_json(seed), label="mutation").data)


@pytest.mark.parametrize("arch", ARCHS)
@FUZZ
@given(data=st.data())
def test_damaged_safetensors_are_one_line(hf_dirs, arch, data):
    seed = (hf_dirs[arch] / "model.safetensors").read_bytes()
    header = 8 + int.from_bytes(seed[:8], "little")
    import_hf(hf_dirs[arch], "model.safetensors", data.draw(mutated(seed, hot=header), label="mutation").data)


# -- Gemma 3 GGUF and its SentencePiece vocabulary -------------------------------------------------------------

@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """A one-layer random Gemma 3 written as llama.cpp writes it (tests/interop/test_gemma.py's writer)."""
    tiny_vocab, write_gemma_gguf = _gemma_tests().tiny_vocab, _gemma_tests().write_gemma_gguf

    cfg = transformers.Gemma3TextConfig(
        vocab_size=len(tiny_vocab()[0]), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, sliding_window=4, max_position_embeddings=32,
        query_pre_attn_scalar=8, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    hf = transformers.Gemma3ForCausalLM(cfg).eval()
    path = write_gemma_gguf(tmp_path_factory.mktemp("gemma") / "g.gguf", hf)
    return hf, path, path.read_bytes(), gguf.GGUFReader(str(path)).data_offset


def _import_gguf(data: bytes):
    d = Path(tempfile.mkdtemp(prefix="gemma-fuzz-"))
    try:
        src = d / "m.gguf"
        src.write_bytes(data)
        out = check_reader(lambda: _use(import_checkpoint(src, d / "run")), src)
        left = sorted(p.name for p in d.iterdir())
        if isinstance(out, TokennetError):
            assert left == ["m.gguf"], f"a failed import left {left}"
        return out
    finally:
        shutil.rmtree(d)


def _use(result):
    """An import that succeeded must give a tokenizer that works: encode and decode a text it never saw."""
    import tokennet

    tok = tokennet.load(result.path).tokenizer
    tok.decode(tok.encode("the fox é 1 <start_of_turn>"))
    return result


def test_a_gguf_with_nan_weights_is_refused_before_anything_is_written(gemma):
    """Found by the random fuzzing: a NaN in the tensor data imported, and the run it wrote could not be loaded."""
    seed, offset = bytearray(gemma[2]), gemma[3]
    seed[offset:offset + 4] = b"\x00\x00\xc0\x7f"  # a float32 NaN (and, read as float16, a zero and a NaN)
    out = _import_gguf(bytes(seed))
    assert isinstance(out, TokennetError) and "NaN or infinite" in str(out), out


def test_the_gemma_seed_imports(gemma):
    out = _import_gguf(gemma[2])
    assert not isinstance(out, TokennetError), out


@FUZZ
@given(data=st.data())
def test_damaged_gemma_gguf_is_one_line(gemma, data):
    _, _, seed, header = gemma
    _import_gguf(data.draw(mutated(seed, hot=header), label="mutation").data)


_NUMBERS = st.one_of(st.integers(-(2**40), 2**40), st.floats(allow_nan=True, allow_infinity=True),
                     st.sampled_from([0, -1, 2**31 - 1, 2**32 - 1]))


@st.composite
def _vocabulary_damage(draw, pieces, scores, types):
    """The SentencePiece fields changed as a hand edit or a broken converter would: a piece replaced, duplicated or
    dropped, a score NaN or huge, a type out of range, a special id outside the vocabulary, a list of other length."""
    pieces, scores, types = list(pieces), list(scores), list(types)
    ids = {"bos": 2, "eos": 1, "unk": 3, "pad": 0}
    kind = draw(st.sampled_from(["piece", "duplicate", "drop", "score", "type", "id", "scores_length", "types_length"]))
    i = draw(st.integers(0, len(pieces) - 1))
    if kind == "piece":
        pieces[i] = draw(st.text(max_size=6))
    elif kind == "duplicate":
        pieces[i] = pieces[draw(st.integers(0, len(pieces) - 1))]
    elif kind == "drop":
        del pieces[i], scores[i], types[i]
    elif kind == "score":
        scores[i] = draw(st.floats(allow_nan=True, allow_infinity=True, width=32))
    elif kind == "type":
        types[i] = draw(st.integers(-(2**31), 2**31 - 1))
    elif kind == "id":
        ids[draw(st.sampled_from(sorted(ids)))] = draw(st.integers(0, 2**32 - 1))  # a GGUF id is a uint32
    elif kind == "scores_length":
        scores = scores[:draw(st.integers(0, len(scores) - 1))]
    else:
        types = types[:draw(st.integers(0, len(types) - 1))]
    return kind, pieces, scores, types, ids


def _write_vocab_gguf(path: Path, hf, pieces, scores, types, ids) -> None:
    """test_gemma.py's file with the tokenizer fields replaced (the writer adds them; these are written instead)."""
    test_gemma = _gemma_tests()

    real = test_gemma.tiny_vocab
    test_gemma.tiny_vocab = lambda: (pieces, scores, types)
    original_ids = {}
    try:
        for name, value in ids.items():
            method = f"add_{name}_token_id"
            original_ids[method] = getattr(gguf.GGUFWriter, method)
            setattr(gguf.GGUFWriter, method, lambda self, _id, _v=value, _m=original_ids[method]: _m(self, _v))
        test_gemma.write_gemma_gguf(path, hf)
    finally:
        test_gemma.tiny_vocab = real
        for method, fn in original_ids.items():
            setattr(gguf.GGUFWriter, method, fn)


@FUZZ
@given(data=st.data())
def test_a_damaged_sentencepiece_vocabulary_is_one_line(gemma, data):
    tiny_vocab = _gemma_tests().tiny_vocab

    hf = gemma[0]
    kind, pieces, scores, types, ids = data.draw(_vocabulary_damage(*tiny_vocab()), label="damage")
    d = Path(tempfile.mkdtemp(prefix="sp-fuzz-"))
    try:
        try:
            _write_vocab_gguf(d / "v.gguf", hf, pieces, np.asarray(scores, dtype=np.float32).tolist(), types, ids)
        except (ValueError, OverflowError, struct.error):  # the gguf writer refuses a value it cannot store
            return
        _import_gguf((d / "v.gguf").read_bytes())
    finally:
        shutil.rmtree(d)


# -- tokennet lm-eval --model tokennet --model_args ... -------------------------------------------------------

_KEYS = st.sampled_from(["run", "device", "batch_size", "max_length", "quantize", "max_batch_size", "colour", "",
                         "Run", "run "])
_VALUES = st.one_of(st.sampled_from(["{run}", "8", "auto", "auto:4", "0", "-1", "abc", "1e3", "cpu", "cuda:0",
                                     "bf16", "int8", "none", "true", "None", "'quoted'", "[1, 2]", "{{}}", "",
                                     "9" * 5000, "-" * 3000 + "1", "[" * 300 + "]" * 300]),
                    st.text(max_size=12))


@st.composite
def _model_args(draw, run: str) -> list[str]:
    if draw(st.integers(0, 4)) == 0:  # lm-eval also takes one JSON object
        obj = draw(st.dictionaries(_KEYS, st.one_of(st.none(), st.booleans(), st.integers(-5, 2**70),
                                                    st.floats(allow_nan=False), _VALUES), max_size=4))
        return [json.dumps({k: v.format(run=run) if isinstance(v, str) and v == "{run}" else v
                            for k, v in obj.items()})]
    items = draw(st.lists(st.tuples(_KEYS, _VALUES), max_size=5))
    text = ",".join(f"{k}={v.format(run=run) if v == '{run}' else v}" for k, v in items)
    return [text] + draw(st.lists(st.sampled_from(["max_length=4", "oops", "batch_size=2", ","]), max_size=2))


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """A tiny gpt-char run (a few steps), for the arguments that name a real run."""
    from tokennet.cli import main

    root = tmp_path_factory.mktemp("lmargs")
    (root / "t.txt").write_text("hello world, the quick brown fox. " * 200)
    assert main(["-q", "train", "gpt-char", "--data", str(root / "t.txt"), "--out", str(root / "run"),
                 "--max-iters", "1", "--set", "dim=16", "num_layers=1", "num_heads=2", "block_size=16",
                 "batch_size=2", "eval_iters=1", "sample_tokens=0", "eval_interval=0"]) == 0
    return root / "run"


@FUZZ
@given(data=st.data())
def test_random_model_args_are_one_line(lm_run, monkeypatch, data):
    """Whatever tokennet's checks let through, lm-eval's own parse of the command line and the model it builds from
    it (as ``simple_evaluate`` does, without its task index) end in a model or one line."""
    pytest.importorskip("lm_eval")
    import lm_eval.__main__
    from lm_eval._cli.harness import HarnessCLI

    from tokennet.interop.lm_eval import TokennetLM

    def harness():  # lm-eval's cli_evaluate up to the model, without reading its thousands of tasks
        import sys

        args = HarnessCLI().parse_args()
        assert sys.argv[1] == "run" and args.model == "tokennet"
        TokennetLM.create_from_arg_obj(args.model_args or {}, {"batch_size": getattr(args, "batch_size", None),
                                                               "device": getattr(args, "device", None)})

    values = data.draw(_model_args(str(lm_run)), label="model_args")
    with monkeypatch.context() as m:
        m.setattr(lm_eval.__main__, "cli_evaluate", harness)
        check_cli(["lm-eval", "--model", "tokennet", "--model_args", *values, "--tasks", "x"])
