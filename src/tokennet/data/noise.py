"""Background noise for speech at a chosen signal-to-noise ratio: white, pink, and babble.

- **white**: independent Gaussian samples, a flat spectrum.
- **pink**: power ∝ 1/f (−3 dB per octave), the spectrum of much natural background noise; white
  Gaussian noise shaped in the frequency domain, ``X(f) ← X(f) / √f`` (the DC bin set to 0).
- **babble**: several talkers at once, made of *other words* (no digits) spoken by the synthesizer;
  each talker is a stream of words with short random gaps, and the talkers are summed. The closest
  thing to a crowd that an offline generator can give.

Every noise is returned at unit RMS. :func:`mix_at_snr` scales it so that

    SNR = 10 log10(P_speech / P_noise) dB,

where ``P_speech`` is the *active* speech power — the mean power of the 10-ms frames within
:data:`~tokennet.tokens.clips.TRIM_DB` (40 dB) of the loudest frame, a simplified active speech level
(ITU-T P.56) that does not depend on how much silence surrounds the word — and ``P_noise`` the noise's
mean power over the clip.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import DataError
from ..tokens.clips import FRAME_SECONDS, TRIM_DB, frame_levels_db

__all__ = ["NOISES", "white_noise", "pink_noise", "babble_noise", "active_power", "mix_at_snr", "BABBLE_WORDS",
           "BABBLE_TRAIN_WORDS"]

NOISES = ("white", "pink", "babble")
# Words of the babble (no digit, nothing that sounds like one): the evaluation sets' ...
BABBLE_WORDS = ("water", "garden", "morning", "people", "yellow", "basket", "window", "paper", "river", "table",
                "music", "holiday", "station", "purple", "doctor", "button", "pocket", "summer", "kitchen", "bottle")
# ... and, disjoint from them, the words training may mix in (so that a test never hears a training babble word).
BABBLE_TRAIN_WORDS = ("apple", "monkey", "pencil", "orange", "tiger", "blanket", "castle", "forest", "island", "ladder",
                      "marble", "planet", "rabbit", "silver", "turtle", "velvet", "winter", "zebra", "candle", "dragon")


def white_noise(n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` samples of unit-variance white Gaussian noise, float32."""
    return rng.standard_normal(n).astype(np.float32)


def pink_noise(n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` samples of pink (1/f power) noise at unit RMS: white noise divided by √f in the frequency domain."""
    spec = np.fft.rfft(rng.standard_normal(n))
    freqs = np.arange(len(spec), dtype=np.float64)
    spec[1:] /= np.sqrt(freqs[1:])
    spec[0] = 0.0
    x = np.fft.irfft(spec, n)
    return (x / max(float(np.sqrt(np.mean(x**2))), 1e-12)).astype(np.float32)


def babble_noise(n: int, words: Sequence[np.ndarray], rng: np.random.Generator, *, talkers: int = 6,
                 sample_rate: int = 16000) -> np.ndarray:
    """``n`` samples of babble at unit RMS: ``talkers`` streams of random ``words`` (waveforms at
    ``sample_rate``, each scaled to unit peak) separated by gaps of U(0, 0.15) s, summed."""
    if not words:
        raise DataError("babble needs at least one word to speak")
    out = np.zeros(n, np.float64)
    for _ in range(talkers):
        pos = -int(rng.integers(0, sample_rate // 2))  # the stream starts mid-word
        gain = 10 ** rng.uniform(-0.3, 0.0)
        while pos < n:
            word = words[int(rng.integers(len(words)))]
            word = word / max(float(np.abs(word).max()), 1e-9)
            start, end = max(pos, 0), min(pos + len(word), n)
            if end > start:
                out[start:end] += gain * word[start - pos:end - pos]
            pos += len(word) + int(rng.integers(0, int(0.15 * sample_rate) + 1))
    return (out / max(float(np.sqrt(np.mean(out**2))), 1e-12)).astype(np.float32)


def active_power(x: np.ndarray, sample_rate: int, threshold_db: float = TRIM_DB) -> float:
    """Mean power of the 10-ms frames within ``threshold_db`` of the loudest frame (module docstring)."""
    frame = max(1, round(FRAME_SECONDS * sample_rate))
    level = frame_levels_db(x, frame)
    active = level >= level.max() - threshold_db
    return float(np.mean(10 ** (level[active] / 10)))


def mix_at_snr(speech: np.ndarray, noise: np.ndarray, snr_db: float, sample_rate: int) -> np.ndarray:
    """``speech + g · noise`` with ``g`` chosen so that the active speech power over the noise power is
    ``snr_db`` (module docstring); clipped to [−1, 1]. ``noise`` must be at least as long as ``speech``."""
    if len(noise) < len(speech):
        raise DataError(f"the noise ({len(noise)} samples) is shorter than the speech ({len(speech)})")
    noise = noise[:len(speech)].astype(np.float64)
    p_noise = float(np.mean(noise**2))
    if p_noise <= 0:
        raise DataError("the noise is all zeros")
    gain = np.sqrt(active_power(speech, sample_rate) / (p_noise * 10 ** (snr_db / 10)))
    return np.clip(speech + gain * noise, -1.0, 1.0).astype(np.float32)
