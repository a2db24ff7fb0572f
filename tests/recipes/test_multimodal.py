"""The multimodal recipe beyond the registry loop: one trunk and one digit head really shared, settings refused before
anything is written, the mixing a pure function of the step, a run of all five modalities (espeak-ng's spoken
digits included) answering each modality with its own head, and what the shared digit head does across modalities
(agreement on same-digit pairs, retrieval of the digit by the trunk's summaries), recorded in metrics.json,
recomputed by ``tokennet eval`` and shown on the report page."""

from __future__ import annotations

import itertools
import json
import math
import re
import shutil
from collections import Counter
from pathlib import Path
from unittest import mock

import pytest
import torch

from tokennet.cli import main
from tokennet.errors import DataError
from tokennet.models import create_model
from tokennet.recipes.multimodal import MixedBatches
from tokennet.run import load
from tokennet.tasks.multimodal import DigitView, cross_modal, pair_agreement, part_run, retrieval

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = {"dim": 32, "num_layers": 1, "num_heads": 2, "batch_size": 8, "text_block_size": 16, "text_eval_iters": 2,
        "text_sample_tokens": 8, "sphere_num_centres": 48, "sphere_num_samples": 256, "sphere_patch_size": 8,
        "sphere_rings": 2, "sphere_sh_degree": 3, "sphere_test_size": 40, "sphere_val_size": 16,
        "graph_test_size": 64, "graph_val_size": 16, "audio_n_mels": 16,
        "max_iters": 10, "eval_interval": 5, "progress": "false"}


def _err(capsys, argv) -> tuple[int, str]:
    capsys.readouterr()
    try:
        code = main(["-q", *map(str, argv)])
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err.strip()


def test_one_trunk_and_one_digit_head_are_shared():
    m = create_model("multimodal", dim=32, num_layers=1, num_heads=2)
    assert m.part("text").decoder is m.trunk and m.part("graph").encoder.stack is m.trunk
    assert m.part("image").head is m.part("sphere").head
    # The trunk's weights count once: fewer parameters than the parts counted apart.
    apart = sum(p.numel() for t in m.tasks for p in m.part(t).parameters())
    trunk = sum(p.numel() for p in m.trunk.parameters())
    assert m.num_parameters() == apart - (len(m.tasks) - 1) * trunk - sum(p.numel() for p in m.part("image").head
                                                                          .parameters())


@pytest.mark.parametrize(("sets", "fragment"), [
    (["tasks="], "tasks is empty"),
    (["tasks=text,video"], "unknown task 'video'"),
    (["mix=text=0"], "positive number"),
    (["mix=text=abc"], "positive number"),
    (["loss_weights=graph=-1"], "positive number"),
    (["tasks=text,image", "mix=audio=2"], "not among tasks"),
    (["tasks=text", "audio_n_mels=16"], "does not apply"),
])
def test_bad_settings_are_refused_before_anything_is_written(sets, fragment, tmp_path, capsys):
    out = tmp_path / "run"
    code, err = _err(capsys, ["train", "multimodal", "--out", out, "--set", *sets])
    assert code == 2 and "\n" not in err and fragment in err, err
    assert not out.exists() or not any(out.iterdir())


def test_the_mix_is_a_pure_function_of_the_step_with_the_given_proportions():
    src = MixedBatches({"a": None, "b": None}, {"a": 3.0, "b": 1.0}, seed=0)
    again = MixedBatches({"a": None, "b": None}, {"a": 3.0, "b": 1.0}, seed=0)
    draws = [src.task(i) for i in range(4000)]
    assert draws == [again.task(i) for i in range(4000)]
    # p(a) = 0.75; 4000 draws: standard deviation √(4000·0.75·0.25) ≈ 27, so ±140 is 5 σ.
    assert abs(Counter(draws)["a"] - 3000) < 140


def test_a_missing_espeak_ng_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TOKENNET_CACHE", str(tmp_path / "cache"))  # nothing cached: the clips must be synthesized
    with mock.patch("tokennet.data.spoken_digits.shutil.which", return_value=None):
        code, err = _err(capsys, ["train", "multimodal", "--out", tmp_path / "run", "--set", "tasks=audio,image"])
    assert code == 2 and "apt-get install espeak-ng" in err and "\n" not in err, err


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="the audio task synthesizes spoken digits with espeak-ng")
def test_five_modalities_one_run(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["-q", "train", "multimodal", "--out", str(out), "--set",
                 *(f"{k}={v}" for k, v in TINY.items())]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"text", "image", "audio", "sphere", "graph"} <= set(metrics)
    run = load(out)
    assert run.model.part("audio").head is run.model.part("image").head is run.model.part("sphere").head
    examples = {}
    for example in run.write_examples(tmp_path / "examples", 1):
        examples.update(example.values)
    # Each modality answered by its own head: classify as the CLI does, and the verbs.
    for flag in ("image", "audio", "sphere", "graphs"):
        capsys.readouterr()
        assert main(["-q", "generate", str(out), f"--{flag}", *examples[flag]]) == 0
        line = capsys.readouterr().out.strip().splitlines()[0]
        assert line.split("\t")[0] in (*examples[flag], "0"), line
    assert len(run.classify(examples["audio"])) == 1 and len(run.classify(examples["sphere"], task="sphere")) == 1
    assert run.predict(examples["graphs"][0]).shape[0] == 1
    assert isinstance(run.generate("ROMEO:", max_new_tokens=4), str)
    # A digit drawn and the same digit projected onto the sphere go through one head: same number of classes.
    with torch.no_grad():
        x = run.model.part("image").example_input(1)
        assert run.model(("image", x)).logits.shape == (1, 10)
    # tokennet eval recomputes all five tasks and the three digit tasks' cross-modal figures.
    saved = _assert_eval_equals_metrics(out, capsys)
    assert set(saved["cross_modal"]["agreement"]) == {"image_audio", "image_sphere", "audio_sphere"}
    assert len(saved["cross_modal"]["nearest"]) == 6


