"""Recipe ``audio`` on a tiny directory of LABEL/*.wav (no espeak-ng needed): it learns, it reports the
baseline next to the model, and the CLI classifies and draws audio files."""

import json
import shutil

import numpy as np
import pytest
import torch
from scipy.io import wavfile
from support import write_wav_dataset

import tokennet
from tokennet.cli import main
from tokennet.recipes import get_recipe, train

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = {"dim": 32, "num_layers": 1, "num_heads": 2, "batch_size": 16, "n_mels": 16, "clip_samples": 8000,
        "eval_interval": 0, "warmup_iters": 5, "progress": False}


@pytest.fixture(scope="module")
def audio_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("audio")
    data = write_wav_dataset(root / "wavs", per_label=20)
    run_dir, metrics = train("audio", data=str(data), out=root / "run", device="cpu",
                             sets={**TINY, "max_iters": 150})
    return root, run_dir, metrics


def test_learns_tones_and_reports_the_baseline(audio_run):
    _, run_dir, metrics = audio_run
    assert metrics["test_size"] == 12 and metrics["train_size"] == 48
    assert metrics["test_accuracy"] >= 0.9, metrics
    assert 0 <= metrics["baseline_accuracy"] <= 1 and "MFCC" in metrics["baseline"]
    saved = json.loads((run_dir / "metrics.json").read_text())
    assert saved["baseline_accuracy"] == metrics["baseline_accuracy"]
    run = tokennet.load(run_dir)
    assert run.task.kind == "audio-classifier" and run.task.label_names(run) == ["high", "low", "mid"]


