"""Every JSON file the interop readers open goes through tokennet.jsonio: a document nested deeper than its bound
(128 levels) is refused in one line naming the file — never a RecursionError out of a reader."""

import json

import pytest

from tokennet.errors import DataError, TokennetError
from tokennet.interop import import_checkpoint
from tokennet.interop.hf import read_hf_config, read_safetensors
from tokennet.interop.init import load_init
from tokennet.tokens.pretrained import PretrainedTokenizer

DEEP = "[" * 100_000 + "]" * 100_000
DEEP_OBJECT = '{"model_type": ' + "[" * 200 + "]" * 200 + "}"  # a few hundred levels: no RecursionError in json itself


def _one_line(e: BaseException, *words: str) -> str:
    msg = str(e)
    assert "\n" not in msg and all(w in msg for w in words), msg
    return msg


@pytest.mark.parametrize("text", [DEEP, DEEP_OBJECT], ids=["deep-array", "deep-in-an-object"])
def test_config_json(tmp_path, text):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(DataError) as e:
        read_hf_config(tmp_path)
    _one_line(e.value, "config.json", "nested", "at most 128")


def test_safetensors_index(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text(DEEP)
    with pytest.raises(DataError) as e:
        read_safetensors(tmp_path)
    _one_line(e.value, "model.safetensors.index.json", "nested")


@pytest.mark.parametrize("weight_map", [{"a": "../model.safetensors"}, {"a": "/etc/x"}, {}, {"a": 3}])
def test_safetensors_index_names_shards_beside_it(tmp_path, weight_map):
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(DataError) as e:
        read_safetensors(tmp_path)
    _one_line(e.value, "model.safetensors.index.json")


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_tokenizer_files(tmp_path, name):
    if name == "tokenizer_config.json":
        (tmp_path / "vocab.json").write_text(json.dumps({"a": 0, "b": 1, "ab": 2}))
        (tmp_path / "merges.txt").write_text("#version: 0.2\na b\n")
    (tmp_path / name).write_text(DEEP_OBJECT)
    with pytest.raises(DataError) as e:
        PretrainedTokenizer.from_hf_dir(tmp_path)
    _one_line(e.value, name, "nested", "at most 128")
    if name == "tokenizer.json":
        with pytest.raises(DataError) as e:
            PretrainedTokenizer.from_file(tmp_path / name)
        _one_line(e.value, name, "nested")


def test_init_source(tmp_path):
    """``train --init DIR``: the config.json that tells a tokennet model from a Hugging Face one."""
    (tmp_path / "config.json").write_text(DEEP)
    with pytest.raises(TokennetError) as e:
        load_init(tmp_path)
    _one_line(e.value, "config.json")


def test_export_overwrite_check(tmp_path):
    """``export --format hf --overwrite OUT``: an OUT whose config.json is nested too deep is not a previous export."""
    from tokennet.interop.export import _not_an_export

    (tmp_path / "config.json").write_text(DEEP)
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert _not_an_export(tmp_path, "hf") == "it has no config.json with a model_type"


def test_import_of_a_deep_config_is_one_line(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(DEEP)
    with pytest.raises(DataError) as e:
        import_checkpoint(tmp_path / "hf", tmp_path / "run")
    _one_line(e.value, "nested")
    assert not (tmp_path / "run").exists()