def _flat(d: dict, prefix: str = "") -> dict[str, float]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"{prefix}{k}"] = float(v)
    return out


def _assert_eval_equals_metrics(out: Path, capsys) -> dict:
    """``tokennet eval`` recomputes every task's metrics (and ``cross_modal``) equal to ``metrics.json``."""
    saved = json.loads((out / "metrics.json").read_text())
    capsys.readouterr()
    assert main(["-q", "eval", str(out)]) == 0
    fresh = json.loads(capsys.readouterr().out)
    tasks = saved["tasks"].split(",")
    assert set(tasks) <= set(fresh)
    want = _flat({k: saved[k] for k in (*tasks, "cross_modal") if k in saved})
    got = _flat({k: fresh[k] for k in (*tasks, "cross_modal") if k in fresh})
    assert want and set(want) == set(got), (sorted(want), sorted(got))
    for k in want:
        assert math.isclose(want[k], got[k], rel_tol=1e-6, abs_tol=1e-9), (k, want[k], got[k])
    return saved


# -- what the shared digit head does across modalities ---------------------------------------------------------------

def _view(labels, predictions, summaries=None) -> DigitView:
    labels = torch.tensor(labels)
    return DigitView(labels, torch.tensor(predictions),
                     torch.zeros(len(labels), 2) if summaries is None else summaries)


def test_agreement_is_the_fraction_of_same_digit_pairs_with_the_same_answer():
    gen = torch.Generator().manual_seed(0)
    a = _view(torch.randint(0, 4, (30,), generator=gen).tolist(), torch.randint(0, 4, (30,), generator=gen).tolist())
    b = _view(torch.randint(0, 4, (20,), generator=gen).tolist(), torch.randint(0, 4, (20,), generator=gen).tolist())
    pairs = [(i, j) for i, j in itertools.product(range(30), range(20)) if a.labels[i] == b.labels[j]]
    same = sum(bool(a.predictions[i] == b.predictions[j]) for i, j in pairs) / len(pairs)
    right = sum(bool(a.predictions[i] == a.labels[i] == b.predictions[j]) for i, j in pairs) / len(pairs)
    got_same, got_right = pair_agreement(a, b, num_classes=4)
    assert math.isclose(got_same, same) and math.isclose(got_right, right)
    # A head that answers every input with one class agrees on every pair while right on few: both figures matter.
    const = _view([0, 1, 2, 3], [7, 7, 7, 7])
    assert pair_agreement(const, const, num_classes=10) == (1.0, 0.0)
    with pytest.raises(DataError, match="no digit"):
        pair_agreement(_view([0], [0]), _view([1], [1]), num_classes=2)


def test_retrieval_finds_the_digit_through_a_per_modality_offset_and_not_without_the_digit():
    gen = torch.Generator().manual_seed(0)
    directions = torch.randn(10, 16, generator=gen)  # one direction per digit, shared by both modalities
    ya, yb = torch.arange(200) % 10, torch.arange(150) % 10
    za = directions[ya] + 0.3 * torch.randn(200, 16, generator=gen) + 5.0  # a large constant offset in one modality
    zb = directions[yb] + 0.3 * torch.randn(150, 16, generator=gen) - 3.0
    nearest, by_mean = retrieval(DigitView(ya, ya, za), DigitView(yb, yb, zb))
    assert nearest > 0.95 and by_mean > 0.95
    # Summaries that carry no digit: retrieval at chance (one in ten; 200 queries, so well below 0.3).
    noise = DigitView(ya, ya, torch.randn(200, 16, generator=gen))
    assert max(retrieval(noise, DigitView(yb, yb, torch.randn(150, 16, generator=gen)))) < 0.3