def test_generate_and_viz_audio_files(audio_run, capsys):
    root, run_dir, _ = audio_run
    files = [str(root / "wavs" / "low" / "000.wav"), str(root / "wavs" / "high" / "001.wav")]
    assert main(["-q", "generate", str(run_dir), "--audio", *files]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [ln.split("\t")[2] for ln in lines] == ["low", "high"]
    assert all(0 < float(ln.split("\t")[3]) <= 1 for ln in lines)
    assert main(["-q", "viz", str(run_dir), "--audio", files[0], "--out", str(root / "viz")]) == 0
    assert (root / "viz" / "rollout.png").stat().st_size > 1000
    assert main(["-q", "viz", str(run_dir), "--index", "2", "--out", str(root / "viz2")]) == 0  # a test clip


def test_classify_reads_stereo_at_another_rate(audio_run, tmp_path):
    _, run_dir, _ = audio_run
    rate = 22050
    t = np.arange(int(rate * 0.3)) / rate
    tone = 0.5 * np.sin(2 * np.pi * 2700 * t) * np.hanning(len(t))
    tone += 0.01 * np.random.default_rng(0).standard_normal(len(t))  # the training clips' noise floor
    wavfile.write(tmp_path / "s.wav", rate, np.stack([tone, tone], 1).astype(np.float32))
    run = tokennet.load(run_dir)
    [(label, prob)] = run.classify([tmp_path / "s.wav"])
    assert run.task.label_names(run)[label] == "high" and prob > 0.5
    wave = torch.zeros(1, 8000)
    assert len(run.classify(wave)) == 1  # waveforms work too


def test_show_settings_lists_the_spectrogram(capsys):
    assert main(["train", "audio", "--show-settings"]) == 0
    out = capsys.readouterr().out
    for key in ("sample_rate = 16000", "n_mels = 40", "patch_size = 8", "patch_embed = 'conv-stem'", "hop_length = 160",
                "freq_mask", "time_mask", "baseline = True"):
        assert key in out
    assert get_recipe("audio").defaults()["clip_samples"] == 16000


def test_clips_of_any_length_through_the_cli(audio_run, tmp_path, capsys):
    """A word with silence around it and a clip three windows long are answered (trimmed, windowed), the
    long clip's deciding window is drawn; silence only and a 1 Hz sample rate are one-line errors."""
    root, run_dir, _ = audio_run
    rate, word = wavfile.read(root / "wavs" / "low" / "000.wav")
    word = word.astype(np.float32)
    quiet = np.zeros(int(0.4 * rate), np.float32)
    padded = np.concatenate([quiet, word, quiet])  # longer than the 0.5 s window only because of the silence
    wavfile.write(tmp_path / "padded.wav", rate, padded)
    noise = 0.01 * np.random.default_rng(1).standard_normal(3 * 8000).astype(np.float32)
    noise[8000:8000 + len(word)] += word  # the word in the middle window of a 1.5 s noisy clip
    wavfile.write(tmp_path / "long.wav", rate, noise)
    wavfile.write(tmp_path / "silence.wav", rate, np.zeros(8000, np.float32))
    wavfile.write(tmp_path / "one_hz.wav", 1, np.ones(10, np.float32))
    files = [str(tmp_path / "padded.wav"), str(tmp_path / "long.wav")]
    assert main(["-q", "generate", str(run_dir), "--audio", *files]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [ln.split("\t")[2] for ln in lines] == ["low", "low"]
    assert main(["-q", "viz", str(run_dir), "--audio", str(tmp_path / "long.wav"), "--out", str(tmp_path / "v")]) == 0
    assert (tmp_path / "v" / "rollout.png").stat().st_size > 1000
    for name, msg in (("silence.wav", "silence"), ("one_hz.wav", "1 Hz")):
        assert main(["-q", "generate", str(run_dir), "--audio", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert msg in err and err.strip().count("\n") == 0, err


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")
def test_robustness_metrics_are_the_evaluation_sets_accuracies():
    """test_accuracy_<name> for every evaluation set, each the plain accuracy of the model on that set."""
    from tokennet.data.speech_eval import evaluation_sets
    from tokennet.data.spoken_digits import SpokenWords
    from tokennet.models.registry import create_model
    from tokennet.recipes.audio import robustness

    torch.manual_seed(0)
    model = create_model("ast-digits", num_classes=10, dim=32, num_layers=1, num_heads=2).eval()
    spec = SpokenWords(per_voice=1, test_voices=2)
    r = robustness(model, spec, batch_size=64)
    other = shutil.which("flite") is not None or shutil.which("festival") is not None
    names = {"clean", "other_synth"} if other else {"clean"}
    names |= {f"{n}_{s}db" for n in ("white", "pink", "babble") for s in (20, 10, 0)}
    assert set(r) == {f"test_accuracy_{n}" for n in names}
    x, y, _ = evaluation_sets(seed=0, per_voice=1, test_voices=2, other=False)["pink_10db"]
    with torch.no_grad():
        pred = model(model.spectrogram_image(x)[:, None]).logits.argmax(-1)
    assert r["test_accuracy_pink_10db"] == pytest.approx(float((pred == y).float().mean()))
    # the baseline beside each set: a classifier that always says "zero" scores the share of zeros
    b = robustness(model, spec, batch_size=64, baseline=lambda w: np.zeros(len(w), np.int64))
    assert {k for k in b if k.startswith("baseline_")} == {f"baseline_accuracy_{n}" for n in names}
    assert b["baseline_accuracy_pink_10db"] == pytest.approx(float((y == 0).float().mean()))


def test_wave_augment_draws_fresh_noise_into_the_training_clips(audio_run):
    """wave_augment=noise: each training batch is the clips with noise drawn for that batch (a pure function of
    the batch index, as every batch source), turned into the model's spectrograms; none: the clips as read."""
    import dataclasses

    from tokennet.data.spoken_digits import SpokenWords
    from tokennet.errors import DataError
    from tokennet.models.registry import create_model
    from tokennet.recipes.audio import _OPTIONS, _train_source
    from tokennet.train.trainer import TrainConfig

    root, _, _ = audio_run
    spec = SpokenWords(source=str(root / "wavs"), sample_rate=16000, clip_samples=8000)
    ds = spec.load()
    model = create_model("ast-digits", num_classes=ds.num_classes, n_mels=16, clip_samples=8000, dim=32,
                         num_layers=1, num_heads=2)
    train = dataclasses.replace(TrainConfig(), batch_size=8)
    plain = _train_source(model, spec, ds, train, {**_OPTIONS, "wave_augment": "none"})
    noisy = _train_source(model, spec, ds, train, {**_OPTIONS, "wave_augment": "noise"})
    (xp, yp), (xn, yn) = plain.batch(0), noisy.batch(0)
    assert xp.shape == xn.shape and torch.equal(yp, yn)  # the same clips, in the same order
    assert not torch.allclose(xp, xn) and torch.equal(noisy.batch(0)[0], xn)  # fresh noise, the same for batch 0
    assert not torch.equal(noisy.batch(1)[0], xn)
    with pytest.raises(DataError, match="wave_augment must be one of"):
        _train_source(model, spec, ds, train, {**_OPTIONS, "wave_augment": "reverb"})


def test_report_panel_sets_the_baseline_beside_each_evaluation_set(audio_run):
    """The report's "speech it never trained on" table: the model's and the MFCC + SVM's accuracy per set."""
    from tokennet.viz.report import read_log

    _, run_dir, _ = audio_run
    run = tokennet.load(run_dir)
    run.metrics = {**run.metrics, "test_accuracy_other_synth": 0.625, "baseline_accuracy_other_synth": 0.375,
                   "test_accuracy_clean": 1.0}
    panels = dict(run.task.panel(run, read_log(run_dir)))
    html = panels["Speech it never trained on (test accuracy)"]
    assert "MFCC + SVM" in html and 'data-metric="baseline_accuracy_other_synth"' in html
    assert html.index("other synth") < html.index("0.375") and "clean" in html
