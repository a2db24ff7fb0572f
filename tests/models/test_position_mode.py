"""``position_mode="concat"`` (the lecture's claim 6) on the encoders that take added positions: ViT, text encoder."""

import pytest
import torch

import tokennet
from tokennet.cli import main
from tokennet.errors import ConfigError
from tokennet.models import create_model
from tokennet.models.registry import config_from_dict, model_from_config, save_pretrained
from tokennet.models.text_encoder import TextEncoderConfig
from tokennet.recipes import train

TEXT = dict(vocab_size=50, max_len=16, dim=16, num_layers=1, num_heads=2)


def _vit(**kw):
    return create_model("vit-micro", **kw)  # 16×16 RGB, 4×4 patches (16 tokens), D = 32


def _text(**kw):
    return model_from_config(TextEncoderConfig(**TEXT, **kw))


def _encoder_input(model, x):
    """What the model hands its first block (after positions and dropout)."""
    seen = []
    h = model.encoder.blocks[0].register_forward_pre_hook(lambda mod, args: seen.append(args[0].detach()))
    model(x)
    h.remove()
    return seen[0]


@pytest.mark.parametrize("position", ["learned", "fourier"])
def test_vit_concat_embeds_tokens_at_d_minus_dp_and_appends_the_positions(position):
    m = _vit(position=position, position_mode="concat", pos_dim=8).eval()
    assert m.patch_embed(m._images(m.example_input())).shape[-1] == 24  # D − D_p
    assert m.cls_token.shape[-1] == 24
    z = _encoder_input(m, m.example_input())  # (B, 1 + 16, 32)
    assert z.shape == (2, 17, 32)
    table = m.position_table()  # (16, D_p)
    assert table.shape == (16, 8)
    # the last D_p dims are the positions, the same for every image; the first D − D_p are the tokens' own
    torch.testing.assert_close(z[0, 1:, 24:], table)
    torch.testing.assert_close(z[1, 1:, 24:], table)
    torch.testing.assert_close(z[:, 1:, :24], m.patch_embed(m._images(m.example_input())))


@pytest.mark.parametrize("position", ["learned", "fourier"])
def test_vit_concat_trains_and_takes_other_sizes(position):
    m = _vit(position=position, position_mode="concat", pos_dim=8)
    out = m(m.example_input(), m.example_targets())
    out.loss.backward()
    if position == "learned":
        assert m.pos_emb.encoding.weight.grad.abs().sum() > 0
    assert all(p.grad is not None for p in m.patch_embed.parameters())
    assert m.eval()(torch.rand(1, 3, 24, 24)).logits.shape == (1, 10)  # 6×6 patches: positions resized


def test_text_encoder_concat():
    m = _text(position_mode="concat", pos_dim=4).eval()
    assert m.tok_emb.weight.shape == (50, 12) and m.pos_emb.encoding.weight.shape[-1] == 4
    ids = m.example_input()
    assert m(ids).logits.shape == (2, 16, 16)
    m.train()
    m(ids).logits.square().mean().backward()
    assert m.pos_emb.encoding.weight.grad.abs().sum() > 0 and m.tok_emb.weight.grad.abs().sum() > 0
    assert torch.isfinite(m.eval().embed(ids)).all()


@pytest.mark.parametrize("build, kw", [
    (_vit, dict(position_mode="concat", pos_dim=8)),
    (_vit, dict(position="fourier", position_mode="concat", pos_dim=8)),
    (_text, dict(position_mode="concat", pos_dim=4)),
])
def test_concat_round_trips_through_save_and_load(build, kw, tmp_path):
    m = build(**kw).eval()
    save_pretrained(m, tmp_path / "m")
    run = tokennet.load(tmp_path / "m")
    assert (run.model.config.position_mode, run.model.config.pos_dim) == ("concat", kw["pos_dim"])
    x = m.example_input()
    torch.testing.assert_close(run.model(x).logits, m(x).logits)


@pytest.mark.parametrize("build", [_vit, _text])
def test_the_default_is_todays_model(build):
    """A config saved before the option (no position_mode / pos_dim keys) builds the same model, weights unchanged."""
    m = build()
    assert (m.config.position_mode, m.config.pos_dim) == ("add", None)
    d = m.config.to_dict()
    del d["position_mode"], d["pos_dim"]
    old = model_from_config(config_from_dict(d))
    old.load_state_dict(m.state_dict())  # same names and shapes (pos_emb.weight, not pos_emb.encoding.weight)
    x = m.example_input()
    torch.testing.assert_close(old.eval()(x).logits, m.eval()(x).logits)


@pytest.mark.parametrize("build, kw, match", [
    (_vit, dict(position_mode="mul"), "position_mode must be one of"),
    (_vit, dict(position_mode="concat"), "needs pos_dim"),
    (_vit, dict(position_mode="concat", pos_dim=32), r"pos_dim must be an integer in \[1, dim=32\)"),
    (_vit, dict(position_mode="concat", pos_dim=0), "pos_dim must be an integer"),
    (_vit, dict(pos_dim=8), "pos_dim=8 is for position_mode='concat'"),
    (_vit, dict(position="fourier", position_mode="concat", pos_dim=6), "multiple of 4"),
    (_vit, dict(position="none", position_mode="concat", pos_dim=8), "needs positions to concatenate"),
    (_text, dict(position_mode="concat", pos_dim=16), "pos_dim must be an integer"),
])
def test_bad_values_are_refused_in_one_line(build, kw, match):
    with pytest.raises(ConfigError, match=match) as e:
        build(**kw)
    assert "\n" not in str(e.value)


@pytest.mark.slow  # a training run (tens of seconds on a busy machine); the refusals below show the keys arrive
def test_the_vit_recipe_takes_position_mode(tmp_path):
    """``tokennet train vit --set position_mode=concat pos_dim=32`` reaches the model config."""
    sets = {"position_mode": "concat", "pos_dim": 32, "num_layers": 1, "max_iters": 2, "time_budget": None,
            "eval_interval": 2, "log_interval": 2, "progress": False, "batch_size": 16, "svm_baseline": False}
    run_dir, metrics = train("vit", out=tmp_path / "r", sets=sets, device="cpu")
    assert 0 <= metrics["test_accuracy"] <= 1
    run = tokennet.load(run_dir)
    assert (run.model.config.position_mode, run.model.config.pos_dim, run.model.config.token_dim) == ("concat", 32, 32)
    assert run.model.patch_embed(torch.zeros(1, 1, 8, 8)).shape[-1] == 64 - 32


@pytest.mark.parametrize("sets, match", [
    (["position_mode=concat"], "needs pos_dim"),
    (["position_mode=concat", "pos_dim=64"], "pos_dim must be an integer"),
    (["arch=swin", "position_mode=concat", "pos_dim=8"], "does not apply"),
    (["arch=swin", "value_proj=false"], "does not apply"),
])
def test_the_vit_recipe_refuses_bad_position_settings_in_one_line(sets, match, tmp_path, capsys):
    assert main(["train", "vit", "--set", *sets, "--max-iters", "1", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert match in err and "\n" not in err
