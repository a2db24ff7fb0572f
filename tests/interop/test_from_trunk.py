"""A new task started from the shared trunk of a multimodal run: the blocks are the trunk's, everything around them
new, the shape the trunk's; ``tokennet train vit --init MULTIMODAL_RUN`` builds it, and what cannot be built is one
line."""

import json

import pytest
import torch

from tokennet.cli import main
from tokennet.errors import ConfigError
from tokennet.interop.init import from_trunk
from tokennet.models import create_model
from tokennet.models.registry import config_from_dict, preset_info

pytestmark = pytest.mark.usefixtures("one_thread")


def _vit_1d(**changes):
    family, preset, _ = preset_info("vit-1d")
    return config_from_dict({"family": family, **preset, **changes})


def test_the_blocks_are_the_trunks_and_the_rest_is_new():
    torch.manual_seed(0)
    source = create_model("multimodal", dim=32, num_layers=2, num_heads=2)
    model, fresh = from_trunk(source, _vit_1d())  # the preset says 4 layers × 64: the trunk's shape wins
    assert (model.config.dim, model.config.num_layers, model.config.num_heads) == (32, 2, 2)
    assert model.config.image_size == [40] and model.config.num_classes == 10
    theirs = source.trunk.blocks.state_dict()
    mine = model.encoder.blocks.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in theirs)
    assert "encoder" not in fresh and {"patch_embed", "head"} <= set(fresh)
    # Copies, not the trunk itself: training the new model leaves the run's trunk as it was.
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(model.encoder.blocks.parameters(),
                                                            source.trunk.blocks.parameters()))
    with torch.no_grad():
        assert model(torch.randn(3, 1, 40)).logits.shape == (3, 10)


def test_what_cannot_start_from_a_trunk_is_refused():
    with pytest.raises(ConfigError, match="no shared trunk"):
        from_trunk(create_model("vit-1d"), _vit_1d())
    with pytest.raises(ConfigError, match="not the trunk's kind"):
        from_trunk(create_model("multimodal", dim=32, num_layers=1, num_heads=2), _vit_1d(bias=False))


def test_train_vit_on_mnist1d_from_a_multimodal_run(tmp_path, capsys):
    mm = tmp_path / "mm"
    assert main(["-q", "train", "multimodal", "--out", str(mm), "--set", "tasks=image,graph", "dim=32", "num_layers=1",
                 "num_heads=2", "batch_size=8", "graph_test_size=32", "graph_val_size=8", "max_iters=2",
                 "progress=false", "report=false"]) == 0
    out = tmp_path / "ft"
    assert main(["-q", "train", "vit", "--data", "mnist1d", "--init", str(mm), "--out", str(out), "--set",
                 "max_iters=2", "eval_interval=0", "progress=false", "report=false"]) == 0
    info = json.loads((out / "run.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert info["init"] == str(mm) and (config["dim"], config["num_layers"], config["image_size"]) == (32, 1, [40])
    assert (info["settings"]["dim"], info["settings"]["num_layers"]) == (32, 1)  # run.json says the model's shape
    assert 0.0 <= json.loads((out / "metrics.json").read_text())["test_accuracy"] <= 1.0
    capsys.readouterr()
    try:
        code = main(["-q", "train", "vit", "--data", "mnist1d", "--init", str(mm), "--out", str(tmp_path / "swin"),
                     "--set", "arch=swin", "max_iters=2"])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "trunk starts a ViT" in err, err
    assert not (tmp_path / "swin").exists() or not any((tmp_path / "swin").iterdir())
