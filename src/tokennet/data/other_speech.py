"""Spoken digits from synthesizers other than espeak-ng: voices a model trained on espeak-ng never heard.

The generated training set (:mod:`tokennet.data.spoken_digits`) holds out whole espeak-ng voices, but every
voice, held out or not, comes from the same formant synthesizer: the held-out test asks little. Two other
offline synthesizers install from Debian, with voices built from recordings of real speakers:

- **Flite** (``apt-get install flite``), CMU's small engine: voices ``kal`` (8 kHz diphone), ``kal16``
  (16 kHz diphone), ``awb``, ``rms``, ``slt`` (clustergen statistical voices of a Scottish male, an
  American male and an American female speaker).
- **Festival** (``apt-get install festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts``):
  ``kal_diphone``, ``ked_diphone`` (two American male diphone voices) and ``cmu_us_slt_arctic_hts``
  (an HMM voice of the ``slt`` speaker).

Flite's ``kal16``/``slt`` and Festival's ``kal_diphone``/``slt_hts`` share speakers, so both engines are
*evaluation only*: none of their voices may be used in training. Each voice speaks each digit
``per_voice`` times at a random duration stretch U(0.8, 1.25); the clips are made exactly as the
generated set's (:func:`~tokennet.data.spoken_digits._clip`: the word trimmed, resampled to 16 kHz, at a
random place and level in a 1-s clip) but clean, without added noise. Cached like the generated set.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import torch

from .. import jsonio
from ..errors import DataError
from ..tokens.audio import read_audio
from .spoken_digits import DIGITS, AudioSet, _clip, _save_npz, cache_dir

__all__ = ["FLITE_VOICES", "FESTIVAL_VOICES", "OTHER_VOICES", "flite_synth", "festival_synth_many",
           "available_other_voices", "synthesize_other_digits", "load_other_digits"]

log = logging.getLogger(__name__)

FLITE_VOICES = ("kal", "kal16", "awb", "rms", "slt")
FESTIVAL_VOICES = ("kal_diphone", "ked_diphone", "cmu_us_slt_arctic_hts")
OTHER_VOICES = tuple(f"flite:{v}" for v in FLITE_VOICES) + tuple(f"festival:{v}" for v in FESTIVAL_VOICES)
FORMAT_VERSION = 1


def flite_synth(word: str, voice: str, stretch: float = 1.0) -> tuple[np.ndarray, int]:
    """``flite -voice VOICE --setf duration_stretch=S -t WORD``: ``(int16 samples, rate)``."""
    exe = shutil.which("flite")
    if exe is None:
        raise DataError("flite is not installed: apt-get install flite")
    with tempfile.TemporaryDirectory() as tmp_dir:
        out = Path(tmp_dir) / "w.wav"
        proc = subprocess.run([exe, "-voice", voice, "--setf", f"duration_stretch={stretch:.3f}", "-t", word,
                            "-o", str(out)], capture_output=True, timeout=60)
        if proc.returncode != 0 or not out.is_file():
            raise DataError(f"flite -voice {voice} failed: {proc.stderr.decode(errors='replace').strip()[:200]}")
        x, rate = read_audio(out)
    return np.round(x * 32767).astype(np.int16), rate


def festival_synth_many(words: list[str], voice: str, stretches: list[float]) -> list[tuple[np.ndarray, int]]:
    """Speak ``words[i]`` at ``stretches[i]`` with Festival's ``voice_VOICE``, all in one festival process."""
    exe = shutil.which("festival")
    if exe is None:
        raise DataError("festival is not installed: apt-get install festival festvox-kallpc16k")
    with tempfile.TemporaryDirectory() as tmp_dir:
        lines = [f"(voice_{voice})"]
        for i, (word, stretch) in enumerate(zip(words, stretches, strict=True)):
            lines.append(f"(Parameter.set 'Duration_Stretch {stretch:.3f}) (set! utt (Utterance Text \"{word}\")) "
                         f"(utt.synth utt) (utt.save.wave utt \"{tmp_dir}/{i}.wav\" 'riff)")
        proc = subprocess.run([exe, "--pipe"], input="\n".join(lines).encode(), capture_output=True, timeout=600)
        out = []
        for i in range(len(words)):
            wav = Path(tmp_dir) / f"{i}.wav"
            if not wav.is_file():
                raise DataError(f"festival voice_{voice} failed: "
                                f"{(proc.stderr or proc.stdout).decode(errors='replace').strip()[:200]}")
            x, rate = read_audio(wav)
            out.append((np.round(x * 32767).astype(np.int16), rate))
    return out


