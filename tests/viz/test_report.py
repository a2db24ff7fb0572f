"""The run report: a valid, self-contained HTML5 page whose pictures decode and whose numbers are metrics.json's;
written by training (at checkpoints and at the end), by ``tokennet report``, and readable in a real browser."""

import io
import json
import logging
import math
import re

import numpy as np
import pytest
import torch
from PIL import Image
from support import data_uris, parse_html

from tokennet.cli import main
from tokennet.errors import RunError
from tokennet.recipes import get_recipe, train
from tokennet.tasks import task_for
from tokennet.viz import report as report_mod
from tokennet.viz.report import list_panels, read_log, write_report
from tokennet.viz.report.browser import find_chromium, screenshot

pytestmark = pytest.mark.usefixtures("one_thread")

# Every recipe's page is checked in tests/recipes/test_every_recipe.py (valid, self-contained, every metric as
# metrics.json holds it); here, what the core and four panels show, on tiny runs of those recipes (their smoke
# settings, six steps, logged every step).
COMMON = {"max_iters": 6, "time_budget": None, "warmup_iters": 1, "eval_interval": 3, "log_interval": 1,
          "progress": False}
EXTRA = {"gpt-char": {"sample_tokens": 20}, "seq2seq": {"test_size": 12, "beam_size": 1}, "caption": {"test_size": 10},
         "vit": {"dim": 16}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus):
    """One tiny finished run per task kind; training writes each one's report.html."""
    root = tmp_path_factory.mktemp("report")
    out = {}
    for name, extra in EXTRA.items():
        recipe = get_recipe(name)
        data = recipe.smoke_data(root) if recipe.smoke_data is not None else None
        out[name], _ = train(name, data=data, out=root / name, sets={**recipe.smoke, **COMMON, **extra},
                             device="cpu")
    return out


# -- what the page must be ---------------------------------------------------------------------------
parse = parse_html


def metric_value(metrics: dict, dotted: str):
    v = metrics
    for part in dotted.split("."):
        v = v[part]
    return v


def test_classifier_matrix_agrees_with_metrics(runs):
    text = (runs["vit"] / "report.html").read_text()
    metrics = json.loads((runs["vit"] / "metrics.json").read_text())
    recomputed = float(re.search(r'data-recomputed="test_accuracy">([^<]+)<', text).group(1))
    assert recomputed == pytest.approx(metrics["test_accuracy"], abs=1e-12)
    assert "Most confident mistakes" in text and "Where the model looks" in text


def test_task_panels_show_their_parts(runs):
    pages = {r: (runs[r] / "report.html").read_text() for r in EXTRA}
    assert pages["gpt-char"].count("<h3>temperature") == 3 and "Where the model is surprised" in pages["gpt-char"]
    assert pages["gpt-char"].count('title="loss ') >= 16  # every predicted token of the snippet is shaded
    for r, heading in (("seq2seq", "Alignment"), ("caption", "Caption attention")):
        assert f"<h2>{heading}</h2>" in pages[r]
        assert pages[r].count('<tr class="hit">') + pages[r].count('<tr class="miss">') == EXTRA[r]["test_size"]


def test_task_kinds_have_panels_and_others_fall_back(runs, monkeypatch, tmp_path):
    assert {"language-model", "image-classifier", "translation", "captioning"} <= set(list_panels())
    assert {task_for(f).kind for f in ("gpt", "vit", "seq2seq", "captioner")} <= set(list_panels())
    from tokennet.tasks import Task

    # A task kind whose panel has not landed yet:
    monkeypatch.setattr(type(task_for("gpt")), "panel", Task.panel)
    text = write_report(runs["gpt-char"], tmp_path / "r.html").read_text()
    parse(text)
    assert "No report panel is declared for language-model runs" in text and "Training curves" in text


def test_settings_diff_highlights_what_differs_from_the_recipe(runs):
    text = (runs["vit"] / "report.html").read_text()
    changed = set(re.findall(r'<tr class="changed"><td><code>([a-z_0-9]+)</code>', text))
    assert {"dim", "num_layers", "max_iters", "svm_baseline"} <= changed
    assert "lr" not in changed and "beta1" not in changed
    cmd = re.search(r"<h3>Command</h3><pre>([^<]*)</pre>", text).group(1)
    assert cmd.startswith("tokennet train vit") and "dim=16" in cmd and "lr=" not in cmd


def test_log_has_grad_norm_and_curves(runs):
    log = read_log(runs["gpt-char"] / "log.jsonl")
    norms = [r["grad_norm"] for r in log.train]
    assert len(norms) == 6 and all(math.isfinite(g) and g > 0 for g in norms)
    assert 'alt="gradient norm against step"' in (runs["gpt-char"] / "report.html").read_text()


