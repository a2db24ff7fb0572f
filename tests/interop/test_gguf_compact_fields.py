"""read_gguf reads arrays compactly (one numpy array, or one bytes object for strings, per field instead of a numpy
view per element): every field must read back as the gguf package's own reader gives it; and a model holding blocks
takes the loaded tensors as they are, its tied table still one tensor."""

from __future__ import annotations

import pytest
import torch
from support import assert_same_function

gguf = pytest.importorskip("gguf")

from tokennet.interop.gguf_in import field, field_count, read_gguf  # noqa: E402


def _plain(f):
    """A field's value through the package's per-element parts."""
    T = gguf.GGUFValueType
    if f.types[0] == T.STRING:
        return bytes(f.parts[f.data[0]]).decode()
    if f.types[0] == T.ARRAY:
        if f.types[-1] == T.STRING:
            return [bytes(f.parts[i]).decode("utf-8", errors="replace") for i in f.data]
        return [f.parts[i].tolist()[0] for i in f.data]
    return f.parts[f.data[0]].tolist()[0]


def test_compact_arrays_read_as_the_package_reads_them(tmp_path):
    path = tmp_path / "f.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_array("t.strings", ["▁the", "", "<0x0A>", "héllo", "\u2581" * 3, "x" * 300])
    w.add_array("t.floats", [0.5, -1000.0, 3.25, 1e-7])
    w.add_array("t.ints", [1, 3, 6, 2])
    w.add_array("t.one", [7])
    w.add_array("t.empty", [])
    w.add_array("t.bools", [True, False, True])
    w.add_string("t.s", "a string")
    w.add_uint32("t.u", 5)
    w.add_tensor("x", torch.arange(8, dtype=torch.float32).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    mine, theirs = read_gguf(path), gguf.GGUFReader(str(path))
    assert set(mine.fields) == set(theirs.fields)
    for k in theirs.fields:
        assert field(mine, k) == _plain(theirs.fields[k]), k
        assert type(field(mine, k)) is type(_plain(theirs.fields[k])), k
    assert field_count(mine, "t.strings") == 6 and field_count(mine, "t.empty") == 0
    assert field_count(mine, "t.absent") == 0
    assert [t.name for t in mine.tensors] == ["x"] and mine.tensors[0].data.tolist() == list(range(8))


def test_loaded_blocks_stay_tied(tmp_path):
    from tokennet.layers.blockquant import BlockEmbedding, BlockLinear
    from tokennet.models.gpt import GPT, GPTConfig
    from tokennet.models.registry import load_pretrained, save_pretrained

    config = GPTConfig(vocab_size=64, block_size=16, dim=64, num_layers=1, num_heads=2, tie_weights=True)
    dense = GPT(config)
    model = GPT(config.replace(quantized={"tok_emb": "q8_0", "lm_head": "q8_0"}))
    q = BlockLinear.from_float(dense.lm_head, "q8_0")
    state = {k: v for k, v in dense.state_dict().items() if not k.startswith(("tok_emb", "lm_head"))}
    state.update({"lm_head.qs": q.qs, "lm_head.d": q.d, "tok_emb.qs": q.qs, "tok_emb.d": q.d})
    model.load_state_dict(state)
    save_pretrained(model, tmp_path / "m")
    back = load_pretrained(tmp_path / "m")
    assert isinstance(back.tok_emb, BlockEmbedding) and back.tok_emb.qs is back.lm_head.qs
    assert back.tok_emb.d is back.lm_head.d
    ids = torch.tensor([[1, 5, 9, 2]])
    with torch.no_grad():
        assert_same_function(back(ids).logits, model(ids).logits)  # read from the file: other memory, other kernels


def test_large_block_weights_multiply_a_slice_of_rows_at_a_time(monkeypatch):
    import torch.nn.functional as F

    from tokennet.layers import blockquant
    from tokennet.layers.blockquant import BlockLinear

    g = torch.Generator().manual_seed(0)
    lin = BlockLinear.from_float(torch.nn.Linear(64, 40), "q8_0")
    lin.bias = torch.randn(40, generator=g)
    x = torch.randn(3, 64, generator=g)
    whole = F.linear(x, lin.dequantized_weight(), lin.bias)
    monkeypatch.setattr(blockquant, "DENSE_CHUNK", 64 * 7)  # slices of 7 rows, the last one shorter
    torch.testing.assert_close(lin(x), whole, rtol=1e-6, atol=1e-6)
