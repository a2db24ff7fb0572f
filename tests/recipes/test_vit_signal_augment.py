"""The vit recipe's MNIST-1D augmentations: training batches only, refused where they do not apply."""

import pytest
import torch

import tokennet
from tokennet.cli import main
from tokennet.data.image_batches import evaluate_classifier
from tokennet.data.vision_data import load_mnist1d
from tokennet.recipes import get_recipe, train

TINY = {"dim": 16, "num_layers": 1, "num_heads": 2, "max_iters": 4, "time_budget": None, "eval_interval": 0,
        "log_interval": 2, "progress": False, "batch_size": 16, "report": False}
LOUD = {"roll": 20, "scale": 0.2, "gain": 0.5, "noise": 3.0, "corr_noise": 3.0, "shear": 5.0}


def test_only_training_batches_are_augmented(tmp_path):
    """With augmentation far louder than the signals, the saved metrics still equal the raw test set's: the
    test set never passes through it (and the run records the settings)."""
    run_dir, metrics = train("vit", data="mnist1d", out=tmp_path / "r", sets={**TINY, **LOUD}, device="cpu")
    run = tokennet.load(run_dir)
    assert {k: run.settings[k] for k in LOUD} == LOUD
    data = load_mnist1d()
    raw = evaluate_classifier(run.model, data.x_test, data.y_test)
    assert metrics["test_loss"] == pytest.approx(raw["test_loss"], rel=1e-5)
    assert metrics["test_accuracy"] == raw["test_accuracy"]
    assert get_recipe("vit").evaluate_run(run, None)["test_loss"] == pytest.approx(raw["test_loss"], rel=1e-5)


def test_training_batches_differ_from_the_data_and_repeat_by_seed():
    from tokennet.data.image_batches import ImageBatches
    from tokennet.recipes.vit import _OPTIONS, _augment

    data = load_mnist1d()
    augment = _augment({**_OPTIONS, "translate": 0, **LOUD}, data)
    x, y = data.x_train[:32], data.y_train[:32]
    batches = ImageBatches(x, y, 32, seed=1, augment=augment)
    plain = ImageBatches(x, y, 32, seed=1)
    assert batches.batch(0)[0].shape == plain.batch(0)[0].shape
    assert not torch.allclose(batches.batch(0)[0], plain.batch(0)[0])
    torch.testing.assert_close(batches.batch(5)[0], ImageBatches(x, y, 32, seed=1, augment=augment).batch(5)[0])
    assert _augment({**_OPTIONS, "translate": 0}, data) is None  # nothing on: no augmentation at all


@pytest.mark.parametrize(("sets", "message"), [
    (["--data", "mnist1d", "--set", "noise=-0.1"], "noise must be >= 0"),
    (["--data", "mnist1d", "--set", "roll=40"], "roll=40 shifts by the whole signal"),
    (["--data", "mnist1d", "--set", "translate=40"], "translate=40 shifts by the whole 40-sample side"),
    (["--set", "shear=1"], "shear: only for 1-D signals"),
])
def test_bad_augmentation_settings_are_one_line_errors(tmp_path, capsys, sets, message):
    out = tmp_path / "r"
    assert main(["-q", "train", "vit", *sets, "--out", str(out), "--max-iters", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and not out.exists()
