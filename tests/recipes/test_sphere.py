"""Recipe `sphere` on tiny settings: the run, its rotation table, eval, the task verb, viz, bad input."""

import json
import re

import pytest
import torch

import tokennet
from tokennet.cli import main
from tokennet.recipes import train
from tokennet.recipes.sphere import MODELS, REGIMES

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = {"num_centres": 48, "num_samples": 256, "patch_size": 8, "rings": 2, "sh_degree": 3, "dim": 16,
        "num_layers": 1, "num_heads": 2, "batch_size": 8, "max_iters": 3, "eval_interval": 0, "warmup_iters": 1,
        "test_size": 20, "val_size": 8, "grid_height": 8, "grid_width": 16, "progress": False, "ablation_steps": 3,
        "ablation": True}


def test_run_with_the_rotation_table_eval_classify_and_viz(tmp_path):
    run_dir, metrics = train("sphere", out=tmp_path / "s", sets=TINY, device="cpu")
    table = metrics["ablation"]
    assert set(table) == set(MODELS) and all(list(row) == list(REGIMES) for row in table.values())
    assert all(0 <= v <= 1 for row in table.values() for v in row.values())
    # The configured model (the default: invariant in the signal's frame, trained unrotated) is reported, not
    # retrained.
    inv = table["sphere, invariant frame"]
    assert inv["NR/NR"] == metrics["test_accuracy"] and inv["NR/R"] == metrics["test_accuracy_rotated"]
    assert json.loads((run_dir / "metrics.json").read_text())["ablation"] == table
    assert metrics["ablation_steps"] == 3
    assert not any(p.name.startswith("tmp") for p in run_dir.iterdir())  # variants' checkpoints not kept

    run = tokennet.load(run_dir)
    assert run.task.kind == "sphere"
    fresh = get_eval(run)
    assert fresh["test_accuracy"] == metrics["test_accuracy"]
    assert fresh["test_accuracy_rotated"] == metrics["test_accuracy_rotated"]
    out = run.classify(torch.rand(2, 1, 8, 8))  # images: projected as in training
    assert len(out) == 2 and all(0 <= k < 10 and 0 < p <= 1 for k, p in out)
    assert len(run.classify(torch.rand(3, 1, TINY["num_samples"]))) == 3  # signals on the model's grid

    from tokennet.viz import visualize

    files = visualize(run, tmp_path / "viz", patch=5, layer=0)
    assert [f.name for f in files] == ["patch_attention.png"] and files[0].stat().st_size > 1000

    from tokennet.viz.report import write_report

    page = write_report(run_dir, tmp_path / "r.html").read_text()
    assert "Rotations: test accuracy by train/test regime" in page and "patch attention" in page
    shown = dict(re.findall(r'data-metric="([^"]+)"[^>]*>([^<]+)<', page))
    assert shown["ablation.sphere, invariant frame.NR/R"] == json.dumps(inv["NR/R"])


def test_the_table_trains_every_model_for_ablation_steps(tmp_path, monkeypatch):
    """With ablation_steps ≠ max_iters the configured model is trained again for the table's step count (its
    row compares like with like), so all eight (model, regime) trainings run for ablation_steps."""
    from tokennet.recipes import sphere

    seen = []
    real = sphere.Trainer

    class Counting(real):
        def __init__(self, model, config, *a, **k):
            seen.append(config.max_iters)
            super().__init__(model, config, *a, **k)

    monkeypatch.setattr(sphere, "Trainer", Counting)
    run_dir, metrics = train("sphere", out=tmp_path / "s", sets={**TINY, "ablation_steps": 2}, device="cpu")
    assert seen == [2] * 2 * len(MODELS) and metrics["ablation_steps"] == 2
    assert set(metrics["ablation"]) == set(MODELS)
    from tokennet.viz.report import write_report

    page = write_report(run_dir, tmp_path / "r.html").read_text()  # the report says which steps each figure is
    assert "each model trained 2 steps on the same images; this model&#x27;s figures above are after its 3" in page


def get_eval(run):
    from tokennet.recipes import get_recipe

    return get_recipe("sphere").evaluate_run(run, None)


def test_bad_settings_data_and_inputs_are_one_line_and_write_nothing(tmp_path, capsys):
    out = tmp_path / "x"
    assert main(["-q", "train", "sphere", "--out", str(out), "--set", "position=rope"]) == 2
    assert "position must be one of" in capsys.readouterr().err
    assert main(["-q", "train", "sphere", "--out", str(out), "--set", "descriptor=rings", "patch_size=10",
                 "rings=4"]) == 2
    assert "rings=4 must divide patch_size=10" in capsys.readouterr().err
    assert main(["-q", "train", "sphere", "--out", str(out), "--data", "mnist1d"]) == 2
    assert "projects images" in capsys.readouterr().err
    assert main(["-q", "train", "sphere", "--out", str(out), "--data", str(tmp_path / "no-such")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["-q", "train", "sphere", "--out", str(out), "--set", "extent=0", "max_iters=1"]) == 2
    assert "extent must be positive" in capsys.readouterr().err
    assert not out.exists()


def test_classify_rejects_wrong_shapes_and_nan(tmp_path, capsys):
    sets = {k: v for k, v in TINY.items() if k != "ablation"}  # the default: the configured model alone
    run_dir, metrics = train("sphere", out=tmp_path / "s", sets={**sets, "max_iters": 1}, device="cpu")
    assert "ablation" not in metrics
    run = tokennet.load(run_dir)
    # The CLI classifies image files (projected as in training); a file that is no image is one line, exit 2.
    from PIL import Image

    Image.fromarray((torch.rand(8, 8) * 255).byte().numpy()).save(tmp_path / "d.png")
    assert main(["-q", "generate", str(run_dir), "--image", str(tmp_path / "d.png")]) == 0
    assert "d.png" in capsys.readouterr().out
    (tmp_path / "bad.png").write_bytes(b"not an image")
    before = sorted(p.name for p in run_dir.iterdir())
    assert main(["-q", "generate", str(run_dir), "--image", str(tmp_path / "bad.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tokennet: error:") and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in run_dir.iterdir()) == before
    from tokennet.errors import DataError

    with pytest.raises(DataError, match="shape"):
        run.classify(torch.rand(2, 1, 7))
    with pytest.raises(DataError, match="NaN"):
        run.classify(torch.full((1, 1, TINY["num_samples"]), float("nan")))
    with pytest.raises(DataError, match="NaN"):
        run.classify(torch.full((1, 1, 8, 8), float("nan")))
