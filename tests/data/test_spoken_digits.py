"""Spoken digits: the generator (with a synthetic stand-in for espeak-ng), held-out voices, the cache, and
directories of LABEL/*.wav."""

import hashlib

import numpy as np
import pytest
from support import write_wav_dataset

from tokennet.data import spoken_digits as sd
from tokennet.errors import DataError


def fake_synth(word, voice, rate, pitch):
    """A "word": two tones set by the digit, shifted by the voice's pitch and the pitch setting, at 22050 Hz."""
    d = sd.DIGITS.index(word)
    base = 1.0 + 0.1 * (sum(map(ord, voice)) % 7) + (pitch - 50) / 500
    n = int(22050 * 0.4 * 160 / rate)
    t = np.arange(n) / 22050
    x = np.sin(2 * np.pi * 200 * (d + 1) * base * t) + 0.5 * np.sin(2 * np.pi * 3000 * base * t)
    pad = np.zeros(2000)
    return (np.concatenate([pad, x * np.hanning(n), pad]) * 10000).astype(np.int16), 22050


KW = {"accents": ("a", "b", "c"), "variants": ("m1", "f1"), "per_voice": 2, "test_voices": 2, "synth": fake_synth,
      "workers": 1}


def test_generated_set_holds_out_whole_voices_and_is_cached(tmp_path):
    path = sd.synthesize_spoken_digits(tmp_path, seed=3, **KW)
    ds = sd.load_spoken_digits(path)
    assert ds.labels == list(sd.DIGITS) and ds.sample_rate == 16000
    assert ds.x_train.shape == (4 * 10 * 2, 16000) and ds.x_test.shape == (2 * 10 * 2, 16000)
    assert ds.x_train.abs().max() <= 1 and ds.x_train.abs().max() > 0.05
    assert sorted(set(ds.y_test.tolist())) == list(range(10))
    test_voices = set(ds.test_voices)
    assert len(test_voices) == 2 and len(ds.test_voices) == 40
    # whole voices: every clip of a held-out voice is in the test split and none in training
    with np.load(path) as z:
        voices = z["voices"].tolist()
        train_voices = {voices[v] for v, t in zip(z["voice"], z["test"], strict=True) if not t}
    assert not test_voices & train_voices and len(train_voices) == 4
    # cached: a second call finds the file instead of synthesizing
    mtime = path.stat().st_mtime_ns
    assert sd.synthesize_spoken_digits(tmp_path, seed=3, **KW) == path and path.stat().st_mtime_ns == mtime


def test_same_seed_same_file_other_seed_other_file(tmp_path):
    a = sd.synthesize_spoken_digits(tmp_path / "a", seed=1, **KW)
    b = sd.synthesize_spoken_digits(tmp_path / "b", seed=1, **{**KW, "workers": 2})
    c = sd.synthesize_spoken_digits(tmp_path / "c", seed=2, **KW)
    digest = [hashlib.sha256(p.read_bytes()).hexdigest() for p in (a, b, c)]
    assert digest[0] == digest[1] != digest[2]


def test_clip_noise_is_at_the_drawn_snr_and_the_offset_random():
    word, rate = fake_synth("three", "a+m1", 160, 50)
    kw = {"sample_rate": 16000, "clip_samples": 16000}
    clean = sd._clip(word, rate, rng=np.random.default_rng(5), snr_db=(300.0, 300.0), **kw)
    noisy = sd._clip(word, rate, rng=np.random.default_rng(5), snr_db=(10.0, 10.0), **kw)
    loud = np.flatnonzero(np.abs(clean) > 1e-6)
    signal_power = np.mean(clean[loud[0]:loud[-1] + 1] ** 2)
    noise_power = np.mean((noisy - clean) ** 2)
    assert 10 * np.log10(signal_power / noise_power) == pytest.approx(10.0, abs=0.3)
    starts = {int(np.flatnonzero(np.abs(sd._clip(word, rate, rng=np.random.default_rng(s), snr_db=(300.0, 300.0),
                                                  **kw)) > 1e-6)[0]) for s in range(6)}
    assert len(starts) == 6  # the word starts at a random place


