"""Audio tokens: the mel scale against its formula, the filterbank, the STFT against Parseval, files."""

import math

import numpy as np
import pytest
import torch
from scipy.io import wavfile

from tokennet.errors import DataError
from tokennet.tokens.audio import (
    LogMelSpectrogram,
    hz_to_mel,
    load_audio,
    mel_filterbank,
    mel_to_hz,
    power_spectrogram,
    read_audio,
    resample,
    spectrogram_patches,
)
from tokennet.tokens.image import patchify


def test_htk_mel_formula_and_known_values():
    # HTK: mel(f) = 2595 log10(1 + f/700); 1000 Hz is ≈ 1000 mel by construction of the scale.
    assert hz_to_mel(1000.0) == pytest.approx(999.9855, abs=1e-3)
    assert hz_to_mel(700.0) == pytest.approx(2595 * math.log10(2))
    f = np.array([0.0, 55.0, 440.0, 4000.0, 8000.0])
    np.testing.assert_allclose(mel_to_hz(hz_to_mel(f)), f, atol=1e-6)


def test_slaney_mel_known_values():
    # Slaney: linear 3 mels per 200 Hz below 1 kHz (1000 Hz = 15 mel), logarithmic above (librosa's values).
    assert float(hz_to_mel(np.array(1000.0), "slaney")) == pytest.approx(15.0)
    assert float(hz_to_mel(np.array(200.0), "slaney")) == pytest.approx(3.0)
    assert float(hz_to_mel(np.array(6400.0), "slaney")) == pytest.approx(15.0 + 27.0)
    f = np.array([10.0, 500.0, 1500.0, 7000.0])
    np.testing.assert_allclose(mel_to_hz(hz_to_mel(f, "slaney"), "slaney"), f, rtol=1e-9)


