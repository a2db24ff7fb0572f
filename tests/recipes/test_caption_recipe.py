"""Recipe `caption` end to end on tiny settings, both forms; eval; bad input."""

import json

import pytest
import torch

from tokennet.cli import main
from tokennet.recipes import train

pytestmark = pytest.mark.usefixtures("one_thread")


TINY = {"dim": 32, "num_layers": 1, "num_heads": 2, "batch_size": 8, "max_iters": 3, "eval_interval": 0,
        "warmup_iters": 1, "test_size": 10, "val_size": 5, "progress": False}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for form in ("encoder-decoder", "decoder-only"):
        out[form], _ = train("caption", out=root / form, sets={**TINY, "form": form}, device="cpu")
    return out


@pytest.mark.parametrize("form,family", [("encoder-decoder", "captioner"), ("decoder-only", "captioner-prefix")])
def test_both_forms_train_and_report_exact_match(runs, form, family):
    run_dir = runs[form]
    cfg = json.loads((run_dir / "config.json").read_text())
    m = json.loads((run_dir / "metrics.json").read_text())
    assert cfg["family"] == family
    assert m["form"] == form and 0 <= m["exact_match"] <= 100 and m["test_size"] == 10
    assert set(m["exact_match_by_objects"]) <= {"1", "2", "3"}


def test_eval_recomputes_the_metrics(runs, capsys):
    run_dir = runs["encoder-decoder"]
    assert main(["eval", str(run_dir)]) == 0
    m = json.loads(capsys.readouterr().out)
    saved = json.loads((run_dir / "metrics.json").read_text())
    assert m["exact_match"] == saved["exact_match"] and m["token_accuracy"] == pytest.approx(saved["token_accuracy"])


def test_bad_requests_are_one_line_errors(runs, capsys, tmp_path):
    assert main(["generate", str(runs["decoder-only"]), "--prompt", "a red"]) == 2
    assert "--prompt does not apply" in capsys.readouterr().err
    assert main(["-q", "train", "caption", "--out", str(tmp_path / "a"), "--set", "image_size=32"]) == 2
    assert "image_size=48" in capsys.readouterr().err
    assert main(["-q", "train", "caption", "--out", str(tmp_path / "b"), "--set", "form=both"]) == 2
    assert main(["eval", str(runs["decoder-only"]), "--data", "x"]) == 2


def _save_scene_png(path, index=0):
    """A held-out test scene of the tiny runs, written as a 48×48 PNG."""
    import numpy as np
    from PIL import Image

    from tokennet.data.shapes import held_out_scenes, images_of

    scene = held_out_scenes(0, 10, 0.2)[index]
    img = images_of([scene])[0]  # (3, 48, 48) in [0, 1]
    Image.fromarray((img.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)).save(path)
    return img


def test_generate_captions_image_files(runs, capsys, tmp_path):
    import tokennet
    from tokennet.tasks.captioning import caption_images

    run_dir = runs["encoder-decoder"]
    img = _save_scene_png(tmp_path / "a.png")
    _save_scene_png(tmp_path / "b.png", 1)
    assert main(["generate", str(run_dir), "--image", str(tmp_path / "a.png")]) == 0
    one = capsys.readouterr().out.strip()
    # the CLI captions exactly what read_image gives, and that is the generator's image to 8-bit precision
    from tokennet.data.image_files import read_image

    loaded = read_image(tmp_path / "a.png")
    torch.testing.assert_close(loaded, img, atol=0.5 / 255 + 1e-6, rtol=0)  # PNG rounding
    run = tokennet.load(run_dir)
    direct = caption_images(run.model, run.tokenizer, loaded[None])[0]
    assert one == direct == run.caption([tmp_path / "a.png"])[0] == run.caption(loaded[None])[0]
    assert main(["generate", str(run_dir), "--image", str(tmp_path / "a.png"), str(tmp_path / "b.png")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith(str(tmp_path / "a.png") + "\t")


def test_image_files_of_the_wrong_kind_are_one_line_errors(runs, capsys, tmp_path):
    import numpy as np
    from PIL import Image

    run_dir = runs["decoder-only"]
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / "small.png")
    assert main(["generate", str(run_dir), "--image", str(tmp_path / "small.png")]) == 2
    err = capsys.readouterr().err
    assert "48×48" in err and "32×32" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert main(["generate", str(run_dir), "--image", str(tmp_path / "missing.png")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "junk.png").write_text("hello")
    assert main(["generate", str(run_dir), "--image", str(tmp_path / "junk.png")]) == 2
    assert "not a readable image" in capsys.readouterr().err
    Image.fromarray(np.zeros((48, 48), np.uint8)).save(tmp_path / "grey.png")  # grey: repeated to RGB
    assert main(["generate", str(run_dir), "--image", str(tmp_path / "grey.png")]) == 0
    capsys.readouterr()
    assert main(["generate", str(run_dir), "--image", str(tmp_path / "grey.png"), "--beam-size", "0"]) == 2
    assert main(["viz", str(run_dir), "--image", str(tmp_path / "grey.png"), "--out", str(tmp_path / "v")]) == 0
    assert (tmp_path / "v" / "caption_attention.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["viz", str(run_dir), "--image", str(tmp_path / "small.png"), "--out", str(tmp_path / "w")]) == 2
