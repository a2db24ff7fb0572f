"""``value_proj=false`` (W_v = I, the lecture's claim 5) as a config option of every transformer family."""

import pytest
import torch

import tokennet
from tokennet.errors import ConfigError
from tokennet.interop.gguf_out import gguf_arch
from tokennet.interop.hf_out import hf_class
from tokennet.models import create_model
from tokennet.models.registry import config_from_dict, model_from_config, save_pretrained
from tokennet.models.text_encoder import TextEncoderConfig

TINY_TEXT = dict(vocab_size=50, max_len=16, dim=16, num_layers=2, num_heads=2)
# one preset of each family built on TransformerConfig (the vqa family is another helper's)
FAMILIES = ["gpt-micro", "vit-micro", "seq2seq-micro", "captioner-micro", "graph-micro", "sphere-micro"]


def _model(name, **kw):
    if name == "text-encoder":
        return model_from_config(TextEncoderConfig(**TINY_TEXT, **kw))
    return create_model(name, **kw)


def _loss(model):
    torch.manual_seed(0)
    if model.config.family == "text-encoder":
        return model(model.example_input()).logits.square().mean()
    x = model.example_input()
    y = model.example_targets() if hasattr(model, "example_targets") else None
    return model(x, y).loss


def _self_attentions(model):
    return [m for name, m in model.named_modules() if name.endswith(".attn") and hasattr(m, "value_proj")]


@pytest.mark.parametrize("name", [*FAMILIES, "text-encoder"])
def test_value_proj_false_drops_w_v_and_trains(name):
    base, ident = _model(name), _model(name, value_proj=False)
    attns = _self_attentions(ident)
    assert attns and all(a.value_proj is False for a in attns)
    assert all(a.value_proj for a in _self_attentions(base))  # the default keeps W_v
    # every self-attention loses exactly its W_v (D·D weights) and, with biases, its b_v (D)
    removed = sum(p.numel() for p in base.parameters()) - sum(p.numel() for p in ident.parameters())
    expect = sum(a.kv_dim * a.context_dim + (a.kv_dim if a.qkv_proj.bias is not None else 0) for a in attns)
    assert removed == expect > 0
    loss = _loss(ident)
    assert torch.isfinite(loss)
    loss.backward()
    assert all(a.qkv_proj.weight.grad is not None and a.qkv_proj.weight.grad.abs().sum() > 0 for a in attns)


def test_w_v_identity_means_the_values_are_the_tokens():
    """A block's attention output is ``softmax(QKᵀ/√E) X W_oᵀ``: no value map between mixing and W_o."""
    m = create_model("vit-micro", value_proj=False).eval()
    attn = m.encoder.blocks[0].attn
    x = torch.randn(2, 5, 32)
    H, E = attn.num_heads, 32 // attn.num_heads
    q, k = attn.qkv_proj(x).split([32, 32], -1)
    q, k, v = (t.view(2, 5, H, E).transpose(1, 2) for t in (q, k, x))  # (B, H, N, E)
    a = torch.softmax(q @ k.transpose(-1, -2) / E**0.5, -1)
    want = attn.out_proj((a @ v).transpose(1, 2).reshape(2, 5, 32))
    torch.testing.assert_close(attn(x), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["vit-micro", "gpt-micro", "text-encoder"])
def test_value_proj_false_round_trips_through_save_and_load(name, tmp_path):
    m = _model(name, value_proj=False).eval()
    save_pretrained(m, tmp_path / "m")
    run = tokennet.load(tmp_path / "m")
    assert run.model.config.value_proj is False
    x = m.example_input()
    torch.testing.assert_close(run.model(x).logits, m(x).logits)


@pytest.mark.parametrize("name", [*FAMILIES, "text-encoder"])
def test_the_default_is_todays_model(name):
    """A config saved before the option existed (no ``value_proj`` key) builds the same parameters."""
    m = _model(name)
    d = m.config.to_dict()
    assert d.pop("value_proj") is True
    old = model_from_config(config_from_dict(d))
    assert {k: v.shape for k, v in old.state_dict().items()} == {k: v.shape for k, v in m.state_dict().items()}
    old.load_state_dict(m.state_dict())


@pytest.mark.parametrize("kw, match", [
    (dict(value_proj="no"), "value_proj must be true or false"),
    (dict(value_proj=False, num_kv_heads=1), "needs num_kv_heads=num_heads"),
    (dict(value_proj=False, mixer="token"), "needs mixer='attention'"),
])
def test_bad_values_are_refused_in_one_line(kw, match):
    with pytest.raises(ConfigError, match=match) as e:
        create_model("gpt-micro", **kw)
    assert "\n" not in str(e.value)


def test_a_family_that_ignores_the_option_is_refused(monkeypatch):
    """A family whose model does not pass value_proj down would silently keep W_v: model_from_config refuses."""
    from tokennet.models import registry

    cfg_cls, _ = registry._FAMILIES["vit"]
    built_with_w_v = create_model("vit-micro").encoder.blocks[0].attn

    class Ignores(torch.nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config
            self.attn = built_with_w_v

    monkeypatch.setitem(registry._FAMILIES, "vit", (cfg_cls, Ignores))
    with pytest.raises(ConfigError, match="does not take value_proj=false"):
        create_model("vit-micro", value_proj=False)
    create_model("vit-micro")  # the default is never refused


@pytest.mark.parametrize("check", [hf_class, gguf_arch])
def test_hf_and_gguf_export_refuse_w_v_identity(check):
    """Their GPT-2 / Llama layouts need a v weight: refused in one line rather than an invented matrix."""
    ok = create_model("gpt-micro").config
    check(ok)
    with pytest.raises(ConfigError, match="value_proj=false .* nothing was written") as e:
        check(ok.replace(value_proj=False))
    assert "\n" not in str(e.value)
