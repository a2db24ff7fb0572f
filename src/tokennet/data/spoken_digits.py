"""Spoken digits: the ten English digit words from a real speech synthesizer, or a directory of WAV files.

No spoken-digit corpus installs offline, but a speech synthesizer does: Debian's ``espeak-ng``
(``apt-get install espeak-ng``). :func:`synthesize_spoken_digits` speaks "zero" … "nine" with every
*voice* — an English accent (``en-gb``, ``en-us``, ``en-gb-scotland``, …) × a voice variant (``+m1`` …
``+m7``, ``+f1`` … ``+f5``, ``+croak``, ``+whisper``) — several times each at a random speaking rate and
pitch; trims the synthesizer's silence, shifts the word to a random place in a 1-s clip, resamples it
to 16 kHz (``scipy.signal.resample_poly``), scales it to a random level and adds white noise at a
random SNR. **Whole voices are held out**: the test set's voices are never heard in training, so the
test asks whether a model understands a digit spoken by a new voice.

The set is cached (``int16`` samples in one ``.npz``) under ``$TOKENNET_CACHE`` or ``~/.cache/tokennet``,
named by its generation parameters and seed: the same seed gives the same file, byte for byte.

:func:`load_label_dir` reads any user dataset instead: ``DIR/LABEL/*.wav`` (class names sorted), or
``DIR/train/LABEL/*.wav`` + ``DIR/test/LABEL/*.wav`` for a given split; without a given split a seeded
20% of each class is held out. Every clip is read as mono at the model's rate, its leading and trailing
silence trimmed, and a clip still longer than the model's window keeps its loudest window
(:func:`~tokennet.tokens.clips.load_fitted`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from .. import jsonio
from ..errors import DataError
from ..fileio import atomic_open
from ..progress import advance, phase
from ..tokens.audio import SILENCE, resample
from ..tokens.clips import load_fitted
from .spec import DataSpec, register_data

__all__ = ["AudioSet", "DIGITS", "ACCENTS", "VARIANTS", "EXTRA_VOICES", "synthesize_spoken_digits",
           "load_spoken_digits", "load_label_dir", "load_audio_dataset", "espeak_synth", "cache_dir", "DEFAULT_DATA",
           "SpokenWords"]

log = logging.getLogger(__name__)

DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
ACCENTS = ("en-gb", "en-us", "en-gb-scotland", "en-gb-x-gbclan", "en-gb-x-rp", "en-gb-x-gbcwmd", "en-029",
           "en-us-nyc")
VARIANTS = ("m1", "m2", "m3", "m4", "m5", "m6", "m7", "f1", "f2", "f3", "f4", "f5", "croak", "whisper")
# More espeak-ng voice variants, for training only (the held-out test voices are drawn from VARIANTS).
EXTRA_VARIANTS = ("Alex", "Andy", "Annie", "aunty", "belinda", "benjamin", "david", "ed", "edward", "Gene", "iven",
                  "john", "linda", "max", "Michael", "paul", "rob", "robert", "steph", "travis", "victor", "zac",
                  "anika", "grandma", "grandpa", "klatt", "klatt2", "klatt3", "m8", "norbert")
EXTRA_VOICES = tuple(f"{a}+{v}" for a in ACCENTS for v in EXTRA_VARIANTS)
ESPEAK_RATE = 22050  # espeak-ng's output rate
FORMAT_VERSION = 1
DEFAULT_DATA = "spoken-digits"


@dataclass
class AudioSet:
    """A labelled audio split: waveforms ``(N, clip_samples)`` at ``sample_rate``, zero-padded at the end."""

    name: str
    labels: list[str]
    sample_rate: int
    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    test_voices: list[str] = field(default_factory=list)  # per test clip (empty when unknown)

    @property
    def num_classes(self) -> int:
        return len(self.labels)


def cache_dir() -> Path:
    """Where generated data is cached: ``$TOKENNET_CACHE`` or ``~/.cache/tokennet``."""
    return Path(os.environ.get("TOKENNET_CACHE") or Path.home() / ".cache" / "tokennet")


def espeak_synth(word: str, voice: str, rate: int, pitch: int) -> tuple[np.ndarray, int]:
    """Speak ``word`` with ``espeak-ng -v voice -s rate -p pitch``; ``(int16 samples, 22050)``."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise DataError("spoken digits are synthesized with espeak-ng, which is not installed: "
                        "apt-get install espeak-ng (or pass --data DIR with LABEL/*.wav folders)")
    out = subprocess.run([exe, "-v", voice, "-s", str(rate), "-p", str(pitch), "--stdout", word],
                         capture_output=True, timeout=60)
    data = out.stdout
    if out.returncode != 0 or len(data) <= 44 or data[:4] != b"RIFF":
        raise DataError(f"espeak-ng -v {voice} failed: {out.stderr.decode(errors='replace').strip()[:200]}")
    # espeak-ng writes a 44-byte header whose sizes are placeholders when streaming: read the samples directly.
    return np.frombuffer(data[44:44 + (len(data) - 44) // 2 * 2], dtype="<i2"), ESPEAK_RATE


def _trim(x: np.ndarray, threshold: float = 0.02) -> np.ndarray:
    """Cut the silence before and after the word (samples below ``threshold`` × the peak)."""
    loud = np.flatnonzero(np.abs(x) >= threshold * np.abs(x).max())
    return x[loud[0]:loud[-1] + 1] if len(loud) else x


def _save_npz(path: Path, **arrays) -> None:
    """``np.savez(path, **arrays)`` with nothing ever half-written (:func:`~tokennet.fileio.atomic_open`)."""
    with atomic_open(path) as handle:  # a file object: np.savez adds no ".npz" to its name
        np.savez(handle, **arrays)


def _clip(word: np.ndarray, rate: int, *, sample_rate: int, clip_samples: int, rng: np.random.Generator,
          snr_db: tuple[float, float] | None) -> np.ndarray:
    """One clip: the trimmed word resampled, at a random offset and level, with white noise at a random SNR
    (``snr_db=None``: clean, the same clip without the noise)."""
    x = word.astype(np.float32) / (32768.0 if word.dtype == np.int16 else 1.0)
    x = resample(_trim(x), rate, sample_rate)
    if len(x) > clip_samples:  # a very slow rendition: keep the middle second
        start = (len(x) - clip_samples) // 2
        x = x[start:start + clip_samples]
    out = np.zeros(clip_samples, np.float32)
    off = int(rng.integers(0, clip_samples - len(x) + 1))
    out[off:off + len(x)] = x * (10 ** rng.uniform(-1.0, 0.0) * 0.9 / max(float(np.abs(x).max()), 1e-6))
    if snr_db is None:
        return out
    snr = rng.uniform(*snr_db)
    signal_power = float(np.mean(out[off:off + len(x)] ** 2))
    noise = rng.standard_normal(clip_samples).astype(np.float32) * np.sqrt(signal_power / 10 ** (snr / 10))
    return np.clip(out + noise, -1.0, 1.0)


def _cache_entry(root, *, seed: int, per_voice: int, test_voices: int, sample_rate: int, clip_samples: int, snr_db,
                 voices: list[str], synth: str, only_test: bool, extra_voices) -> tuple[dict, Path]:
    """The generation parameters of a spoken-digits set and the cache file they name."""
    if not 0 < test_voices < len(voices):
        raise DataError(f"test_voices must be in 1..{len(voices) - 1} (there are {len(voices)} voices), "
                        f"got {test_voices}")
    params = {"version": FORMAT_VERSION, "seed": seed, "per_voice": per_voice, "test_voices": test_voices,
              "sample_rate": sample_rate, "clip_samples": clip_samples,
              "snr_db": None if snr_db is None else list(snr_db), "voices": voices, "synth": synth}
    if only_test:
        params["only_test"] = True
    if extra_voices:
        params["extra_voices"] = list(extra_voices)
    key = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]
    root = cache_dir() if root is None else Path(root)
    return params, root / f"spoken-digits-{key}.npz"


def clips_to_synthesize(*, seed: int = 0, per_voice: int = 3, test_voices: int = 20,
                        snr_db: tuple[float, float] | None = (5.0, 30.0), only_test: bool = False,
                        extra_voices: tuple[str, ...] = ()) -> int:
    """How many clips :func:`synthesize_spoken_digits` (espeak-ng, 16 kHz, 1-s clips) would synthesize with these
    arguments: 0 when the set is cached."""
    voices = [f"{accent}+{variant}" for accent in ACCENTS for variant in VARIANTS]
    _, path = _cache_entry(None, seed=seed, per_voice=per_voice, test_voices=test_voices, sample_rate=16000,
                           clip_samples=16000, snr_db=snr_db, voices=voices, synth="espeak_synth", only_test=only_test,
                           extra_voices=extra_voices)
    if path.is_file():
        return 0
    speakers = test_voices if only_test else len(voices) + len([v for v in extra_voices if v not in voices])
    return speakers * len(DIGITS) * per_voice


def seconds_per_clip(probes: int = 4, synth: Callable[[str, str, int, int], tuple[np.ndarray, int]] | None = None
                     ) -> float:
    """Seconds espeak-ng takes to speak one digit here, timed on ``probes`` of them (one after the other)."""
    synth = espeak_synth if synth is None else synth
    voices = [f"{accent}+{variant}" for accent in ACCENTS for variant in VARIANTS]
    started = time.perf_counter()
    for i in range(probes):
        synth(DIGITS[i % len(DIGITS)], voices[(7 * i) % len(voices)], 170, 50)
    return (time.perf_counter() - started) / max(1, probes)


def synthesize_spoken_digits(root: str | Path | None = None, *, seed: int = 0, per_voice: int = 3,
                             test_voices: int = 20, sample_rate: int = 16000, clip_samples: int = 16000,
                             snr_db: tuple[float, float] | None = (5.0, 30.0), accents=ACCENTS, variants=VARIANTS,
                             synth: Callable[[str, str, int, int], tuple[np.ndarray, int]] | None = None,
                             workers: int = 2, only_test: bool = False, extra_voices: tuple[str, ...] = ()) -> Path:
    """Generate the spoken-digit set (or find it in the cache) and return the path of its ``.npz``.

    Voices are ``accent+variant``; a seeded choice of ``test_voices`` of them forms the test set.
    Each voice speaks each digit ``per_voice`` times, at a rate of U{120..220} words per minute and a
    pitch of U{20..80} (espeak-ng's 0..99 scale).

    Args:
        root: the cache directory (default :func:`cache_dir`).
        seed: draws rates, pitches, offsets, levels, noise and the held-out voices.
        snr_db: the range of the white noise's SNR; None: clean clips (the same clips, without the noise).
        synth: ``synth(word, voice, rate, pitch) -> (samples, rate)``; default :func:`espeak_synth`.
        only_test: synthesize only the held-out voices' clips (the same ones as in the full set): e.g. the
            clean test clips that evaluation sets mix their own noise into.
        extra_voices: more voices (``accent+variant``) for training only, appended after the held-out
            voices are drawn (so the test voices and their clips stay those of the set without them).
    """
    synth = espeak_synth if synth is None else synth
    voices = [f"{accent}+{variant}" for accent in accents for variant in variants]
    params, path = _cache_entry(root, seed=seed, per_voice=per_voice, test_voices=test_voices,
                                sample_rate=sample_rate, clip_samples=clip_samples, snr_db=snr_db, voices=voices,
                                synth=getattr(synth, "__name__", "custom"), only_test=only_test,
                                extra_voices=extra_voices)
    root = path.parent
    if path.is_file():
        return path
    rng = np.random.default_rng(seed)
    held = set(rng.choice(len(voices), size=test_voices, replace=False).tolist())
    jobs = [(voice_idx, digit, int(rng.integers(120, 221)), int(rng.integers(20, 81)))
            for voice_idx in range(len(voices)) for digit in range(len(DIGITS)) for _ in range(per_voice)]
    if extra_voices:  # drawn after the original jobs: those keep their rates, pitches and clip seeds
        extra = [variant for variant in extra_voices if variant not in voices]
        jobs += [(len(voices) + k, digit, int(rng.integers(120, 221)), int(rng.integers(20, 81)))
                 for k in range(len(extra)) for digit in range(len(DIGITS)) for _ in range(per_voice)]
        voices = voices + extra
    index = list(range(len(jobs)))  # each clip's seed is its place in the full list
    if only_test:
        index = [i for i in index if jobs[i][0] in held]
        jobs = [jobs[i] for i in index]
    log.info("synthesizing %d clips: %d voices × %d digits × %d (this happens once; cached in %s)", len(jobs),
             len(voices), len(DIGITS), per_voice, root)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool, \
            phase(f"synthesizing {len(jobs):,} clips", total=len(jobs), unit="clips"):
        words = []
        for word in pool.map(lambda job: synth(DIGITS[job[1]], voices[job[0]], job[2], job[3]), jobs):
            words.append(word)
            advance()
    clips = np.zeros((len(jobs), clip_samples), np.int16)
    for i, ((voice_idx, _, _, _), (samples, rate)) in enumerate(zip(jobs, words, strict=True)):
        if np.abs(samples.astype(np.float32)).max() < SILENCE * (32768.0 if samples.dtype == np.int16 else 1.0):
            raise DataError(f"the synthesizer returned silence for voice {voices[voice_idx]}")
        clip_rng = np.random.default_rng([seed, index[i]])  # per clip: the same clip whatever the thread order
        clip = _clip(samples, rate, sample_rate=sample_rate, clip_samples=clip_samples, rng=clip_rng, snr_db=snr_db)
        clips[i] = np.round(clip * 32767).astype(np.int16)
    root.mkdir(parents=True, exist_ok=True)
    _save_npz(path, clips=clips, digit=np.array([job[1] for job in jobs], np.int64),
              voice=np.array([job[0] for job in jobs], np.int64), test=np.array([job[0] in held for job in jobs]),
              voices=np.array(voices), params=np.array(json.dumps(params)))
    return path


def load_spoken_digits(path: str | Path) -> AudioSet:
    """The cached set as an :class:`AudioSet`: held-out voices form the test split."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            clips, digit, voice, test = archive["clips"], archive["digit"], archive["voice"], archive["test"]
            voices, params = archive["voices"].tolist(), jsonio.loads(str(archive["params"]), what=f"{path}: params")
    except (OSError, ValueError, KeyError) as err:
        raise DataError(f"{path} is not a readable spoken-digits cache ({err}); delete it to regenerate") from None
    x = torch.from_numpy(clips.astype(np.float32) / 32767.0)
    y = torch.from_numpy(digit)
    train_mask, test_mask = torch.from_numpy(~test), torch.from_numpy(test)
    return AudioSet(name="spoken-digits (espeak-ng)" if params["synth"] == "espeak_synth" else "spoken-digits",
                    labels=list(DIGITS), sample_rate=params["sample_rate"], x_train=x[train_mask],
                    y_train=y[train_mask],
                    x_test=x[test_mask], y_test=y[test_mask], test_voices=[voices[v] for v in voice[test]])


def _label_folders(d: Path) -> dict[str, list[Path]]:
    return {folder.name: sorted(folder.glob("*.wav")) for folder in sorted(d.iterdir())
            if folder.is_dir() and any(folder.glob("*.wav"))}


def _read_clips(files: list[Path], sample_rate: int, clip_samples: int) -> Tensor:
    out = torch.zeros(len(files), clip_samples)
    for i, file in enumerate(files):
        x = load_fitted(file, sample_rate, clip_samples)
        out[i, :len(x)] = torch.from_numpy(x)
    return out


def load_label_dir(directory: str | Path, *, sample_rate: int, clip_samples: int, seed: int = 0,
                   test_fraction: float = 0.2) -> AudioSet:
    """A user dataset: ``DIR/LABEL/*.wav``, or ``DIR/train/LABEL/*.wav`` and ``DIR/test/LABEL/*.wav``.

    Clips are trimmed of leading and trailing silence; one still longer than ``clip_samples`` (after
    resampling to ``sample_rate``) keeps its loudest ``clip_samples`` (:func:`~tokennet.tokens.clips.fit_window`).
    A silent, unreadable or empty file is a :class:`DataError` naming the file.
    """
    root = Path(directory)
    if not root.is_dir():
        raise DataError(f"audio data {root} is not a directory of LABEL/*.wav folders")
    if (root / "train").is_dir() and (root / "test").is_dir():
        train, test = _label_folders(root / "train"), _label_folders(root / "test")
        labels = sorted(set(train) | set(test))
        if not train or not test:
            raise DataError(f"{root}/train and {root}/test must each hold LABEL/*.wav folders")
        train_files = [(file, labels.index(k)) for k in sorted(train) for file in train[k]]
        test_files = [(file, labels.index(k)) for k in sorted(test) for file in test[k]]
    else:
        folders = _label_folders(root)
        if len(folders) < 2:
            empty = sorted(entry.name for entry in root.iterdir() if entry.is_dir() and entry.name not in folders)
            said = f" ({', '.join(empty[:5])}{', …' if len(empty) > 5 else ''} hold no .wav file)" if empty else ""
            raise DataError(f"{root} has {len(folders)} LABEL/*.wav folder(s){said}; a classifier needs at least 2 "
                            "(DIR/LABEL/*.wav, or DIR/train/LABEL/*.wav and DIR/test/LABEL/*.wav)")
        labels = sorted(folders)
        rng = np.random.default_rng(seed)
        train_files, test_files = [], []
        for y, k in enumerate(labels):
            files = folders[k]
            if len(files) < 2:
                raise DataError(f"{root / k} has {len(files)} clip; each label needs at least 2 (train and test)")
            order = rng.permutation(len(files))
            n_test = max(1, round(test_fraction * len(files)))
            test_files += [(files[i], y) for i in sorted(order[:n_test])]
            train_files += [(files[i], y) for i in sorted(order[n_test:])]
    x_tr = _read_clips([file for file, _ in train_files], sample_rate, clip_samples)
    x_te = _read_clips([file for file, _ in test_files], sample_rate, clip_samples)
    return AudioSet(name=str(root), labels=labels, sample_rate=sample_rate, x_train=x_tr,
                    y_train=torch.tensor([y for _, y in train_files]), x_test=x_te,
                    y_test=torch.tensor([y for _, y in test_files]))


def load_audio_dataset(data: str | None, *, seed: int = 0, per_voice: int = 3, test_voices: int = 20,
                       sample_rate: int = 16000, clip_samples: int = 16000) -> AudioSet:
    """``None`` or ``"spoken-digits"``: the generated set (synthesized once, then cached); else a directory
    of ``LABEL/*.wav`` folders (:func:`load_label_dir`)."""
    if data in (None, DEFAULT_DATA):
        if sample_rate != 16000 or clip_samples != 16000:
            raise DataError("the generated spoken digits are 1-s clips at 16 kHz: keep sample_rate=16000 and "
                            "clip_samples=16000, or pass --data DIR")
        return load_spoken_digits(synthesize_spoken_digits(seed=seed, per_voice=per_voice, test_voices=test_voices))
    return load_label_dir(data, sample_rate=sample_rate, clip_samples=clip_samples, seed=seed)


@register_data
@dataclass
class SpokenWords(DataSpec):
    """An audio classification dataset: the generated spoken digits (``source="spoken-digits"``: ``per_voice``
    takes of each digit per voice, ``test_voices`` whole voices held out, drawn by ``seed``) or a directory
    of ``LABEL/*.wav`` (``source`` its path), read at the model's ``sample_rate`` as clips of at most
    ``clip_samples``. ``labels`` — the class names — come from the data when training starts.

    Args:
        source: ``spoken-digits`` (synthesized) or a directory of ``LABEL/*.wav``.
        seed: draws the voices, the takes and which voices are held out.
        per_voice: takes of each digit per voice (generated data).
        test_voices: whole voices held out for the test set (generated data).
        sample_rate: the rate clips are read at, in Hz (the model's).
        clip_samples: the most samples of a clip (longer ones are cut).
    """

    kind: ClassVar[str] = "spoken-words"
    legacy_recipes: ClassVar[tuple[str, ...]] = ("audio",)
    derived: ClassVar[tuple[str, ...]] = ("labels",)
    source: str = DEFAULT_DATA
    seed: int = 0
    per_voice: int = 3
    test_voices: int = 20
    sample_rate: int = 16000
    clip_samples: int = 16000
    labels: list[str] = field(default_factory=list)

    @classmethod
    def from_legacy(cls, data, settings) -> SpokenWords:
        names = settings.get("class_names") or ""
        return cls(source=data if data not in (None, "") else DEFAULT_DATA, seed=settings.get("seed", 0),
                   per_voice=settings.get("per_voice", 3), test_voices=settings.get("test_voices", 20),
                   sample_rate=settings.get("sample_rate", 16000), clip_samples=settings.get("clip_samples", 16000),
                   labels=names.split(",") if names else [])

    def load(self) -> AudioSet:
        """The clips (synthesized once and cached, or read from the directory)."""
        return load_audio_dataset(None if self.source == DEFAULT_DATA else self.source, seed=self.seed,
                                  per_voice=self.per_voice, test_voices=self.test_voices,
                                  sample_rate=self.sample_rate, clip_samples=self.clip_samples)

    def held_out(self) -> AudioSet:
        """The dataset, whose ``x_test``/``y_test`` (and ``test_voices``) are the held-out clips."""
        return self.load()
