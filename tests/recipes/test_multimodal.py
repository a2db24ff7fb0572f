"""The multimodal recipe beyond the registry loop: one trunk and one digit head really shared, settings refused before
anything is written, the mixing a pure function of the step, and a run of all five modalities (espeak-ng's spoken
digits included) answering each modality with its own head."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from unittest import mock

import pytest
import torch

from tokennet.cli import main
from tokennet.models import create_model
from tokennet.recipes.multimodal import MixedBatches
from tokennet.run import load

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
    examples = run.task.examples(run, tmp_path)
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