def test_missing_espeak_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(sd.shutil, "which", lambda name: None)
    with pytest.raises(DataError, match="apt-get install espeak-ng"):
        sd.synthesize_spoken_digits(tmp_path, seed=0, accents=("a",), variants=("m1", "f1"), test_voices=1)
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.skipif(sd.shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")
def test_espeak_speaks_a_digit():
    x, rate = sd.espeak_synth("seven", "en-us+f2", 160, 50)
    assert rate == 22050 and x.dtype == np.int16 and 0.2 < len(x) / rate < 1.5 and np.abs(x).max() > 1000


def test_label_directory_split_and_errors(tmp_path):
    d = write_wav_dataset(tmp_path / "wavs", per_label=5)
    ds = sd.load_label_dir(d, sample_rate=16000, clip_samples=16000)
    assert ds.labels == ["high", "low", "mid"] and len(ds.y_train) == 12 and len(ds.y_test) == 3
    assert ds.x_train.shape == (12, 16000) and float(ds.x_train[:, 8000:].abs().max()) == 0  # 0.5 s, padded
    short = sd.load_label_dir(d, sample_rate=16000, clip_samples=4000)  # longer clips keep their loudest 0.25 s
    assert short.x_train.shape == (12, 4000) and float(short.x_train.abs().amax(1).min()) > 0.1
    (tmp_path / "none" / "x").mkdir(parents=True)
    (tmp_path / "none" / "y").mkdir()
    with pytest.raises(DataError, match=r"has 0 LABEL/\*.wav folder\(s\) \(x, y hold no .wav file\)"):
        sd.load_label_dir(tmp_path / "none", sample_rate=16000, clip_samples=16000)
    with pytest.raises(DataError, match="not a directory"):
        sd.load_label_dir(tmp_path / "missing", sample_rate=16000, clip_samples=16000)


@pytest.mark.skipif(sd.shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")
def test_real_synthesizer_builds_a_small_set(tmp_path):
    path = sd.synthesize_spoken_digits(tmp_path, seed=0, accents=("en-us",), variants=("m1", "f2"), per_voice=1,
                                       test_voices=1)
    ds = sd.load_spoken_digits(path)
    assert ds.name == "spoken-digits (espeak-ng)" and len(ds.y_train) == len(ds.y_test) == 10
    assert set(ds.test_voices) in ({"en-us+m1"}, {"en-us+f2"})
    assert float(ds.x_test.abs().amax(1).min()) > 0.05  # every clip holds a word


def test_clean_test_clips_are_the_noisy_sets_without_the_noise(tmp_path):
    noisy = sd.load_spoken_digits(sd.synthesize_spoken_digits(tmp_path, seed=3, **KW))
    clean = sd.load_spoken_digits(sd.synthesize_spoken_digits(tmp_path, seed=3, snr_db=None, only_test=True, **KW))
    assert len(clean.y_train) == 0 and clean.test_voices == noisy.test_voices
    assert clean.y_test.tolist() == noisy.y_test.tolist()
    word = clean.x_test.abs() > 0
    assert float((noisy.x_test - clean.x_test)[~word].abs().max()) > 0  # the noise, outside the word
    resid = (noisy.x_test - clean.x_test)[word]
    assert float(resid.pow(2).mean().sqrt()) < 0.2 * float(clean.x_test[word].pow(2).mean().sqrt())


def test_extra_voices_train_only_and_leave_the_test_alone(tmp_path):
    base = sd.load_spoken_digits(sd.synthesize_spoken_digits(tmp_path, seed=3, **KW))
    more = sd.load_spoken_digits(sd.synthesize_spoken_digits(tmp_path, seed=3, extra_voices=("d+m1", "d+f1"), **KW))
    assert len(more.y_train) == len(base.y_train) + 2 * 10 * 2
    assert more.test_voices == base.test_voices
    assert bool((more.x_test == base.x_test).all()) and bool((more.x_train[:len(base.y_train)] == base.x_train).all())
