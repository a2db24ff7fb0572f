import json

import pytest
import torch

from tokennet.cli import main
from tokennet.recipes import train
from tokennet.viz import get_viz, list_viz, register_viz, visualize
from tokennet.viz.attention_maps import attention_rollout, cosine_similarity_matrix, patch_box, patch_map

TINY = {"dim": 16, "num_layers": 2, "num_heads": 2, "max_iters": 3, "time_budget": None, "eval_interval": 0,
        "progress": False, "batch_size": 16, "svm_baseline": False}


# -- tensor helpers ---------------------------------------------------------------------------------
def test_rollout_properties():
    eye = torch.eye(5).expand(2, 3, 5, 5)
    torch.testing.assert_close(attention_rollout([eye, eye]), torch.eye(5).expand(2, 5, 5))
    a = torch.softmax(torch.randn(2, 3, 5, 5), -1)
    b = torch.softmax(torch.randn(2, 3, 5, 5), -1)
    r = attention_rollout([a, b])
    torch.testing.assert_close(r.sum(-1), torch.ones(2, 5))
    # without the residual term, rollout is the product of head-averaged attention, last layer first
    torch.testing.assert_close(attention_rollout([a, b], residual=0.0), b.mean(1) @ a.mean(1))
    with pytest.raises(ValueError, match="at least one layer"):
        attention_rollout([])


def test_patch_map_spreads_patch_values_over_pixels():
    v = torch.arange(6.0)
    m = patch_map(v, (2, 3), (4, 6), (2, 2), (2, 2))
    torch.testing.assert_close(m, v.reshape(2, 3).repeat_interleave(2, 0).repeat_interleave(2, 1))
    # overlapping patches (size 2, stride 1 on a 1×3 grid): the middle pixels average two patches
    o = patch_map(torch.tensor([0.0, 2.0, 4.0]), (1, 3), (1, 4), (1, 2), (1, 1))
    torch.testing.assert_close(o, torch.tensor([[0.0, 1.0, 3.0, 4.0]]))
    assert patch_box(4, (2, 3), (2, 2), (2, 2)) == (2, 2, 2, 2)
    with pytest.raises(ValueError, match="patch 6 out of range"):
        patch_box(6, (2, 3), (2, 2), (2, 2))


def test_cosine_similarity_matrix():
    s = cosine_similarity_matrix(torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 3.0]]))
    torch.testing.assert_close(s, torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 1.0]]))


# -- end to end -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    run, _ = train("vit", out=tmp_path_factory.mktemp("runs") / "digits", sets=TINY, device="cpu")
    return run


def _png(path):
    return path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 2000


def test_cli_viz_writes_the_three_pictures(digits_run, tmp_path, capsys):
    assert json.loads((digits_run / "run.json").read_text())["settings"]["backend"] == "auto"  # fused in training
    assert main(["viz", str(digits_run), "--out", str(tmp_path / "v"), "--index", "5", "--patch", "0"]) == 0
    printed = capsys.readouterr().out.split()
    names = sorted(p.rsplit("/", 1)[-1] for p in printed)
    assert names == ["patch_attention.png", "position_similarity.png", "rollout.png"]
    for name in names:
        assert _png(tmp_path / "v" / name)


def test_viz_one_layer_one_head_and_default_out(digits_run):
    files = visualize(digits_run, layer=1, head=0)
    assert all(_png(f) and f.parent == digits_run / "viz" for f in files)


def test_viz_of_an_image_file_at_another_size(digits_run, tmp_path, capsys):
    """A user's image: 12×12 grey (the model saw 8×8); its 4×4 patches at stride 2 tile it, positions interpolate."""
    import numpy as np
    from PIL import Image

    Image.fromarray((np.random.default_rng(0).random((12, 12)) * 255).astype(np.uint8)).save(tmp_path / "d.png")
    assert main(["viz", str(digits_run), "--out", str(tmp_path / "v"), "--image", str(tmp_path / "d.png")]) == 0
    assert _png(tmp_path / "v" / "patch_attention.png")
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "rgb.png")
    assert main(["viz", str(digits_run), "--out", str(tmp_path / "w"), "--image", str(tmp_path / "rgb.png")]) == 2
    assert "1 channel(s), got 3" in capsys.readouterr().err


def test_viz_bad_options_are_one_line_errors(digits_run, tmp_path, capsys):
    for args, msg in ((["--patch", "9"], "patch 9 out of range: 0..8"),
                      (["--layer", "2"], "layer 2 out of range: 0..1"),
                      (["--index", "899"], "index 899 out of range: 0..898")):
        assert main(["viz", str(digits_run), "--out", str(tmp_path), *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"tokennet: error: {msg}"]
    assert main(["viz", str(tmp_path / "nothing")]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_viz_of_a_1d_run_with_fourier_positions_and_cls(tmp_path):
    run, _ = train("vit", data="mnist1d", out=tmp_path / "r",
                   sets={**TINY, "position": "fourier", "pool": "cls", "patch_stride": 2}, device="cpu")
    files = visualize(run, tmp_path / "v")
    assert [f.name for f in files] == ["patch_attention.png", "rollout.png", "position_similarity.png"]
    assert all(_png(f) for f in files)


def test_registry_dispatches_on_the_task_kind(digits_run, tmp_path, monkeypatch):
    import tokennet.viz as viz

    assert {"image-classifier", "language-model", "translation", "captioning"} <= set(list_viz())
    with pytest.raises(ValueError, match="no pictures for a 'nope' run"):
        get_viz("nope")
    calls = []
    monkeypatch.setattr(viz, "_VIZ", dict(viz._VIZ))
    register_viz("image-classifier", lambda run, out_dir, **opts: calls.append((run.task.kind, opts)) or [])
    assert visualize(digits_run, tmp_path / "o", index=3) == [] and calls == [("image-classifier", {"index": 3})]


def test_viz_of_a_conv_stem_run(tmp_path):
    from support import write_fashion

    d = tmp_path / "fm"
    write_fashion(d, n_train=32, n_test=4)
    run, _ = train("vit", data=str(d), out=tmp_path / "r", sets=TINY, device="cpu")
    assert json.loads((run / "config.json").read_text())["patch_embed"] == "conv-stem"
    files = visualize(run, tmp_path / "v", index=3, patch=0)
    assert len(files) == 3 and all(_png(f) for f in files)
