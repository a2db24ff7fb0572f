"""What a cold ``tokennet train audio`` must synthesize before its first step, counted without synthesizing, and
timed on a few clips: the estimate a time budget is checked against at the start."""

import numpy as np
import pytest

from tokennet.data.spoken_digits import (
    ACCENTS,
    EXTRA_VOICES,
    VARIANTS,
    _cache_entry,
    clips_to_synthesize,
    seconds_per_clip,
    synthesize_spoken_digits,
)
from tokennet.recipes import get_recipe


@pytest.fixture(autouse=True)
def cold(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENNET_CACHE", str(tmp_path / "cache"))


def _tone(word, voice, rate, pitch):  # noqa: ARG001 - a stand-in synthesizer: no espeak-ng needed
    return (np.sin(np.arange(4000) * 0.05) * 0.5).astype(np.float32), 16000


def test_counts_each_set_and_nothing_once_cached(tmp_path):
    voices = len(ACCENTS) * len(VARIANTS)
    assert clips_to_synthesize() == voices * 10 * 3
    assert clips_to_synthesize(snr_db=None, only_test=True) == 20 * 10 * 3
    assert clips_to_synthesize(snr_db=None, extra_voices=EXTRA_VOICES) == (voices + len(EXTRA_VOICES)) * 10 * 3
    small = {"per_voice": 1, "test_voices": 2, "accents": ACCENTS[:1], "variants": VARIANTS[:3]}
    synthesize_spoken_digits(synth=_tone, **small)  # a custom synthesizer's set is another file
    assert clips_to_synthesize() == voices * 10 * 3
    _, path = _cache_entry(None, seed=0, per_voice=3, test_voices=20, sample_rate=16000, clip_samples=16000,
                           snr_db=(5.0, 30.0), voices=[f"{a}+{v}" for a in ACCENTS for v in VARIANTS],
                           synth="espeak_synth", only_test=False, extra_voices=())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()  # the default set, as synthesize_spoken_digits caches it
    assert clips_to_synthesize() == 0


def test_the_recipe_estimates_from_timed_clips(monkeypatch):
    recipe = get_recipe("audio")
    settings = recipe.defaults()
    spec = recipe.data_spec(None, settings)
    monkeypatch.setattr("tokennet.recipes.audio.seconds_per_clip", lambda probes: 0.01)
    prep = recipe.preparation(spec, settings)
    clips = clips_to_synthesize() + clips_to_synthesize(snr_db=None, extra_voices=EXTRA_VOICES) \
        + clips_to_synthesize(snr_db=None, only_test=True)
    assert prep.what == f"synthesizing {clips:,} clips with espeak-ng"
    assert prep.seconds == pytest.approx(clips * 0.01 / 2)
    assert recipe.preparation(recipe.data_spec("/some/dir", settings), settings) is None  # a user's directory


def test_seconds_per_clip_times_the_synthesizer():
    assert 0 <= seconds_per_clip(2, synth=_tone) < 1.0
