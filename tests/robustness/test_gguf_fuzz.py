"""GGUF files (``tokennet import FILE.gguf``, :mod:`tokennet.interop.gguf_in`) damaged every way: one line, no
traceback, no hang, no gigabytes allocated for a declared count, the file unchanged, nothing written on failure."""

from __future__ import annotations

import shutil
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from robustness.fuzzing import FUZZ, check_cli, check_reader, mutated

from tokennet.errors import TokennetError
from tokennet.interop import import_checkpoint

gguf = pytest.importorskip("gguf")
pre_tokenizers = pytest.importorskip("tokenizers.pre_tokenizers")

pytestmark = pytest.mark.usefixtures("one_thread")

DIM, HEADS, KV_HEADS, FFN, LAYERS, CONTEXT = 16, 2, 1, 32, 1, 32


def write_tiny_gguf(path: Path) -> Path:
    """A tiny Llama-architecture GGUF, as llama.cpp's converter lays it out: metadata, a byte-level BPE vocabulary
    of 256 byte tokens, 2 merges and 2 specials, and random float32 tensors (one F16, one Q8_0)."""
    chars = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = [*chars, "Ġt", "he", "<s>", "</s>"]
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(LAYERS)
    w.add_context_length(CONTEXT)
    w.add_embedding_length(DIM)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(1e4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in ("<s>", "</s>") else 1 for t in tokens])
    w.add_token_merges(["Ġ t", "h e"])
    w.add_bos_token_id(len(tokens) - 2)
    w.add_eos_token_id(len(tokens) - 1)
    w.add_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}")

    def t(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    w.add_tensor("token_embd.weight", t(len(tokens), DIM))
    w.add_tensor("output_norm.weight", 1 + t(DIM))
    w.add_tensor("output.weight", t(len(tokens), DIM).astype(np.float16))
    head = DIM // HEADS
    for i in range(LAYERS):
        w.add_tensor(f"blk.{i}.attn_norm.weight", 1 + t(DIM))
        w.add_tensor(f"blk.{i}.attn_q.weight", t(DIM, DIM))
        w.add_tensor(f"blk.{i}.attn_k.weight", t(KV_HEADS * head, DIM))
        w.add_tensor(f"blk.{i}.attn_v.weight", t(KV_HEADS * head, DIM))
        w.add_tensor(f"blk.{i}.attn_output.weight", t(DIM, DIM))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", 1 + t(DIM))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", t(FFN, DIM))
        w.add_tensor(f"blk.{i}.ffn_up.weight", t(FFN, DIM))
        down = gguf.quants.quantize(t(DIM, FFN), gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor(f"blk.{i}.ffn_down.weight", down, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def seed_gguf(tmp_path_factory):
    path = write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    header = gguf.GGUFReader(str(path)).data_offset  # metadata and tensor infos: where a flip changes structure
    return path, path.read_bytes(), header


def _import(data: bytes):
    """``import_checkpoint`` of ``data`` in a fresh directory: the reader's outcome and what was left on disk."""
    d = Path(tempfile.mkdtemp(prefix="gguf-fuzz-"))
    try:
        src = d / "m.gguf"
        src.write_bytes(data)
        out = check_reader(lambda: import_checkpoint(src, d / "run"), src)
        left = sorted(p.name for p in d.iterdir())
        return out, left
    finally:
        shutil.rmtree(d)


def test_the_seed_imports(seed_gguf):
    out, left = _import(seed_gguf[1])
    assert not isinstance(out, TokennetError), out
    assert left == ["m.gguf", "run"]


@FUZZ
@given(data=st.data())
def test_damaged_gguf_is_one_line(seed_gguf, data):
    path, seed, header = seed_gguf
    damaged = data.draw(mutated(seed, hot=header), label="mutation").data
    out, left = _import(damaged)
    if isinstance(out, TokennetError):
        assert left == ["m.gguf"], f"a failed import left {left}"


def _header_counts(seed: bytes) -> dict[str, int]:
    """Byte offsets of the header's declared counts: tensor count, kv count, the first key's length."""
    return {"tensor_count": 8, "kv_count": 16, "first key length": 24}


@pytest.mark.parametrize("where", ["tensor_count", "kv_count", "first key length"])
@pytest.mark.parametrize("value", [2**32 - 1, 2**62, 2**64 - 1])
def test_inflated_header_counts_fail_fast(seed_gguf, where, value):
    """A declared count far beyond the file's size is refused without allocating for it or looping over it
    (``check_reader``'s alarm fails a loop; the reader may not build 2**62 of anything)."""
    path, seed, _ = seed_gguf
    data = bytearray(seed)
    off = _header_counts(seed)[where]
    data[off:off + 8] = struct.pack("<Q", value)
    out, left = _import(bytes(data))
    assert isinstance(out, TokennetError), out
    assert left == ["m.gguf"]


def test_an_inflated_array_length_fails_fast(seed_gguf):
    """Found by the fuzzing: the length of an array of numbers (``tokenizer.ggml.token_type``) set to 2**40 made the
    gguf package loop over 2**40 empty reads past the end of the file; tokennet's reader refuses any read past it."""
    path, seed, _ = seed_gguf
    f = gguf.GGUFReader(str(path)).fields["tokenizer.ggml.token_type"]
    at = f.offset + sum(int(p.nbytes) for p in f.parts[:4])  # key length, key, value type, item type → the count
    data = bytearray(seed)
    data[at:at + 8] = struct.pack("<Q", 2**40)
    out, left = _import(bytes(data))
    assert isinstance(out, TokennetError) and "past the end" in str(out), out
    assert left == ["m.gguf"]


def test_inflated_model_sizes_are_checked_against_the_tensors(seed_gguf, tmp_path):
    """``llama.block_count``, ``llama.embedding_length``, ... rewritten to 2**30: the header's sizes disagree with the
    tensors the file holds, and the converter says so before it builds (or loops over) a model of that size.
    (``context_length`` is not among them: it allocates nothing, a cache is as long as the text decoded.)"""
    path, seed, _ = seed_gguf
    reader = gguf.GGUFReader(str(path))
    for key in ("llama.block_count", "llama.embedding_length", "llama.feed_forward_length", "llama.vocab_size",
                "llama.attention.head_count", "llama.attention.head_count_kv"):
        f = reader.fields[key]
        value_at = f.offset + sum(int(p.nbytes) for p in f.parts[:-1])
        data = bytearray(seed)
        data[value_at:value_at + 4] = struct.pack("<I", 2**30)
        out, left = _import(bytes(data))
        assert isinstance(out, TokennetError), (key, out)
        assert left == ["m.gguf"], key


def test_a_metadata_string_that_is_not_utf8_is_one_line(seed_gguf):
    """Found by the fuzzing: ``general.architecture``'s bytes flipped to invalid UTF-8 raised UnicodeDecodeError."""
    path, seed, _ = seed_gguf
    f = gguf.GGUFReader(str(path)).fields["general.architecture"]
    at = f.offset + sum(int(p.nbytes) for p in f.parts[:-1])  # the string's first byte
    data = bytearray(seed)
    data[at] = 0xFF
    out, left = _import(bytes(data))
    assert isinstance(out, TokennetError) and "general.architecture" in str(out), out
    assert left == ["m.gguf"]


@pytest.mark.parametrize("cut", [0, 3, 20, 200, -1])
def test_cli_import_of_a_damaged_gguf_is_one_line(seed_gguf, tmp_path, cut):
    path, seed, header = seed_gguf
    src = tmp_path / "m.gguf"
    src.write_bytes(seed[:cut] if cut >= 0 else seed[:header] + b"\xff" * 64)
    code, err = check_cli(["-q", "import", str(src), "--out", str(tmp_path / "run")], src)
    assert code == 2, err
    assert not (tmp_path / "run").exists()
