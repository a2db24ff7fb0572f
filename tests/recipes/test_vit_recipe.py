import json

import pytest
import torch
from support import write_fashion

import tokennet
from tokennet.cli import main
from tokennet.models import create_model
from tokennet.recipes import get_recipe, train

TINY = {"dim": 16, "num_layers": 1, "num_heads": 2, "max_iters": 6, "time_budget": None, "eval_interval": 3,
        "log_interval": 3, "progress": False, "batch_size": 16}


def test_digits_run_reports_accuracy_next_to_the_svm(tmp_path):
    run, metrics = train("vit", out=tmp_path / "r", sets=TINY, device="cpu")
    assert 0 <= metrics["test_accuracy"] <= 1 and metrics["test_loss"] > 0
    assert metrics["baseline_svm_accuracy"] == pytest.approx(0.9689, abs=1e-3)  # sklearn's example figure
    assert metrics["dataset"] == "digits" and metrics["train_size"] == 898 and metrics["test_size"] == 899
    assert metrics["epochs"] == pytest.approx(6 / (898 // 16), abs=0.01)
    saved = json.loads((run / "metrics.json").read_text())
    assert saved["test_accuracy"] == metrics["test_accuracy"]
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["family"] == "vit" and cfg["image_size"] == 8 and cfg["in_channels"] == 1
    loaded = tokennet.load(run)
    evaluated = get_recipe("vit").evaluate_run(loaded, None)
    assert evaluated["test_accuracy"] == pytest.approx(metrics["test_accuracy"])
    with pytest.raises(ValueError, match="trained with image_size=8, but mnist1d .* has image_size=\\[40\\]"):
        get_recipe("vit").evaluate_run(loaded, "mnist1d")


def test_a_vit_run_classifies_tensors_and_image_files(tmp_path, capsys):
    import numpy as np
    from PIL import Image

    from tokennet.data.vision_data import load_dataset

    run_dir, _ = train("vit", out=tmp_path / "r", sets=TINY, device="cpu")
    run = tokennet.load(run_dir)
    assert run.task.verbs == ("classify",)
    x = load_dataset(None).x_test[:3]  # (3, 1, 8, 8) in [0, 1]
    out = run.classify(x)
    with torch.no_grad():
        p = run.model(x).logits.softmax(-1)
    assert [c for c, _ in out] == p.argmax(-1).tolist()
    assert [q for _, q in out] == pytest.approx(p.max(-1).values.tolist())
    path = tmp_path / "d.png"
    Image.fromarray((x[0, 0].numpy() * 255).round().astype(np.uint8)).save(path)
    assert main(["generate", str(run_dir), "--image", str(path)]) == 0
    name, label, prob = capsys.readouterr().out.strip().split("\t")
    assert name == str(path) and int(label) == out[0][0] and 0 < float(prob) <= 1
    with pytest.raises(tokennet.TokennetError, match="cannot generate"):
        run.generate("x")


def test_mnist1d_profile_builds_a_1d_vit(tmp_path):
    run, metrics = train("vit", data="mnist1d", out=tmp_path / "r", sets={**TINY, "svm_baseline": False},
                         device="cpu")
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["image_size"] == [40] and cfg["patch_size"] == 8
    settings = json.loads((run / "run.json").read_text())["settings"]
    assert settings["translate"] == 4 and settings["max_iters"] == 6  # profile where default, user value kept
    assert metrics["dataset"] == "mnist1d" and "baseline_svm_accuracy" not in metrics


def test_data_defaults_are_the_dataset_profile_and_user_values_win(tmp_path, capsys):
    r = get_recipe("vit")
    digits, fashion, one_d = r.defaults(), r.defaults("fashion-mnist"), r.defaults("mnist1d")
    assert (digits["dim"], fashion["dim"], one_d["dim"]) == (64, 96, 64)
    assert fashion["patch_embed"] == "conv-stem" and fashion["flip"] is True and digits["flip"] is False
    assert (digits["translate"], one_d["translate"]) == (1, 4)
    # a value equal to the digits default is still the user's: the MNIST-1D profile must not replace it
    run, _ = train("vit", data="mnist1d", out=tmp_path / "r", sets={**TINY, "translate": 1, "svm_baseline": False},
                   device="cpu")
    assert json.loads((run / "run.json").read_text())["settings"]["translate"] == 1
    assert main(["train", "vit", "--data", "fashion-mnist", "--show-settings", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["dim"] == 96 and shown["patch_embed"] == "conv-stem" and shown["image_size"] == 28


def test_fashion_mnist_from_a_user_directory(tmp_path):
    d = tmp_path / "fm"
    write_fashion(d, n_train=40, n_test=10)
    run, metrics = train("vit", data=str(d), out=tmp_path / "r", sets=TINY, device="cpu")
    cfg = json.loads((run / "config.json").read_text())
    fashion = create_model("vit-fashion").config
    for k in ("patch_size", "patch_stride", "pad", "pool", "image_size"):  # every field of the profile's preset
        assert cfg[k] == getattr(fashion, k), k
    settings = json.loads((run / "run.json").read_text())["settings"]
    assert settings["flip"] is True and settings["dim"] == 16
    assert metrics["dataset"] == "fashion-mnist" and metrics["test_size"] == 10


def test_bad_data_is_a_one_line_error(tmp_path, capsys):
    out = str(tmp_path / "r")
    assert main(["train", "vit", "--data", str(tmp_path / "missing"), "--out", out, "--max-iters", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing does not exist" in err[0]
    d = tmp_path / "fm"
    write_fashion(d)
    f = d / "train-images-idx3-ubyte.gz"
    f.write_bytes(f.read_bytes()[:100])
    assert main(["train", "vit", "--data", str(d), "--out", out, "--overwrite", "--max-iters", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train-images-idx3-ubyte.gz is a truncated or corrupt gzip" in err[0]
    assert main(["train", "vit", "--data", "cifar", "--out", out, "--overwrite"]) == 2
    assert "unknown data 'cifar'" in capsys.readouterr().err
    assert main(["train", "vit", "--out", out, "--overwrite", "--set", "in_channels=3", "--max-iters", "1"]) == 2
    assert "in_channels=3 does not match the data, which has in_channels=1" in capsys.readouterr().err


@pytest.mark.parametrize("recipe", ["vit", "cnn"])
def test_train_size_trains_on_a_subset_and_refuses_more_than_there_is(tmp_path, capsys, recipe):
    sets = {**TINY, "train_size": 64, "svm_baseline": False} if recipe == "vit" else {
        "max_iters": 2, "time_budget": None, "eval_interval": 0, "progress": False, "batch_size": 16, "train_size": 64}
    run, m = train(recipe, out=tmp_path / "r", sets=sets, device="cpu")
    assert m["train_size"] == 64 and m["test_size"] == 899
    assert json.loads((run / "run.json").read_text())["settings"]["train_size"] == 64
    out = tmp_path / "too-many"
    assert main(["train", recipe, "--out", str(out), "--set", "train_size=5000", "--max-iters", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train_size=5000: digits has 898 training images" in err[0] and not out.exists()


@pytest.mark.slow  # 300 steps of two models (~30 s); the cnn recipe itself is in test_every_recipe
def test_cnn_baseline_beside_the_vit(tmp_path, capsys):
    """cnn_baseline=true: the cnn recipe's CNN for the same steps on the same split, its test accuracy as
    baseline_cnn_accuracy (a CNN that learns: well above chance after 300 steps on digits); 1-D data refuses it."""
    _, m = train("vit", out=tmp_path / "r", device="cpu",
                 sets={**TINY, "max_iters": 300, "eval_interval": 0, "svm_baseline": False, "cnn_baseline": True})
    assert m["baseline_cnn_accuracy"] > 0.7 and m["baseline_cnn_parameters"] > 0, m
    assert "300 steps" in m["baseline_cnn"] and "cnn-digits" in m["baseline_cnn"]
    assert main(["-q", "train", "vit", "--data", "mnist1d", "--out", str(tmp_path / "x"), "--set",
                 "cnn_baseline=true"]) == 2
    assert "1-D signals" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_test_flips_average_each_image_with_its_mirror_and_eval_recomputes_them(tmp_path, capsys):
    """``test_flips``: p(c | x) = (softmax f(x) + softmax f(flip x)) / 2, during training, at its end and in a fresh
    ``tokennet eval``; refused on 1-D signals in one line."""
    from types import SimpleNamespace

    from tokennet.data.image_batches import evaluate_classifier

    class LeftRight(torch.nn.Module):  # class 0 for ink on the left, class 1 for ink on the right
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.tensor(3.0))

        def forward(self, x):
            half = x.shape[-1] // 2
            return SimpleNamespace(logits=self.scale * torch.stack([x[..., :half].sum((1, 2, 3)),
                                                                    x[..., half:].sum((1, 2, 3))], -1))

    x = torch.zeros(2, 1, 4, 4)
    x[0, 0, 0, 0] = 1.0  # ink on the left: class 0 plainly, class 1 in the mirror
    x[1, 0, 0, 3] = 1.0
    y = torch.tensor([0, 1])
    plain = evaluate_classifier(LeftRight(), x, y)
    assert plain["test_accuracy"] == 1.0
    p = torch.softmax(torch.tensor([3.0, 0.0]), -1)
    mirrored = evaluate_classifier(LeftRight(), x, y, flips=True)
    assert mirrored["test_loss"] == pytest.approx(-float(torch.log((p[0] + p[1]) / 2)))  # each image's mean is 1/2
    assert plain["test_loss"] == pytest.approx(-float(torch.log(p[0])))

    run, metrics = train("vit", out=tmp_path / "r", sets={**TINY, "test_flips": True}, device="cpu")
    loaded = tokennet.load(run)
    # a fresh load recomputes the metric (a near-tie may fall the other way on another CPU: one image of 899)
    assert get_recipe("vit").evaluate_run(loaded, None)["test_accuracy"] == pytest.approx(metrics["test_accuracy"],
                                                                                           abs=1 / 899)
    held = get_recipe("vit").data_spec(None, {}).held_out()
    plain = evaluate_classifier(loaded.model, held.x_test, held.y_test)
    assert evaluate_classifier(loaded.model, held.x_test, held.y_test, flips=True)["test_loss"] == \
        pytest.approx(metrics["test_loss"]) != plain["test_loss"]
    out = str(tmp_path / "refused")
    assert main(["train", "vit", "--data", "mnist1d", "--out", out, "--set", "test_flips=true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()  # after the line of the data's preparation
    assert err[-1].startswith("tokennet: error: test_flips mirrors 2-D images") and not (tmp_path / "refused").exists()
