"""Every registered model gets the same tiny-config tests: forward, backward, save/load round trip,
and cached vs uncached decoding where it decodes (timm's idea: a model is tested the day it is registered)."""

import dataclasses

import pytest
import torch

from tokennet.errors import RunError
from tokennet.models import create_model, list_models, load_pretrained, save_pretrained
from tokennet.models.registry import preset_info

# Tiny overrides per family keep the loop fast; fields a family lacks are skipped.
TINY = {"dim": 32, "num_layers": 1, "num_heads": 2, "block_size": 16, "vocab_size": 40}


def tiny(name):
    family, defaults, _ = preset_info(name)
    from tokennet.models.registry import _FAMILIES

    fields = {f.name for f in dataclasses.fields(_FAMILIES[family][0]) if f.init}
    over = {k: v for k, v in TINY.items() if k in fields}
    try:
        return create_model(name, **over)
    except ValueError:
        return create_model(name)


def _inputs(model, b=2):
    x = model.example_input(b)
    y = model.example_targets(b) if hasattr(model, "example_targets") else None
    return x, y


@pytest.mark.parametrize("name", list_models())
def test_forward_backward(name):
    torch.manual_seed(0)
    model = tiny(name)
    x, y = _inputs(model)
    out = model(x, y)
    assert out.logits.shape[0] == 2
    assert torch.isfinite(out.logits).all()
    assert out.loss is not None and out.loss.dim() == 0
    out.loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert any(g is not None and g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("name", list_models())
def test_save_load_roundtrip(name, tmp_path):
    torch.manual_seed(0)
    model = tiny(name).eval()
    x, _ = _inputs(model)
    save_pretrained(model, tmp_path)
    assert (tmp_path / "config.json").is_file() and (tmp_path / "model.safetensors").is_file()
    loaded = load_pretrained(tmp_path).eval()
    assert loaded.config == model.config
    with torch.no_grad():
        torch.testing.assert_close(loaded(x).logits, model(x).logits)


def _decodes(name) -> str | None:
    """How a preset decodes, from its family's task: "lm", "conditional" or None."""
    from tokennet.tasks import CausalLM, ConditionalDecoder, task_for

    protocol = task_for(preset_info(name)[0]).protocol
    return {CausalLM: "lm", ConditionalDecoder: "conditional"}.get(protocol)


def test_every_family_has_a_task_and_every_decoder_is_covered():
    from tokennet.tasks import task_for

    decoding = {preset_info(n)[0] for n in list_models() if _decodes(n)}
    assert decoding == {"gpt", "seq2seq", "bahdanau", "captioner", "captioner-prefix"}
    assert all(task_for(preset_info(n)[0]).verbs for n in list_models())  # every family can do something


@pytest.mark.parametrize("name", [n for n in list_models() if _decodes(n)])
def test_cached_decoding_matches_uncached(name):
    """Registry-wide: decoding over the KV cache equals recomputing the whole prefix every step."""
    from tokennet.decode import beam_search, greedy_search
    from tokennet.sampling import generate

    torch.manual_seed(0)
    model = tiny(name).eval()
    with torch.no_grad():  # a model with random weights is near-uniform: sharpen it so the paths differ
        for p in model.parameters():
            p.mul_(3.0)
    if _decodes(name) == "lm":
        prompt = model.example_input(2)[:, :3]
        a = generate(model, prompt, 10, temperature=0, use_cache=True)
        b = generate(model, prompt, 10, temperature=0, use_cache=False)
        assert torch.equal(a, b)
        return
    x = model.example_input(2)[0]
    assert torch.equal(greedy_search(model, x, use_cache=True), greedy_search(model, x, use_cache=False))
    assert torch.equal(beam_search(model, x, beam_size=3, use_cache=True),
                       beam_search(model, x, beam_size=3, use_cache=False))


def test_unknown_model_and_field():
    with pytest.raises(ValueError, match="unknown model"):
        create_model("no-such-model")
    with pytest.raises(ValueError, match="unknown GPTConfig field"):
        create_model("gpt", no_such_field=1)


def test_load_rejects_mismatched_weights(tmp_path):
    import json

    m = create_model("gpt-micro", vocab_size=20)
    save_pretrained(m, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["dim"] = 32
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="does not match"):
        load_pretrained(tmp_path)


def test_load_rejects_truncated_weights(tmp_path):
    m = create_model("gpt-micro", vocab_size=20)
    save_pretrained(m, tmp_path)
    w = tmp_path / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    with pytest.raises(ValueError, match="corrupt|does not match"):
        load_pretrained(tmp_path)


def test_load_missing_dir(tmp_path):
    with pytest.raises(RunError, match="not a saved tokennet model"):
        load_pretrained(tmp_path / "nope")


def test_tampered_weights_are_detected(tmp_path):
    m = create_model("gpt-micro", vocab_size=20)
    save_pretrained(m, tmp_path)
    w = tmp_path / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-10] ^= 0xFF  # one flipped bit pattern inside a tensor: still a valid safetensors file
    w.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="checksum"):
        load_pretrained(tmp_path)


def test_pickle_weights_refused_unless_allowed(tmp_path):
    import json

    m = create_model("gpt-micro", vocab_size=20).eval()
    save_pretrained(m, tmp_path)
    (tmp_path / "model.safetensors").unlink()
    torch.save(m.state_dict(), tmp_path / "pytorch_model.bin")
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="refusing to load pickle-based weights"):
        load_pretrained(tmp_path)
    loaded = load_pretrained(tmp_path, allow_pickle=True).eval()
    x = m.example_input(1)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x).logits, m(x).logits)


def test_pickle_with_code_is_not_executed(tmp_path):
    """weights_only=True refuses arbitrary objects: a malicious pickle never runs."""
    import pickle

    save_pretrained(create_model("gpt-micro", vocab_size=20), tmp_path)
    (tmp_path / "model.safetensors").unlink()
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (tmp_path / "model.pt").write_bytes(pickle.dumps({"x": Evil()}))
    with pytest.raises(ValueError, match="could not be loaded as plain tensors"):
        load_pretrained(tmp_path, allow_pickle=True)
    assert not marker.exists()


def test_the_shared_transformer_fields_are_declared_once():
    """Every transformer family's dim/num_layers/num_heads/mlp_ratio/dropout/backend come from TransformerConfig,
    with the family's own defaults; a default for a field that is not shared is refused at class creation."""
    from tokennet.models.gpt import GPTConfig
    from tokennet.models.registry import TransformerConfig
    from tokennet.models.seq2seq import Seq2SeqConfig

    shared = [f.name for f in dataclasses.fields(TransformerConfig) if f.init]
    assert shared == ["dim", "num_layers", "num_heads", "mlp_ratio", "dropout", "backend", "value_proj"]
    assert (GPTConfig().dim, GPTConfig().num_heads, Seq2SeqConfig().dropout, Seq2SeqConfig().dim) == (384, 6, 0.1, 128)
    assert TransformerConfig().dim == 128  # the family's default did not leak into the base
    assert GPTConfig.from_dict(GPTConfig(dim=64, num_heads=4).to_dict()).dim == 64
    with pytest.raises(TypeError, match="not shared"):
        @dataclasses.dataclass
        class Bad(TransformerConfig, defaults=dict(vocab_size=3)):
            pass
