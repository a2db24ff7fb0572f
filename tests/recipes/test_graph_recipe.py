"""Recipe `graph` on tiny settings: the run, its ablation table, eval, the task verb, string settings."""

import json

import pytest
import torch

import tokennet
from tokennet.cli import main
from tokennet.recipes import get_recipe, parse_sets, train
from tokennet.recipes.graph import VARIANTS

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = {"dim": 16, "num_layers": 1, "num_heads": 2, "batch_size": 8, "max_iters": 3, "eval_interval": 0,
        "warmup_iters": 1, "test_size": 20, "val_size": 8, "progress": False}


def test_the_default_run_trains_the_configured_model_alone(tmp_path):
    _, metrics = train("graph", out=tmp_path / "g", sets=TINY, device="cpu")
    assert "ablation" not in metrics and 0 <= metrics["test_accuracy"] <= 1


def test_run_with_the_ablation_table(tmp_path):
    run_dir, metrics = train("graph", out=tmp_path / "g", sets={**TINY, "ablation": True}, device="cpu")
    assert set(metrics["ablation"]) == set(VARIANTS)
    assert all(0 <= v <= 1 for v in metrics["ablation"].values())
    # the configured model (the default: full attention + the spectral-kernel bias) is reported, not retrained
    assert metrics["variant"] == "spectral-kernel bias"
    assert metrics["ablation"]["spectral-kernel bias"] == metrics["test_accuracy"]
    assert json.loads((run_dir / "metrics.json").read_text())["ablation"] == metrics["ablation"]
    assert not any(p.name.startswith("tmp") for p in run_dir.iterdir())  # variants' checkpoints not kept
    run = tokennet.load(run_dir)
    assert run.task.kind == "graph"
    out = run.classify([(torch.tensor([[1.0, 1], [0, 1], [1, 1]]), [(0, 1), (1, 2)])])
    assert len(out) == 1 and 0 <= out[0][0] < 6 and 0 < out[0][1] <= 1


def test_string_settings_keep_none_as_a_value():
    d = get_recipe("graph").defaults()
    assert parse_sets(["position=none", "attention=adjacency"], d) == {"position": "none", "attention": "adjacency"}
    assert parse_sets(["min_lr=none"], d) == {"min_lr": None}  # optional numbers still take none


def test_bad_settings_and_data_are_one_line(tmp_path, capsys):
    assert main(["-q", "train", "graph", "--out", str(tmp_path / "x"), "--set", "attention=sparse"]) == 2
    assert "attention must be one of" in capsys.readouterr().err
    assert main(["-q", "train", "graph", "--out", str(tmp_path / "x"), "--data", str(tmp_path / "no-such")]) == 2
    assert "takes its embedded generator or QM9" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
