"""Noise for speech: pink is 1/f, every noise has unit RMS, and the mix is at the SNR asked for, measured on the
active speech (so the silence around a word does not change it)."""

import numpy as np
import pytest

from tokennet.data.noise import active_power, babble_noise, mix_at_snr, pink_noise, white_noise
from tokennet.errors import DataError

SR = 16000


def _band_power(x, lo, hi):
    spec = np.abs(np.fft.rfft(x)) ** 2
    f = np.fft.rfftfreq(len(x), 1 / SR)
    return spec[(f >= lo) & (f < hi)].sum()


def test_pink_noise_has_equal_power_per_octave_and_white_doubles():
    rng = np.random.default_rng(0)
    pink, white = pink_noise(8 * SR, rng), white_noise(8 * SR, rng)
    for x in (pink, white):
        assert np.sqrt(np.mean(x.astype(np.float64) ** 2)) == pytest.approx(1.0, rel=0.02)
    octaves = [(100 * 2**k, 200 * 2**k) for k in range(5)]  # 100 Hz .. 3.2 kHz
    p = np.array([_band_power(pink, lo, hi) for lo, hi in octaves])
    w = np.array([_band_power(white, lo, hi) for lo, hi in octaves])
    np.testing.assert_allclose(p / p.mean(), 1.0, atol=0.15)  # 1/f: the same power in every octave
    np.testing.assert_allclose(w[1:] / w[:-1], 2.0, rtol=0.15)  # flat: twice the power an octave up


def _word(before=0.5, after=0.5):
    t = np.arange(int(0.4 * SR)) / SR
    w = 0.5 * np.sin(2 * np.pi * 300 * t) * np.hanning(len(t))
    return np.concatenate([np.zeros(int(before * SR)), w, np.zeros(int(after * SR))]).astype(np.float32)


@pytest.mark.parametrize("snr", [20.0, 10.0, 0.0])
def test_mix_is_at_the_snr_of_the_active_speech(snr):
    speech = _word()
    noise = white_noise(len(speech), np.random.default_rng(1))
    mixed = mix_at_snr(speech, noise, snr, SR)
    added = (mixed - speech).astype(np.float64)
    assert 10 * np.log10(active_power(speech, SR) / np.mean(added**2)) == pytest.approx(snr, abs=0.05)


def test_active_power_ignores_the_silence_around_the_word():
    assert active_power(_word(0.1, 0.1), SR) == pytest.approx(active_power(_word(2.0, 1.5), SR), rel=0.02)


def test_babble_is_unit_rms_and_made_of_the_words():
    rng = np.random.default_rng(2)
    words = [np.sin(np.arange(4000) * f).astype(np.float32) for f in (0.05, 0.11, 0.23)]
    b = babble_noise(2 * SR, words, rng, talkers=4)
    assert b.shape == (2 * SR,) and np.sqrt(np.mean(b.astype(np.float64) ** 2)) == pytest.approx(1.0, rel=1e-3)
    assert (np.abs(b.reshape(-1, 800)).max(1) > 0).mean() > 0.9  # talkers overlap: hardly a gap anywhere
    with pytest.raises(DataError, match="at least one word"):
        babble_noise(100, [], rng)
    with pytest.raises(DataError, match="shorter"):
        mix_at_snr(np.ones(10, np.float32), np.ones(5, np.float32), 10.0, SR)


def test_noisy_copy_is_seeded_and_at_the_snr():
    import torch

    from tokennet.data.speech_eval import noisy_copy

    x = torch.from_numpy(np.stack([_word(), 0.3 * _word(0.2, 0.8)]))
    a, b = noisy_copy(x, "pink", 10.0, seed=0), noisy_copy(x, "pink", 10.0, seed=0)
    assert torch.equal(a, b) and not torch.equal(a, noisy_copy(x, "pink", 10.0, seed=1))
    for i in range(2):
        added = (a[i] - x[i]).double().numpy()
        snr = 10 * np.log10(active_power(x[i].numpy(), SR) / np.mean(added**2))
        assert snr == pytest.approx(10.0, abs=0.05)
