"""Recipe `caption` end to end on tiny settings, both forms; eval; bad input."""

import json

import pytest
import torch

from tokennet.cli import main
from tokennet.recipes import train


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models: one thread is as fast, and far faster when other processes share the cores."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


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
    assert "takes images" in capsys.readouterr().err
    assert main(["-q", "train", "caption", "--out", str(tmp_path / "a"), "--set", "image_size=32"]) == 2
    assert "48" in capsys.readouterr().err
    assert main(["-q", "train", "caption", "--out", str(tmp_path / "b"), "--set", "form=both"]) == 2
    assert main(["eval", str(runs["decoder-only"]), "--data", "x"]) == 2
