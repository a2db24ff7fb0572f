"""Exact resume through the recipes: 2n steps in one go equal n steps, a crash, and n resumed steps —
bitwise, for every registered recipe (with dropout on where its model has any)."""

import pytest
import torch
from safetensors.torch import load_file
from support import Crash, CrashingSource

import tokennet.lifecycle.runner as runner
from tokennet.lifecycle import list_recipes
from tokennet.recipes import train

RECIPES = [r.name for r in list_recipes()]
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("name", RECIPES)
def test_killed_and_resumed_equals_uninterrupted(name, tmp_path, monkeypatch):
    recipe = next(r for r in list_recipes() if r.name == name)
    sets = {**recipe.smoke, "max_iters": 8, "checkpoint_interval": 4, "eval_interval": 0, "warmup_iters": 2,
            "progress": False, "report": False}
    if "dropout" in recipe.defaults():
        sets["dropout"] = 0.1  # the dropout masks must come back too
    data = recipe.smoke_data(tmp_path) if recipe.smoke_data is not None else None
    a, _ = train(name, data=data, out=tmp_path / "a", sets=sets)
    real = runner.Trainer

    def crashing(model, config, source, **kw):  # crash right after the checkpoint at step 4
        return real(model, config, CrashingSource(source, at=4 * config.grad_accum), **kw)

    monkeypatch.setattr(runner, "Trainer", crashing)
    with pytest.raises(Crash):
        train(name, data=data, out=tmp_path / "b", sets=sets)
    monkeypatch.setattr(runner, "Trainer", real)
    torch.manual_seed(12345)  # the checkpoint, not the current RNG state, must decide what follows
    b, metrics = train(name, out=tmp_path / "b", resume=True)
    assert metrics["step"] == 8
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


def test_a_run_saved_before_a_setting_existed_resumes_with_what_it_was_trained_with(tmp_path, corpus):
    """gpt-char now defaults to Muon + WSD + QK-norm; a run whose run.json predates those settings was
    trained with AdamW, cosine and no QK-norm, and must resume with them (not fail on a state mismatch
    or silently switch optimizer)."""
    import json

    new_keys = ("optimizer", "muon_lr", "muon_momentum", "muon_weight_decay", "schedule", "decay_fraction",
                "qk_norm")
    sets = {"dim": 32, "num_layers": 1, "num_heads": 2, "block_size": 16, "batch_size": 4, "eval_iters": 2,
            "sample_tokens": 0, "max_iters": 4, "checkpoint_interval": 4, "eval_interval": 0, "warmup_iters": 2,
            "progress": False, "optimizer": "adamw", "schedule": "cosine", "qk_norm": False}
    out, _ = train("gpt-char", data=str(corpus), out=tmp_path / "old", sets=sets)
    info = json.loads((out / "run.json").read_text())
    assert all(k in info["settings"] for k in new_keys)
    for k in new_keys:  # as the previous version wrote it
        info["settings"].pop(k)
    (out / "run.json").write_text(json.dumps(info))
    cfg = json.loads((out / "config.json").read_text())
    cfg.pop("qk_norm", None)
    (out / "config.json").write_text(json.dumps(cfg))
    _, metrics = train("gpt-char", out=out, resume=True, sets={"max_iters": 6})
    assert metrics["step"] == 6
    resumed = json.loads((out / "run.json").read_text())["settings"]
    assert (resumed["optimizer"], resumed["schedule"], resumed["qk_norm"]) == ("adamw", "cosine", False)
