"""Wave augmentation: speed perturbation plays the clip faster or slower at the same length; noise goes in at its
SNR; batches through ImageBatches are a pure function of the index."""

import numpy as np
import pytest
import torch

from tokennet.data.audio_augment import WaveAugment, WaveFeatures, speed_perturb
from tokennet.data.image_batches import ImageBatches

SR = 16000


def _peak_hz(x):
    spec = np.abs(np.fft.rfft(x.numpy()))
    return float(np.fft.rfftfreq(len(x), 1 / SR)[spec.argmax()])


def test_speed_perturbation_moves_the_pitch_and_keeps_the_length():
    t = torch.arange(SR) / SR
    tone = torch.zeros(SR)
    tone[4000:12000] = torch.sin(2 * torch.pi * 440 * t[4000:12000])
    torch.testing.assert_close(speed_perturb(tone, 1.0), tone)
    fast, slow = speed_perturb(tone, 1.25), speed_perturb(tone, 0.8)
    assert fast.shape == slow.shape == (SR,)
    assert _peak_hz(fast) == pytest.approx(550, abs=3) and _peak_hz(slow) == pytest.approx(352, abs=3)
    assert float(slow.abs().max()) > 0.99  # the slowed word (10000 samples) is kept whole in the window
    assert (fast[int(SR / 1.25) + 1:] == 0).all()  # sped up: zero-padded at the end


def test_wave_features_in_image_batches_are_deterministic_and_noisy_at_the_snr():
    g = torch.Generator().manual_seed(0)
    waves = torch.zeros(16, SR)
    waves[:, 4000:8000] = 0.5 * torch.sin(torch.arange(4000) * 0.2) * torch.rand(16, 1, generator=g)
    labels = torch.arange(16) % 4
    aug = WaveAugment(speed=(0.9, 1.1), noises=("white", "pink"), noise_prob=1.0, noise_snr=(10.0, 10.0))
    feats = WaveFeatures(aug, lambda w: w)  # identity features: see the waveforms themselves
    src = ImageBatches(waves, labels, 8, seed=3, augment=feats, num_classes=4)
    (a, ya), (b, yb) = src.batch(5), src.batch(5)
    torch.testing.assert_close(a, b)
    assert torch.equal(ya, yb)
    plain = ImageBatches(waves, labels, 8, seed=3, num_classes=4).batch(5)[1]
    assert torch.equal(ya, plain)  # the same clips as without augmentation
    assert not torch.equal(src.batch(6)[0], a)
    quiet = a[:, :3000]  # before the word: the noise alone
    assert float(quiet.abs().max()) > 0
    with pytest.raises(ValueError, match="word bank"):
        WaveFeatures(WaveAugment(noises=("babble",)), lambda w: w)
    with pytest.raises(ValueError, match="noises must be"):
        WaveAugment(noises=("brown",))


def test_equalize_and_lowpass_shape_the_spectrum():
    from tokennet.data.audio_augment import equalize, lowpass

    x = torch.from_numpy(np.random.default_rng(0).standard_normal(SR)).float()

    def band(y, lo, hi):
        spec = np.abs(np.fft.rfft(y.numpy())) ** 2
        f = np.fft.rfftfreq(SR, 1 / SR)
        return spec[(f >= lo) & (f < hi)].sum()

    tilted = equalize(x, 6.0, 0.0, 1000.0, SR)  # +6 dB per octave around 1 kHz
    ratio = 10 * np.log10((band(tilted, 3600, 4400) / band(x, 3600, 4400)))
    assert ratio == pytest.approx(12.0, abs=1.0)  # two octaves above 1 kHz
    torch.testing.assert_close(equalize(x, 0.0, 0.0, 1000.0, SR), x, atol=1e-5, rtol=0)
    low = lowpass(x, 3000.0, SR)
    assert band(low, 3100, 8000) < 1e-12 * band(x, 3100, 8000)
    assert band(low, 100, 2600) == pytest.approx(band(x, 100, 2600), rel=1e-6)


def _vowel(f0=120.0, seconds=0.5):
    """A pulse train at f0 through two formant resonators (700 Hz, 1200 Hz): a crude /a/."""
    from scipy.signal import lfilter

    n = int(seconds * SR)
    src = np.zeros(n)
    src[::int(SR / f0)] = 1.0
    y = src
    for f, bw in ((700.0, 90.0), (1200.0, 110.0)):
        r = np.exp(-np.pi * bw / SR)
        y = lfilter([1.0], [1.0, -2 * r * np.cos(2 * np.pi * f / SR), r * r], y)
    return torch.from_numpy(0.5 * y / np.abs(y).max()).float()


def test_lpc_resynthesis_keeps_the_envelope_and_takes_the_new_pitch():
    from tokennet.data.audio_augment import lpc_resynthesize

    x = torch.stack([_vowel(), torch.zeros(SR // 2)])
    y = lpc_resynthesize(x, SR, torch.tensor([200.0, 150.0]), torch.Generator().manual_seed(0))
    assert y.shape == x.shape and torch.isfinite(y).all() and (y[1] == 0).all()  # silence stays silence
    assert float(y[0].abs().max()) == pytest.approx(float(x[0].abs().max()), rel=1e-5)  # the peak level kept
    mid = y[0, 2000:6000].double().numpy()
    ac = np.correlate(mid, mid, "full")[len(mid) - 1:]
    lag = 40 + int(np.argmax(ac[40:200]))  # 80–400 Hz
    assert SR / lag == pytest.approx(200.0, rel=0.03)  # the new pitch (the input's was 120 Hz)
    spec_x = np.abs(np.fft.rfft(x[0, 2000:6000].numpy() * np.hanning(4000)))
    spec_y = np.abs(np.fft.rfft(mid * np.hanning(4000)))
    f = np.fft.rfftfreq(4000, 1 / SR)

    def envelope(spec):  # the largest harmonic in each 200-Hz band up to 3 kHz, in dB
        return np.array([20 * np.log10(spec[(f >= lo) & (f < lo + 200)].max()) for lo in range(400, 3000, 200)])

    ex, ey = envelope(spec_x), envelope(spec_y)
    assert np.corrcoef(ex, ey)[0, 1] > 0.9  # the formants stay where they were
