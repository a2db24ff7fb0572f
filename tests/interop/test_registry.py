"""The converter registry: each family file registers what it reads; one dispatcher reads a source; a new family
is one registration; converters return one type."""

import json

import pytest
import torch

import tokennet.interop as interop
from tokennet.errors import ConfigError
from tokennet.interop.registry import Converted, register
from tokennet.models import create_model


def test_every_family_registers_what_it_reads():
    assert set(interop.HF_CONVERTERS) == {("gpt2", "GPT2LMHeadModel"), ("vit", "ViTForImageClassification"),
                                          ("llama", "LlamaForCausalLM"), ("mistral", "MistralForCausalLM"),
                                          ("qwen2", "Qwen2ForCausalLM"), ("bert", "BertModel")}
    assert set(interop.GGUF_CONVERTERS) == {"llama", "gpt2", "qwen2", "gemma3"}
    assert interop.CONVERTERS is interop.HF_CONVERTERS  # the old name still reads the table


def test_a_name_claimed_by_two_converters_is_a_bug():
    with pytest.raises(RuntimeError, match="registered twice"):
        register(gguf=["llama"])(lambda path, **kw: None)


def test_a_new_family_is_one_registration(tmp_path, monkeypatch):
    """A converter registered for a (model_type, architecture) is what convert() and import use: nothing else to
    edit. (The tables are restored after the test.)"""
    monkeypatch.setattr(interop.registry, "HF_CONVERTERS", dict(interop.HF_CONVERTERS))
    torch.manual_seed(0)
    made = create_model("gpt-micro", vocab_size=32, block_size=8)

    @register(hf=[("toy", "ToyForCausalLM")])
    def convert_toy(source, cfg):
        return Converted(made, None, [f"toy {cfg['hidden_size']}"])

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "toy", "architectures": ["ToyForCausalLM"],
                                                      "hidden_size": 7}))
    model, tokenizer, name, notes = interop.convert(tmp_path)
    assert model is made and tokenizer is None and name == "toy/ToyForCausalLM" and notes == ["toy 7"]
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "toy", "architectures": ["OtherModel"]}))
    with pytest.raises(ConfigError, match="no tokennet converter"):
        interop.convert(tmp_path)
