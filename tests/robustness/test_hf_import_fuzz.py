"""Hugging Face checkpoint directories (``tokennet import DIR``) with a damaged ``config.json`` or
``model.safetensors``: one line, nothing written, no hang or allocation for a size the file does not hold."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from robustness.fuzzing import FUZZ, check_cli, check_reader, mutated, mutated_json

from tokennet.errors import TokennetError
from tokennet.interop import import_checkpoint

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=32))
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=64, n_embd=16, n_layer=2, n_head=2,
                                                                n_positions=32, bos_token_id=0, eos_token_id=0))
    llama.save_pretrained(root / "llama")
    gpt2.save_pretrained(root / "gpt2")
    return {"llama": root / "llama", "gpt2": root / "gpt2"}


def _import(src: Path, name: str, data: bytes):
    d = Path(tempfile.mkdtemp(prefix="hf-fuzz-"))
    try:
        h = d / "hf"
        shutil.copytree(src, h)
        (h / name).write_bytes(data)
        out = check_reader(lambda: import_checkpoint(h, d / "run"), *sorted(h.iterdir()))
        if isinstance(out, TokennetError):
            assert not (d / "run").exists(), "a failed import left its output directory"
        return out
    finally:
        shutil.rmtree(d)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_the_seeds_import(hf_dirs, arch):
    out = _import(hf_dirs[arch], "config.json", (hf_dirs[arch] / "config.json").read_bytes())
    assert not isinstance(out, TokennetError), out


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@FUZZ
@given(data=st.data())
def test_wrong_config_values_are_one_line(hf_dirs, arch, data):
    seed = json.loads((hf_dirs[arch] / "config.json").read_text())
    _import(hf_dirs[arch], "config.json", data.draw(mutated_json(seed), label="mutation").data)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@FUZZ
@given(data=st.data())
def test_damaged_safetensors_are_one_line(hf_dirs, arch, data):
    seed = (hf_dirs[arch] / "model.safetensors").read_bytes()
    header = 8 + int.from_bytes(seed[:8], "little")
    _import(hf_dirs[arch], "model.safetensors", data.draw(mutated(seed, hot=header), label="mutation").data)


@pytest.mark.parametrize("arch, key", [("llama", "num_hidden_layers"), ("llama", "hidden_size"),
                                       ("llama", "intermediate_size"), ("llama", "vocab_size"),
                                       ("gpt2", "n_layer"), ("gpt2", "n_embd"), ("gpt2", "vocab_size")])
def test_inflated_config_sizes_fail_fast(hf_dirs, arch, key):
    """A size of 2**40 in config.json: refused against the tensors before a converter loops over it or a model of
    that size is allocated (``check_reader``'s alarm fails a loop)."""
    cfg = json.loads((hf_dirs[arch] / "config.json").read_text())
    cfg[key] = 2**40
    out = _import(hf_dirs[arch], "config.json", json.dumps(cfg).encode())
    assert isinstance(out, TokennetError), out


def test_cli_import_of_a_damaged_config_is_one_line(hf_dirs, tmp_path):
    h = tmp_path / "hf"
    shutil.copytree(hf_dirs["llama"], h)
    cfg = json.loads((h / "config.json").read_text())
    cfg["hidden_size"] = "16"
    (h / "config.json").write_text(json.dumps(cfg))
    code, err = check_cli(["-q", "import", str(h), "--out", str(tmp_path / "run")], *sorted(h.iterdir()))
    assert code == 2 and "hidden_size" in err, err
    assert not (tmp_path / "run").exists()
