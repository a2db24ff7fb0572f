"""``tokennet import``'s contract: every field and tensor accounted for, one-line errors, nothing written on failure."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tokennet.cli import main
from tokennet.errors import TokennetError
from tokennet.interop import import_checkpoint

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    cfg = transformers.GPT2Config(vocab_size=61, n_positions=16, n_embd=24, n_layer=1, n_head=3, bos_token_id=0,
                                  eos_token_id=0)
    d = tmp_path_factory.mktemp("hf") / "gpt2"
    transformers.GPT2LMHeadModel(cfg).save_pretrained(d)
    return d


def _edit_config(d, **changes):
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))


def _truncate(f, n=200):
    f.write_bytes(f.read_bytes()[:n])


def _edit_tensors(d, fn):
    sd = load_file(str(d / "model.safetensors"))
    fn(sd)
    save_file(sd, str(d / "model.safetensors"))


BAD = {
    "not a checkpoint": (lambda d: (d / "config.json").unlink(), "has no config.json"),
    "config not JSON": (lambda d: (d / "config.json").write_text("{nope"), "not valid JSON"),
    "unsupported architecture": (lambda d: _edit_config(d, model_type="t5", architectures=["T5Model"]),
                                 "no tokennet converter"),
    "GPT2Model without LM head": (lambda d: _edit_config(d, architectures=["GPT2Model"]), "no tokennet converter"),
    "unknown config field": (lambda d: _edit_config(d, rotary_dim=8), "'rotary_dim'"),
    "unsupported field value": (lambda d: _edit_config(d, scale_attn_by_inverse_layer_idx=True),
                                "scale_attn_by_inverse_layer_idx=True"),
    "unsupported activation": (lambda d: _edit_config(d, activation_function="silu"), "activation_function"),
    "missing tensor": (lambda d: _edit_tensors(d, lambda sd: sd.pop("transformer.h.0.mlp.c_fc.bias")),
                       "transformer.h.0.mlp.c_fc.bias"),
    "extra tensor": (lambda d: _edit_tensors(d, lambda sd: sd.update(extra=torch.zeros(2))), "does not map: extra"),
    "wrong shape": (lambda d: _edit_tensors(d, lambda sd: sd.update({"transformer.wpe.weight": torch.zeros(8, 24)})),
                    "pos_emb.weight"),
    "untied head that differs": (
        lambda d: _edit_tensors(d, lambda sd: sd.update({"lm_head.weight": torch.zeros(61, 24)})),
        "lm_head.weight differs"),
    "truncated safetensors": (lambda d: _truncate(d / "model.safetensors"), "truncated"),
    "pickle weights only": (lambda d: (d / "model.safetensors").rename(d / "pytorch_model.bin"), "pickle-based"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_source_is_one_line_and_writes_nothing(name, hf_dir, tmp_path, capsys):
    damage, expected = BAD[name]
    src = tmp_path / "src"
    shutil.copytree(hf_dir, src)
    damage(src)
    with pytest.raises(TokennetError, match=None) as e:
        import_checkpoint(src, tmp_path / "run")
    assert expected in str(e.value), str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # no run, no temporary directory
    assert main(["import", str(src), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tokennet: error:") and "\n" not in err and expected in err


def test_cli_imports_and_refuses_to_overwrite(hf_dir, tmp_path, capsys):
    assert main(["import", str(hf_dir), "--out", str(tmp_path / "run")]) == 0
    assert "tokennet gpt" in capsys.readouterr().out
    before = (tmp_path / "run" / "model.safetensors").stat().st_mtime_ns
    assert main(["import", str(hf_dir), "--out", str(tmp_path / "run")]) == 2
    assert "already exists" in capsys.readouterr().err
    assert (tmp_path / "run" / "model.safetensors").stat().st_mtime_ns == before


def test_a_source_without_a_tokenizer_says_so(hf_dir, tmp_path):
    result = import_checkpoint(hf_dir, tmp_path / "run")
    assert result.tokenizer is None
    assert any("has no tokenizer" in n for n in result.notes)
