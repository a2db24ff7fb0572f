"""Evaluation sets for the spoken-digit model beyond its held-out espeak-ng voices.

:func:`evaluation_sets` returns, by name (the recipe writes ``test_accuracy_<name>``):

- ``other_synth``: the ten digits from Flite and Festival voices (:mod:`tokennet.data.other_speech`),
  a synthesizer never used in training; clean.
- ``<noise>_<snr>db`` for noise in ``white``, ``pink``, ``babble`` and SNR in 20, 10, 0 dB: the held-out
  espeak-ng voices' clips, synthesized *clean* (the same clips as the test split, without its white
  noise: :func:`~tokennet.data.spoken_digits.synthesize_spoken_digits` with ``snr_db=None,
  only_test=True``), then mixed with the noise at exactly that SNR (:func:`~tokennet.data.noise.mix_at_snr`:
  active speech power over noise power). Babble is made of :data:`~tokennet.data.noise.BABBLE_WORDS` (no
  digits; disjoint from the words training may mix in) spoken by espeak-ng voices, six talkers at once.
- ``clean``: the clean held-out clips themselves.

Every noise is drawn from a generator seeded by ``(seed, noise, snr)``, so the sets are the same in every
run and in ``tokennet eval``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..errors import DataError
from ..tokens.audio import resample
from .noise import BABBLE_TRAIN_WORDS, BABBLE_WORDS, NOISES, babble_noise, mix_at_snr, pink_noise, white_noise
from .spoken_digits import (
    ACCENTS,
    VARIANTS,
    _save_npz,
    _trim,
    cache_dir,
    espeak_synth,
    load_spoken_digits,
    synthesize_spoken_digits,
)

__all__ = ["SNRS", "word_bank", "training_word_bank", "noise_like", "noisy_copy", "evaluation_sets", "EvalSet"]

log = logging.getLogger(__name__)

SNRS = (20, 10, 0)
EvalSet = tuple[Tensor, Tensor, list[str]]  # waveforms (N, samples), labels (N,), voice per clip


def word_bank(words: tuple[str, ...] = BABBLE_WORDS, *, seed: int = 0, voices_per_word: int = 4,
              sample_rate: int = 16000, root: str | Path | None = None) -> list[np.ndarray]:
    """``words`` spoken by ``voices_per_word`` random espeak-ng voices each (trimmed, at ``sample_rate``);
    cached. The material of babble noise."""
    params = {"words": list(words), "seed": seed, "voices_per_word": voices_per_word, "sample_rate": sample_rate}
    key = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]
    root = cache_dir() if root is None else Path(root)
    path = root / f"word-bank-{key}.npz"
    if not path.is_file():
        rng = np.random.default_rng(seed)
        voices = [f"{accent}+{variant}" for accent in ACCENTS for variant in VARIANTS]
        out = []
        for word in words:
            for voice_idx in rng.choice(len(voices), size=voices_per_word, replace=False):
                x, rate = espeak_synth(word, voices[int(voice_idx)], int(rng.integers(130, 201)),
                                       int(rng.integers(25, 76)))
                out.append(resample(_trim(x.astype(np.float32) / 32768.0), rate, sample_rate))
        root.mkdir(parents=True, exist_ok=True)
        _save_npz(path, samples=np.concatenate(out), lengths=np.array([len(x) for x in out]))
    with np.load(path) as archive:
        samples, lengths = archive["samples"], archive["lengths"]
    return np.split(samples, np.cumsum(lengths)[:-1])


def noise_like(kind: str, n: int, rng: np.random.Generator, words: list[np.ndarray] | None = None,
               sample_rate: int = 16000) -> np.ndarray:
    """``n`` samples of ``white``, ``pink`` or ``babble`` noise (``words``: the babble's word bank), unit RMS."""
    if kind == "white":
        return white_noise(n, rng)
    if kind == "pink":
        return pink_noise(n, rng)
    if kind == "babble":
        if not words:
            raise DataError("babble noise needs a word bank (word_bank())")
        return babble_noise(n, words, rng, sample_rate=sample_rate)
    raise DataError(f"noise must be one of {list(NOISES)}, got {kind!r}")


def noisy_copy(x: Tensor, kind: str, snr_db: float, seed: int, *, words: list[np.ndarray] | None = None,
               sample_rate: int = 16000) -> Tensor:
    """Each clip of ``x`` ``(N, samples)`` with its own ``kind`` noise at ``snr_db`` (seeded per clip)."""
    out = torch.empty_like(x)
    for i, clip in enumerate(x.numpy()):
        rng = np.random.default_rng([seed, NOISES.index(kind), int(snr_db * 10) + 1000, i])
        out[i] = torch.from_numpy(mix_at_snr(clip, noise_like(kind, len(clip), rng, words, sample_rate), snr_db,
                                             sample_rate))
    return out


def evaluation_sets(*, seed: int = 0, per_voice: int = 3, test_voices: int = 20, snrs=SNRS, noises=NOISES,
                    other: bool = True) -> dict[str, EvalSet]:
    """The named evaluation sets of the module docstring (synthesized once, then cached)."""
    clean = load_spoken_digits(synthesize_spoken_digits(seed=seed, per_voice=per_voice, test_voices=test_voices,
                                                        snr_db=None, only_test=True))
    sets: dict[str, EvalSet] = {"clean": (clean.x_test, clean.y_test, clean.test_voices)}
    words = word_bank(BABBLE_WORDS, seed=seed) if "babble" in noises else None
    for kind in noises:
        for snr in snrs:
            sets[f"{kind}_{snr}db"] = (noisy_copy(clean.x_test, kind, snr, seed, words=words), clean.y_test,
                                       clean.test_voices)
    if other:
        from .other_speech import load_other_digits, synthesize_other_digits

        other_set = load_other_digits(synthesize_other_digits(seed=seed, per_voice=per_voice))
        sets["other_synth"] = (other_set.x_test, other_set.y_test, other_set.test_voices)
    return sets


def training_word_bank(seed: int = 0) -> list[np.ndarray]:
    """The babble material training may mix in (:data:`~tokennet.data.noise.BABBLE_TRAIN_WORDS`)."""
    return word_bank(BABBLE_TRAIN_WORDS, seed=seed + 1)