SMALL = {"dim": 32, "num_layers": 1, "num_heads": 2, "batch_size": 8, "tasks": "text,image,sphere,graph",
         "text_block_size": 16, "text_eval_iters": 2, "text_sample_tokens": 8, "sphere_test_size": 40,
         "sphere_val_size": 16, "graph_test_size": 64, "graph_val_size": 16, "max_iters": 8, "eval_interval": 4,
         "log_interval": 1, "progress": "false"}


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """A tiny run of four tasks (no audio: no espeak-ng), its report written."""
    out = tmp_path_factory.mktemp("multimodal") / "run"
    assert main(["-q", "train", "multimodal", "--out", str(out), "--set", *(f"{k}={v}" for k, v in SMALL.items())]) == 0
    return out


def test_cross_modal_is_in_metrics_and_eval_recomputes_every_task_and_it(small_run, capsys):
    saved = _assert_eval_equals_metrics(small_run, capsys)
    cross = saved["cross_modal"]
    assert set(cross["agreement"]) == {"image_sphere"} and set(cross["nearest"]) == {"image_to_sphere",
                                                                                     "sphere_to_image"}
    # The library function on the saved run gives metrics.json's figures.
    again = cross_modal(load(small_run))
    assert _flat(again).keys() == _flat(cross).keys()
    assert all(math.isclose(v, _flat(cross)[k], abs_tol=1e-9) for k, v in _flat(again).items())
    # Its agreement counts same-digit pairs between the two tasks' own held-out predictions.
    run = load(small_run)
    image, sphere = (part_run(run, t) for t in ("image", "sphere"))
    assert run.model.part("image").head is run.model.part("sphere").head
    held = image.data.held_out()
    with torch.no_grad():
        pred = run.model.part("image")(held.x_test).logits.argmax(-1)
    assert math.isclose(saved["image"]["test_accuracy"], float((pred == held.y_test).double().mean()), abs_tol=1e-9)
    assert len(sphere.data.split()[2][1]) == SMALL["sphere_test_size"]


def test_a_run_with_one_digit_task_has_no_cross_modal_figures(tmp_path, capsys):
    out = tmp_path / "run"
    sets = {k: v for k, v in {**SMALL, "tasks": "image,graph", "max_iters": 2}.items() if not k.startswith(("text_",
                                                                                                        "sphere_"))}
    assert main(["-q", "train", "multimodal", "--out", str(out), "--set", *(f"{k}={v}" for k, v in sets.items())]) == 0
    assert "cross_modal" not in json.loads((out / "metrics.json").read_text())
    with pytest.raises(DataError, match="two tasks sharing the digit head"):
        cross_modal(load(out))


def test_viz_draws_each_modality_and_the_report_has_a_panel_per_task_and_one_loss_figure(small_run, tmp_path, capsys):
    capsys.readouterr()
    assert main(["-q", "viz", str(small_run), "--out", str(tmp_path / "viz")]) == 0
    files = [Path(line) for line in capsys.readouterr().out.split()]
    drawn = {path.relative_to(tmp_path / "viz").parts[0] for path in files}
    assert drawn == {"text", "image", "sphere", "graph"}, files
    assert all(path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for path in files)
    page = (small_run / "report.html").read_text(encoding="utf-8")
    headings = re.findall(r"<h2>([^<]*)</h2>", page)
    assert "Held-out loss per task (one trunk)" in headings
    assert "The shared digit head across modalities" in headings
    for task in ("text", "image", "sphere", "graph"):
        assert any(h.startswith(f"{task}: ") for h in headings), (task, headings)
    # One figure, one line per task: the loss figure's series are the trained tasks' held-out losses.
    from tokennet.viz.report import read_log
    from tokennet.viz.report.multimodal import loss_figure

    log = read_log(small_run / "log.jsonl")
    for task in ("text", "image", "sphere", "graph"):
        assert any(log.series("eval", f"{kind}_loss_{task}")[1] for kind in ("val", "test")), task
    assert loss_figure(log, ["text", "image", "sphere", "graph"])[:8] == b"\x89PNG\r\n\x1a\n"
    metrics = json.loads((small_run / "metrics.json").read_text())
    shown = dict(re.findall(r'data-metric="(cross_modal\.[^"]+)">([^<]*)<', page))
    assert set(shown) == {f"cross_modal.{k}" for k in _flat(metrics["cross_modal"])}
    assert all(json.loads(v) == _flat(metrics["cross_modal"])[k.removeprefix("cross_modal.")] for k, v in shown.items())


def test_an_input_of_a_modality_not_trained_is_refused_in_one_line_naming_the_trained_ones(small_run, tmp_path,
                                                                                          capsys):
    wav = tmp_path / "one.wav"
    wav.write_bytes(b"RIFF")
    code, err = _err(capsys, ["generate", small_run, "--audio", wav])
    assert code == 2 and "\n" not in err and "trained on text, image, sphere, graph" in err, err
    with pytest.raises(DataError, match="trained on text, image, sphere, graph"):
        load(small_run).classify(torch.zeros(1, 16000))  # a waveform: the audio task, which this run has not
