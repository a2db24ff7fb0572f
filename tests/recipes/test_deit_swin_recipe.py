"""The vit recipe's Swin (``arch=swin``) and DeiT (``teacher=RUN_DIR``): built from the shared settings, a
teacher's hard labels in the batches, one-line errors for a bad teacher, exact resume with a teacher."""

import json

import pytest
import torch
from safetensors.torch import load_file
from support import Crash, CrashingSource

import tokennet
import tokennet.lifecycle.runner as runner
from tokennet.cli import main
from tokennet.data.vision_data import VisionData, load_digits
from tokennet.errors import RecipeError
from tokennet.recipes import train
from tokennet.recipes.vit import load_teacher

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = {"dim": 16, "num_heads": 2, "max_iters": 6, "time_budget": None, "eval_interval": 3, "log_interval": 3,
        "progress": False, "batch_size": 16, "svm_baseline": False, "report": False}


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """A tiny ViT run on digits, the teacher of the DeiT tests."""
    out, _ = train("vit", out=tmp_path_factory.mktemp("teacher") / "t", sets={**TINY, "num_layers": 1}, device="cpu")
    return out


def test_arch_swin_builds_a_swin_from_the_shared_settings(tmp_path):
    run, metrics = train("vit", out=tmp_path / "s", device="cpu",
                         sets={**TINY, "arch": "swin", "patch_size": 2, "depths": "2,2", "window_size": 2,
                               "drop_path": 0.1})
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["family"] == "swin" and cfg["depths"] == [2, 2] and cfg["window_size"] == 2 and cfg["dim"] == 16
    assert cfg["patch_size"] == 2 and cfg["drop_path"] == 0.1 and metrics["arch"] == "swin"
    loaded = tokennet.load(run)
    assert loaded.task.name == "image classification" and len(loaded.classify(load_digits().x_test[:2])) == 2


def test_settings_of_the_other_architecture_are_refused(tmp_path, capsys):
    out = str(tmp_path / "r")
    assert main(["train", "vit", "--out", out, "--set", "depths=2,2", "--max-iters", "1"]) == 2
    assert "depths does not apply" in capsys.readouterr().err
    assert main(["train", "vit", "--out", out, "--set", "arch=swin", "num_layers=3", "--max-iters", "1"]) == 2
    assert "num_layers does not apply" in capsys.readouterr().err
    assert main(["train", "vit", "--out", out, "--set", "arch=swin", "depths=2,x", "--max-iters", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "depths=2,x: expected Swin's blocks per stage" in err[0]


def test_deit_learns_from_a_teacher_run(tmp_path, teacher):
    run, metrics = train("vit", out=tmp_path / "d", device="cpu", sets={**TINY, "num_layers": 1,
                                                                       "teacher": str(teacher)})
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["distill"] is True
    assert metrics["teacher"] == str(teacher)
    assert metrics["teacher_test_accuracy"] == json.loads((teacher / "metrics.json").read_text())["test_accuracy"]
    settings = json.loads((run / "run.json").read_text())["settings"]
    assert settings["distill"] is True and settings["teacher"] == str(teacher)
    # evaluation needs no teacher: the saved model averages its two heads
    assert get_eval(run)["test_accuracy"] == pytest.approx(metrics["test_accuracy"])
    assert main(["viz", str(run), "--out", str(tmp_path / "viz")]) == 0
    assert (tmp_path / "viz" / "distillation.png").is_file()


def get_eval(run):
    from tokennet.recipes import get_recipe

    return get_recipe("vit").evaluate_run(tokennet.load(run), None)


def test_a_bad_teacher_is_a_one_line_error(tmp_path, teacher, capsys):
    def refused(sets, data=None):
        argv = ["train", "vit", "--out", str(tmp_path / "x"), "--overwrite", "--max-iters", "1",
                "--set", *(f"{k}={v}" for k, v in sets.items())]
        assert main(argv + (["--data", data] if data else [])) == 2
        err = capsys.readouterr().err.strip().splitlines()
        errors = [line for line in err if not line.startswith("preparing the data")]  # a slow phase's progress
        assert len(errors) == 1, err
        return errors[0]

    assert "is not a run directory" in refused({"teacher": tmp_path / "nowhere"})
    (tmp_path / "empty").mkdir()
    assert "empty: not a run directory: expected config.json" in refused({"teacher": tmp_path / "empty"})
    assert main(["train", "count-ones", "--out", str(tmp_path / "bits"), "--max-iters", "2", "--set",
                 "progress=false", "report=false"]) == 0
    capsys.readouterr()  # the teacher's own training output
    assert "is a bit counting run, not an image classifier" in refused({"teacher": tmp_path / "bits"})
    assert "takes images with image_size=8, but mnist1d has image_size=[40]" in refused(
        {"teacher": teacher, "svm_baseline": "false"}, data="mnist1d")
    assert "does not apply" in refused({"teacher": teacher, "arch": "swin"})
    assert "leave distill unset" in refused({"teacher": teacher, "distill": "false"})
    d = load_digits()
    five = VisionData("five", d.x_train, d.y_train % 5, d.x_test, d.y_test % 5, tuple("abcde"))
    with pytest.raises(RecipeError, match="classifies 10 classes, but five has 5"):
        load_teacher(str(teacher), five, "cpu")


def test_a_run_with_a_teacher_resumes_exactly(tmp_path, teacher, monkeypatch):
    sets = {**TINY, "num_layers": 1, "teacher": str(teacher), "max_iters": 8, "checkpoint_interval": 4,
            "eval_interval": 0, "warmup_iters": 2, "dropout": 0.1, "drop_path": 0.1, "randaugment": 2, "cutmix": 1.0,
            "mixup": 0.8, "repeats": 2}
    a, _ = train("vit", out=tmp_path / "a", sets=sets, device="cpu")
    real = runner.Trainer

    def crashing(model, config, source, **kw):
        return real(model, config, CrashingSource(source, at=4), **kw)

    monkeypatch.setattr(runner, "Trainer", crashing)
    with pytest.raises(Crash):
        train("vit", out=tmp_path / "b", sets=sets, device="cpu")
    monkeypatch.setattr(runner, "Trainer", real)
    torch.manual_seed(999)
    b, metrics = train("vit", out=tmp_path / "b", resume=True, device="cpu")
    assert metrics["step"] == 8
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