def test_a_new_task_kind_adds_a_panel_without_touching_the_core(runs, monkeypatch, tmp_path):
    monkeypatch.setitem(report_mod._PANELS, "language-model",
                        lambda run, log: [("Custom panel", f"<p>{len(log.train)} records of {run.task.name}</p>")])
    text = write_report(runs["gpt-char"], tmp_path / "r.html").read_text()
    assert "<h2>Custom panel</h2><p>6 records of language model</p>" in text


# -- training writes it at checkpoints; bad input ------------------------------------------------------
def test_trainer_calls_on_checkpoint(tmp_path):
    from tokennet.data.text import LMBatches
    from tokennet.models import create_model
    from tokennet.train import TrainConfig, Trainer

    torch.manual_seed(0)
    model = create_model("gpt-micro", vocab_size=11, block_size=8)
    src = LMBatches(torch.randint(11, (300,)), 8, 4, seed=0)
    calls = []
    cfg = TrainConfig(max_iters=6, warmup_iters=1, eval_interval=0, checkpoint_interval=2, progress=False)
    Trainer(model, cfg, src, out_dir=tmp_path, on_checkpoint=lambda t: calls.append(t.step)).fit()
    assert calls == [2, 4]  # not the final checkpoint: the caller reports the finished run itself


def test_checkpoint_pages_are_throttled_but_a_stopping_run_gets_one():
    from types import SimpleNamespace

    from tokennet.viz.report import CheckpointReports

    writes = []
    hook = CheckpointReports(lambda: writes.append(1), min_interval=3600)
    for _ in range(5):  # a checkpoint every step must not mean a page every step
        hook(SimpleNamespace(stopping=False))
    assert len(writes) == 1
    hook(SimpleNamespace(stopping=True))  # Ctrl-C: the last page is written whatever the interval
    assert len(writes) == 2


def test_interrupted_run_has_a_curves_page(runs, tmp_path):
    """What a checkpoint writes: curves and settings, no model yet; the status says so."""
    import shutil

    d = tmp_path / "partial"
    shutil.copytree(runs["gpt-char"], d)
    for f in ("metrics.json", "config.json", "model.safetensors", "report.html"):
        (d / f).unlink()
    text = write_report(d, panels=False).read_text()
    parse(text)
    assert "in progress or interrupted (last logged step 6)" in text
    assert "appear here when training finishes" in text
    assert not list(d.glob(".report.html.tmp*")), "the page is written atomically"


def test_no_log_yet(runs, tmp_path):
    import shutil

    d = tmp_path / "fresh"
    d.mkdir()
    shutil.copy(runs["gpt-char"] / "run.json", d / "run.json")
    text = write_report(d).read_text()
    parse(text)
    assert "Training has not logged anything yet" in text
    assert "data:image/png" not in text


def test_corrupt_log_lines_are_skipped_counted_and_reported(runs, tmp_path):
    import shutil

    d = tmp_path / "corrupt"
    shutil.copytree(runs["gpt-char"], d)
    lines = (d / "log.jsonl").read_text().splitlines()
    lines.insert(2, '{"step": 3, "loss": 1.0')  # cut mid-write
    lines.insert(5, "[1, 2]")
    lines.append("\x00\x00garbage")
    (d / "log.jsonl").write_text("\n".join(lines) + "\n")
    log = read_log(d / "log.jsonl")
    assert log.skipped == [3, 6, len(lines)]
    text = write_report(d, panels=False).read_text()
    parse(text)
    assert 'data-skipped="3"' in text and "3 line(s) of log.jsonl could not be read" in text
    assert 'alt="loss against step"' in text


def test_resumed_log_keeps_the_run_that_counts(tmp_path):
    f = tmp_path / "log.jsonl"
    recs = [{"step": s, "loss": 5.0 - s} for s in (1, 2, 3, 4)] + [{"step": s, "loss": 9.0} for s in (3, 4, 5)]
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    xs, ys = read_log(f).series("train", "loss")
    assert xs == [1, 2, 3, 4, 5] and ys == [4.0, 3.0, 9.0, 9.0, 9.0]