@pytest.mark.parametrize("scale", ["htk", "slaney"])
def test_filterbank_triangles_peak_at_their_centres(scale):
    sr, n_fft, n_mels = 16000, 512, 20
    fb = mel_filterbank(n_fft // 2 + 1, n_mels, sr, scale=scale)  # (F, mels)
    assert fb.shape == (257, n_mels) and (fb >= 0).all() and fb.max() <= 1 + 1e-6
    edges = mel_to_hz(np.linspace(hz_to_mel(0.0, scale), hz_to_mel(sr / 2, scale), n_mels + 2), scale)
    bin_hz = sr / n_fft
    for m in range(n_mels):
        peak = int(fb[:, m].argmax())
        assert abs(peak * bin_hz - edges[m + 1]) <= bin_hz  # the nearest bin to the centre frequency
        outside = [k for k in range(257) if not edges[m] < k * bin_hz < edges[m + 2]]
        assert fb[outside, m].abs().max() == 0  # zero outside (edge m, edge m + 2)


def test_filterbank_matches_torchaudio_htk_formula_by_hand():
    # One filter evaluated by hand: bin f between edges lo < mid < hi weighs min((f-lo)/(mid-lo), (hi-f)/(hi-mid)).
    sr, n_fft, n_mels = 8000, 256, 8
    fb = mel_filterbank(n_fft // 2 + 1, n_mels, sr)
    mels = np.linspace(0, 2595 * np.log10(1 + 4000 / 700), n_mels + 2)
    hz = 700 * (10 ** (mels / 2595) - 1)
    k = 20
    f = k * sr / n_fft
    m = int(np.searchsorted(hz, f)) - 1  # f in (hz[m], hz[m+1]]: rising edge of filter m, falling of m - 1
    want = (f - hz[m]) / (hz[m + 1] - hz[m])
    assert float(fb[k, m]) == pytest.approx(want, rel=1e-5)


def test_pure_tone_lands_in_its_mel_bin():
    sr, n_mels = 16000, 40
    spec = LogMelSpectrogram(sr, n_fft=400, hop_length=160, n_mels=n_mels)
    edges = mel_to_hz(np.linspace(0, hz_to_mel(sr / 2), n_mels + 2))
    t = torch.arange(sr) / sr
    for f in (300.0, 1000.0, 3000.0, 6000.0):
        s = spec(torch.sin(2 * math.pi * f * t)[None])  # (1, mels, frames)
        assert s.shape == (1, n_mels, 101)
        loudest = int(s[0, :, 50].argmax())
        assert edges[loudest] < f < edges[loudest + 2]  # the tone lies inside the loudest filter's triangle
        assert abs(hz_to_mel(f) - hz_to_mel(edges[loudest + 1])) <= (hz_to_mel(edges[2]) - hz_to_mel(edges[1]))


def test_stft_energy_is_parseval_times_the_window():
    # For white noise the frames' expected energy: Σ_f |X_f|² (one-sided, doubled except DC/Nyquist) = N Σ_n x_n² w_n².
    torch.manual_seed(0)
    n_fft, hop = 256, 64
    x = torch.randn(1, 64000, dtype=torch.float64)
    p = power_spectrogram(x, n_fft, hop)  # (1, F, T)
    two_sided = 2 * p.sum(1) - p[:, 0] - p[:, -1]  # (1, T): Σ over all N bins of |X|²
    w = torch.hann_window(n_fft, dtype=torch.float64)
    frames = x[0, : (64000 - n_fft) // hop * hop + n_fft].unfold(0, n_fft, hop)  # frames without the padded ends
    direct = n_fft * (frames ** 2 * w ** 2).sum(1)  # Parseval: Σ_k |X_k|² = N Σ_n |x_n w_n|²
    # centre=True shifts frame t to start at t·hop − n_fft/2: frame t + 2 (hop = n_fft/4) starts at t·hop.
    torch.testing.assert_close(two_sided[0, 2:2 + len(direct)], direct, rtol=1e-9, atol=1e-9)
    # and on average the energy is N Σ w² σ² (the window's energy).
    assert float(two_sided[0, 10:-10].mean()) == pytest.approx(n_fft * float((w ** 2).sum()), rel=0.05)


def test_spectrogram_patches_use_patchify_with_overlap():
    s = torch.randn(2, 16, 30)
    p = spectrogram_patches(s, 8, stride=(4, 2))  # grid (16-8)/4+1 = 3 by (30-8)/2+1 = 12
    assert p.shape == (2, 36, 64)
    torch.testing.assert_close(p, patchify(s[:, None], 8, (4, 2)))
    torch.testing.assert_close(p[0, 13], s[0, 4:12, 2:10].flatten())  # row 1, column 1


def _write(path, rate, data):
    wavfile.write(path, rate, data)
    return path


@pytest.mark.parametrize("dtype,scale", [(np.int16, 2**15), (np.int32, 2**31), (np.float32, 1.0)])
def test_read_audio_normalizes_formats(tmp_path, dtype, scale):
    x = np.array([0, 0.5, -1.0, 0.25])
    a = (x * (scale - 1 if scale > 1 else 1)).astype(dtype)
    y, rate = read_audio(_write(tmp_path / "a.wav", 8000, a))
    assert rate == 8000 and y.dtype == np.float32
    np.testing.assert_allclose(y, x, atol=1e-4)


def test_stereo_to_mono_and_resampling(tmp_path):
    sr = 8000
    t = np.arange(sr) / sr
    tone = 0.5 * np.sin(2 * np.pi * 440 * t)
    path = _write(tmp_path / "s.wav", sr, np.stack([tone, tone * 0.0], 1).astype(np.float32))
    y = load_audio(path, 16000)
    assert y.shape == (16000,)
    f = np.abs(np.fft.rfft(y)).argmax() * 16000 / len(y)
    assert f == pytest.approx(440, abs=1)
    assert np.abs(y).max() == pytest.approx(0.25, rel=0.02)  # the mean of the two channels
    with pytest.raises(DataError, match="positive integer"):
        resample(y, 0, 16000)


def test_bad_files(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        read_audio(tmp_path / "nope.wav")
    (tmp_path / "empty.wav").write_bytes(b"")
    with pytest.raises(DataError, match="empty"):
        read_audio(tmp_path / "empty.wav")
    good = _write(tmp_path / "g.wav", 8000, (np.random.default_rng(0).standard_normal(800) * 1000).astype(np.int16))
    (tmp_path / "cut.wav").write_bytes(good.read_bytes()[:30])
    with pytest.raises(DataError):
        read_audio(tmp_path / "cut.wav")
    (tmp_path / "text.wav").write_text("hello, not audio " * 20)
    with pytest.raises(DataError):
        read_audio(tmp_path / "text.wav")
    silent = _write(tmp_path / "silent.wav", 8000, np.zeros(800, np.int16))
    with pytest.raises(DataError, match="silence"):
        load_audio(silent, 8000)
    with pytest.raises(DataError, match="longer than the model's maximum"):
        load_audio(good, 8000, max_samples=400)


def test_top_db_floors_digital_silence():
    sr = 16000
    t = torch.arange(sr // 2) / sr
    wave = torch.cat([torch.sin(2 * math.pi * 440 * t), torch.zeros(sr // 2)])[None]  # a tone, then zeros
    raw = LogMelSpectrogram(sr, n_mels=20)(wave)
    floored = LogMelSpectrogram(sr, n_mels=20, top_db=60.0)(wave)
    assert float(raw.max() - raw.min()) > 60 * math.log(10) / 10  # log ε: far more than 60 dB down
    assert float(floored.max() - floored.min()) == pytest.approx(60 * math.log(10) / 10, rel=1e-5)
    loud = raw >= raw.max() - 6 * math.log(10)
    torch.testing.assert_close(floored[loud], raw[loud])  # what is above the floor is unchanged


@pytest.mark.parametrize("fmt, subtype, tol", [("FLAC", "PCM_16", 1 / 32767), ("OGG", "VORBIS", 0.05)])
def test_flac_and_ogg_read_through_soundfile(tmp_path, fmt, subtype, tol):
    sf = pytest.importorskip("soundfile")
    from tokennet.tokens.audio import read_audio

    rate = 16000
    t = np.arange(rate // 4) / rate
    tone = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    path = tmp_path / f"tone.{fmt.lower()}"
    sf.write(str(path), np.stack([tone, tone], axis=1), rate, format=fmt, subtype=subtype)  # stereo
    got, got_rate = read_audio(path)
    assert got_rate == rate and got.shape[0] == len(tone)
    mono = got.mean(axis=1) if got.ndim == 2 else got
    assert np.abs(mono - tone).max() <= tol  # lossless FLAC: one 16-bit step; Vorbis: lossy
    bad = tmp_path / f"broken.{fmt.lower()}"
    bad.write_bytes(path.read_bytes()[:40])
    with pytest.raises(DataError, match="not a readable audio file"):
        read_audio(bad)