def available_other_voices() -> list[str]:
    """The :data:`OTHER_VOICES` that speak on this machine (each tried once with a short word)."""
    ok = []
    for voice in OTHER_VOICES:
        engine, name = voice.split(":")
        try:
            (flite_synth("one", name) if engine == "flite" else festival_synth_many(["one"], name, [1.0])[0])
            ok.append(voice)
        except DataError:
            continue
    return ok


def synthesize_other_digits(root: str | Path | None = None, *, seed: int = 0, per_voice: int = 3,
                            voices: tuple[str, ...] = OTHER_VOICES, sample_rate: int = 16000,
                            clip_samples: int = 16000) -> Path:
    """Generate (or find in the cache) the other synthesizers' digits; the ``.npz`` path (module docstring)."""
    params = {"version": FORMAT_VERSION, "seed": seed, "per_voice": per_voice, "voices": list(voices),
              "sample_rate": sample_rate, "clip_samples": clip_samples}
    key = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]
    root = cache_dir() if root is None else Path(root)
    path = root / f"other-digits-{key}.npz"
    if path.is_file():
        return path
    rng = np.random.default_rng(seed)
    jobs = [(voice_idx, digit, float(rng.uniform(0.8, 1.25)))
            for voice_idx in range(len(voices)) for digit in range(len(DIGITS))
            for _ in range(per_voice)]
    log.info("synthesizing %d clips with %d flite/festival voices (once; cached in %s)", len(jobs), len(voices), root)
    words: list[tuple[np.ndarray, int] | None] = [None] * len(jobs)
    for voice_idx, voice in enumerate(voices):
        engine, name = voice.split(":")
        mine = [i for i, job in enumerate(jobs) if job[0] == voice_idx]
        if engine == "flite":
            for i in mine:
                words[i] = flite_synth(DIGITS[jobs[i][1]], name, jobs[i][2])
        elif engine == "festival":
            got = festival_synth_many([DIGITS[jobs[i][1]] for i in mine], name, [jobs[i][2] for i in mine])
            for i, spoken in zip(mine, got, strict=True):
                words[i] = spoken
        else:
            raise DataError(f"unknown synthesizer {engine!r} in voice {voice!r} (flite:NAME or festival:NAME)")
    clips = np.zeros((len(jobs), clip_samples), np.int16)
    for i, (samples, rate) in enumerate(words):
        clip = _clip(samples, rate, sample_rate=sample_rate, clip_samples=clip_samples,
                     rng=np.random.default_rng([seed, i]), snr_db=None)
        clips[i] = np.round(clip * 32767).astype(np.int16)
    root.mkdir(parents=True, exist_ok=True)
    _save_npz(path, clips=clips, digit=np.array([job[1] for job in jobs], np.int64),
              voice=np.array([job[0] for job in jobs], np.int64), voices=np.array(list(voices)),
              params=np.array(json.dumps(params)))
    return path


def load_other_digits(path: str | Path) -> AudioSet:
    """The cached clips as an :class:`AudioSet` with an empty training split (evaluation only)."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            clips, digit, voice, voices = (archive["clips"], archive["digit"], archive["voice"],
                                           archive["voices"].tolist())
            params = jsonio.loads(str(archive["params"]), what=f"{path}: params")
    except (OSError, ValueError, KeyError) as err:
        raise DataError(f"{path} is not a readable digits cache ({err}); delete it to regenerate") from None
    x = torch.from_numpy(clips.astype(np.float32) / 32767.0)
    return AudioSet(name="spoken digits (flite, festival)", labels=list(DIGITS), sample_rate=params["sample_rate"],
                    x_train=x[:0], y_train=torch.from_numpy(digit)[:0], x_test=x, y_test=torch.from_numpy(digit),
                    test_voices=[voices[v] for v in voice])