def test_not_a_run_is_one_line_error(tmp_path, capsys):
    with pytest.raises(RunError, match="not a tokennet run directory"):
        write_report(tmp_path)
    assert main(["report", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tokennet: error:") and "\n" not in err and "not a run directory" in err


def test_cli_report_writes_the_page(runs, tmp_path, capsys):
    out = tmp_path / "page.html"
    assert main(["-q", "report", str(runs["seq2seq"]), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    parse(out.read_text())


def test_tensorboard_missing_is_one_warning(tmp_path, caplog, corpus, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if the package were not installed
    with caplog.at_level(logging.WARNING):
        train("gpt-char", data=str(corpus), out=tmp_path / "tb",
              sets={**get_recipe("gpt-char").smoke, **COMMON, "max_iters": 2, "tensorboard": True, "report": False},
              device="cpu")
    msgs = [r.getMessage() for r in caplog.records if "tensorboard" in r.getMessage()]
    assert len(msgs) == 1 and "not installed" in msgs[0]
    assert (tmp_path / "tb" / "log.jsonl").is_file() and not (tmp_path / "tb" / "report.html").exists()


def test_tensorboard_gets_the_log_records():
    from tokennet.train.tensorboard import TensorBoardLog

    class Writer:
        def __init__(self):
            self.scalars, self.flushes = [], 0

        def add_scalar(self, tag, value, step):
            self.scalars.append((tag, value, step))

        def flush(self):
            self.flushes += 1

    w = Writer()
    tb = TensorBoardLog(w)
    tb.write({"step": 5, "loss": 2.5, "lr": 1e-3, "grad_norm": 0.7, "note": "x"})
    tb.write({"step": 10, "elapsed": 1.0, "val_loss": float("nan"), "test_accuracy": 0.5, "ok": True})
    assert w.scalars == [("train/loss", 2.5, 5), ("train/lr", 1e-3, 5), ("train/grad_norm", 0.7, 5),
                         ("eval/elapsed", 1.0, 10), ("eval/test_accuracy", 0.5, 10)]
    assert w.flushes == 2


# -- in a real browser ------------------------------------------------------------------------------------
PLOT_COLOURS = {"train": (0x3B, 0x75, 0xAF), "validation": (0xD9, 0x62, 0x2B), "lr": (0x6A, 0x4C, 0x93),
                "grad norm": (0x2A, 0x9D, 0x8F)}


@pytest.mark.skipif(find_chromium() is None, reason="chromium is not installed (Debian: apt-get install chromium)")
def test_report_renders_in_headless_chromium(runs, tmp_path):
    png = tmp_path / "shot.png"
    console = screenshot(runs["gpt-char"] / "report.html", png, height=4000)
    assert console == [], console
    im = Image.open(png).convert("RGB")
    assert im.width == 1280 and im.height > 1000
    px = np.asarray(im, dtype=np.int16).reshape(-1, 3)  # (pixels, RGB)
    packed = (px[:, 0].astype(np.int32) << 16) | (px[:, 1].astype(np.int32) << 8) | px[:, 2]
    assert len(np.unique(packed)) > 200, "a blank page has a handful of colours"
    for name, rgb in PLOT_COLOURS.items():
        near = int((np.abs(px - np.array(rgb)).sum(1) < 30).sum())
        assert near > 50, f"no {name} curve drawn in the screenshot"


# -- audio classifiers share the classifier panel -------------------------------------------------------
def test_audio_classifier_report(tmp_path):
    from support import write_wav_dataset

    data = write_wav_dataset(tmp_path / "wavs", per_label=8)
    run_dir, metrics = train("audio", data=str(data), out=tmp_path / "audio", device="cpu",
                             sets={"dim": 16, "num_layers": 1, "num_heads": 2, "batch_size": 8, "n_mels": 16,
                                   "clip_samples": 8000, "eval_interval": 0, "warmup_iters": 1, "max_iters": 4,
                                   "progress": False})
    text = (run_dir / "report.html").read_text()
    parse(text)
    assert "could not be drawn" not in text and "Most confident mistakes" in text
    for png in data_uris(text):
        Image.open(io.BytesIO(png)).load()
    recomputed = float(re.search(r'data-recomputed="test_accuracy">([^<]+)<', text).group(1))
    assert recomputed == pytest.approx(metrics["test_accuracy"], abs=1e-12)
    assert 'alt="attention rollout, test #0"' in text


def test_a_chromium_profile_is_removed_even_while_a_helper_still_writes_into_it(monkeypatch):
    """Chromium's helper processes can outlive the browser by a moment and write into its profile, so one removal can
    leave it behind ("Directory not empty", ignored); remove_profile tries again, and says whether it is gone."""
    from pathlib import Path

    from tokennet.viz.report import browser

    real_rmtree, calls = browser.shutil.rmtree, []

    def racing_rmtree(path, ignore_errors=False):  # the first three removals lose the race with a lingering writer
        calls.append(path)
        if len(calls) > 3:
            real_rmtree(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(browser.shutil, "rmtree", racing_rmtree)
    profile = Path(browser.new_profile())
    (profile / "Default").mkdir()
    assert browser.remove_profile(profile, tries=2, wait=0.0) is False and profile.is_dir()  # gave up: left, said so
    assert browser.remove_profile(profile, tries=5, wait=0.0) is True and not profile.exists()
    assert len(calls) == 4  # two, then two more: the second of those removed it
