"""The BERT and ViT converters check a checkpoint as the others do before building anything: the config's layer
count against the file's numbered layers (before looping over it), and every tensor's shape against a model built
on the meta device (before asking for memory of the config's sizes). One DataError line, nothing written."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tokennet.errors import DataError, TokennetError
from tokennet.interop import import_checkpoint

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("bv")
    torch.manual_seed(0)
    transformers.BertModel(transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24,
        max_position_embeddings=20)).save_pretrained(root / "bert")
    transformers.ViTForImageClassification(transformers.ViTConfig(
        hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24, image_size=8, patch_size=4,
        num_labels=3)).save_pretrained(root / "vit")
    return root


def _copy(sources, arch, tmp_path):
    shutil.copytree(sources / arch, tmp_path / "hf")
    return tmp_path / "hf"


def _edit_config(src, **changes):
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(changes)
    (src / "config.json").write_text(json.dumps(cfg))


def _edit_tensors(src, edit):
    tensors = load_file(str(src / "model.safetensors"))
    save_file(edit(tensors), str(src / "model.safetensors"))


def _refused(src, tmp_path, *words):
    with pytest.raises(DataError) as e:
        import_checkpoint(src, tmp_path / "run")
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("arch", ["bert", "vit"])
def test_the_seeds_import(sources, arch, tmp_path):
    import_checkpoint(_copy(sources, arch, tmp_path), tmp_path / "run")


@pytest.mark.parametrize("arch", ["bert", "vit"])
def test_a_missing_layer_is_named_as_a_layer_count(sources, arch, tmp_path):
    src = _copy(sources, arch, tmp_path)
    _edit_tensors(src, lambda t: {k: v for k, v in t.items() if "layer.1." not in k})
    _refused(src, tmp_path, "the config says 2 layer(s) but the file holds 1")


@pytest.mark.parametrize("arch, key", [("bert", "num_hidden_layers"), ("vit", "num_hidden_layers")])
def test_a_config_deeper_than_the_file_is_refused_before_the_loop(sources, arch, key, tmp_path):
    src = _copy(sources, arch, tmp_path)
    _edit_config(src, **{key: 10**7})  # ten million layers: looping over them alone would take minutes
    _refused(src, tmp_path, "the config says 10000000 layer(s) but the file holds 2")


@pytest.mark.parametrize("arch", ["bert", "vit"])
def test_a_wrong_shape_is_named(sources, arch, tmp_path):
    src = _copy(sources, arch, tmp_path)
    name = next(k for k in load_file(str(src / "model.safetensors")) if k.endswith("layer.0.intermediate.dense.weight"))
    _edit_tensors(src, lambda t: {**t, name: torch.zeros(25, 16)})
    _refused(src, tmp_path, "'encoder.blocks.0.mlp.fc1.weight' has shape (25, 16)", "in config.json make (24, 16)")


@pytest.mark.parametrize("arch, key", [("bert", "hidden_size"), ("bert", "intermediate_size"), ("bert", "vocab_size"),
                                       ("bert", "max_position_embeddings"), ("bert", "type_vocab_size"),
                                       ("vit", "hidden_size"), ("vit", "intermediate_size"), ("vit", "image_size")])
def test_inflated_sizes_are_refused_before_allocation(sources, arch, key, tmp_path):
    """A size of 2**40 in config.json: checked on the meta device, never allocated (torch's allocator would raise a
    RuntimeError, or the kernel would end the process)."""
    src = _copy(sources, arch, tmp_path)
    _edit_config(src, **{key: 2**40})
    with pytest.raises(TokennetError) as e:
        import_checkpoint(src, tmp_path / "run")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("value", [[1], "0", -1, True])
def test_a_token_id_of_the_wrong_type_is_named(sources, tmp_path, value):
    """Found by the fuzzing (tests/robustness/test_new_converters_fuzz.py): BERT's pad_token_id as a list ended in
    a TypeError inside the model config."""
    src = _copy(sources, "bert", tmp_path)
    _edit_config(src, pad_token_id=value)
    _refused(src, tmp_path, "pad_token_id", "is not a token id")
