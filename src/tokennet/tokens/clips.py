"""Audio clips of any length for a model with a fixed window: trim the silence, then overlapping windows.

A model such as the AST reads ``window`` samples (1 s for the spoken digits). A real recording is rarely
cut to that: it has silence before and after the word, and it may be longer than the window. The path
from a file to the model's inputs, the same for training data, inference, pictures and the report:

1. **Read** (:func:`~tokennet.tokens.audio.read_audio`): mono (the channels' mean), resampled to the
   model's rate. A sample rate below :data:`MIN_SAMPLE_RATE` cannot hold speech and is an error.
2. **Trim** (:func:`trim_silence`): frames of :data:`FRAME_SECONDS` (10 ms) get their RMS level in dB,
   ``L_f = 20 log10(rms_f)``; leading and trailing frames more than ``threshold_db`` (:data:`TRIM_DB`,
   40 dB) below the loudest frame, ``L_f < max_f L_f − 40``, are cut, keeping :data:`MARGIN_SECONDS`
   (50 ms) on each side so that a soft onset or release is not clipped. The threshold is relative to the
   clip's own peak, so a quiet recording trims like a loud one. A clip whose peak is below
   :data:`~tokennet.tokens.audio.SILENCE` (−80 dBFS) is silence: a :class:`~tokennet.errors.DataError`.
3. **Cap** (``max_seconds``, :data:`MAX_SECONDS` = 10 min): a longer clip keeps its first ``max_seconds``
   and the result says so in ``notes`` (one line the caller may print).
4. **Window** (:func:`split_windows`): a trimmed clip no longer than the window is one window, zero-padded
   at the end (as the model pads); a longer one is read as windows of ``window`` samples every ``hop``
   (default a quarter window), the last one aligned to the clip's end so that no sample is left out.
5. **Combine** (:func:`combine_windows`) the windows' log-probabilities ``ℓ_w = log p(· | window w)``:
   ``"mean"``, the mean ``(1/W) Σ_w ℓ_w`` (renormalized: a product of experts), or ``"confident"``, the
   log-probabilities of the window whose top class is most probable, ``ℓ_{w*}`` with
   ``w* = argmax_w max_k ℓ_w[k]``. ``bench/audio_robust.py`` measures both (:data:`COMBINE` is the better).

For training data of fixed length (``--data DIR`` with longer files), :func:`fit_window` trims and then,
if the word is still longer than the window, keeps the window with the most energy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..errors import DataError
from .audio import SILENCE, read_audio, resample, to_mono

__all__ = ["TRIM_DB", "FRAME_SECONDS", "MARGIN_SECONDS", "MAX_SECONDS", "MIN_SAMPLE_RATE", "COMBINES", "COMBINE",
           "frame_levels_db", "trim_silence", "split_windows", "fit_window", "combine_windows", "ClipWindows",
           "prepare_clip", "load_clip", "load_fitted", "classify_clip"]

TRIM_DB = 40.0  # frames this far below the loudest frame are silence at the ends
FRAME_SECONDS = 0.010
MARGIN_SECONDS = 0.050
MAX_SECONDS = 600.0
MIN_SAMPLE_RATE = 4000  # 2 kHz of bandwidth: below that no speech band is left
COMBINES = ("confident", "mean")
COMBINE = "confident"  # measured in bench/audio_robust.py (see its table)


def _check_silence(x: np.ndarray, name: str) -> None:
    if x.size == 0:
        raise DataError(f"{name} has no samples")
    if float(np.abs(x).max()) < SILENCE:
        raise DataError(f"{name} is silence only (peak amplitude below {SILENCE}, i.e. −80 dBFS)")


def frame_levels_db(x: np.ndarray, frame: int) -> np.ndarray:
    """RMS level of consecutive frames of ``frame`` samples (the last one shorter), ``20 log10(rms)``, ``(F,)``."""
    n = len(x)
    frames = math.ceil(n / frame)
    pad = np.zeros(frames * frame, np.float64)
    pad[:n] = x
    power = (pad.reshape(frames, frame) ** 2).sum(1)
    counts = np.full(frames, frame, np.float64)
    counts[-1] = n - (frames - 1) * frame
    return 10.0 * np.log10(power / counts + 1e-20)  # (F,)


def trim_silence(x: np.ndarray, sample_rate: int, *, threshold_db: float = TRIM_DB,
                 margin_seconds: float = MARGIN_SECONDS, name: str = "the clip") -> np.ndarray:
    """Cut the leading and trailing frames more than ``threshold_db`` below the loudest one (module
    docstring), keeping ``margin_seconds`` on each side; all-silence is a :class:`DataError`."""
    _check_silence(x, name)
    if not threshold_db > 0:
        raise DataError(f"the trim threshold must be a positive number of dB, got {threshold_db}")
    frame = max(1, round(FRAME_SECONDS * sample_rate))
    level = frame_levels_db(x, frame)
    loud = np.flatnonzero(level >= level.max() - threshold_db)
    margin = round(margin_seconds * sample_rate)
    start = max(0, loud[0] * frame - margin)
    end = min(len(x), (loud[-1] + 1) * frame + margin)
    return x[start:end]


def split_windows(x: np.ndarray, window: int, hop: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Overlapping windows ``(W, window)`` and their start samples ``(W,)``.

    ``len(x) ≤ window``: one window, zero-padded at the end. Otherwise windows start every ``hop``
    samples (default ``window // 4``), and a last one ends exactly at the clip's end.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1 sample, got {window}")
    hop = max(1, window // 4) if hop is None else hop
    if hop < 1:
        raise ValueError(f"hop must be >= 1 sample, got {hop}")
    n = len(x)
    if n <= window:
        out = np.zeros((1, window), np.float32)
        out[0, :n] = x
        return out, np.zeros(1, np.int64)
    starts = list(range(0, n - window + 1, hop))
    if starts[-1] != n - window:
        starts.append(n - window)
    starts = np.array(starts, np.int64)
    idx = starts[:, None] + np.arange(window)[None, :]  # (W, window)
    return x[idx].astype(np.float32, copy=False), starts


def fit_window(x: np.ndarray, sample_rate: int, window: int, *, threshold_db: float = TRIM_DB,
               name: str = "the clip") -> np.ndarray:
    """One training clip of at most ``window`` samples: trimmed, then, if still longer, the ``window``
    consecutive samples with the most energy (the word, in a clip with one word)."""
    x = trim_silence(x, sample_rate, threshold_db=threshold_db, name=name)
    if len(x) <= window:
        return x
    energy = np.concatenate([[0.0], np.cumsum(x.astype(np.float64) ** 2)])
    best = int(np.argmax(energy[window:] - energy[:-window]))
    return x[best:best + window]


def combine_windows(log_probs: Tensor, how: str = COMBINE) -> Tensor:
    """One clip's log-probabilities ``(K,)`` from its windows' ``(W, K)`` (module docstring, step 5)."""
    if log_probs.dim() != 2 or log_probs.shape[0] < 1:
        raise ValueError(f"expected the windows' log-probabilities (W >= 1, K), got {tuple(log_probs.shape)}")
    if how == "mean":
        return torch.log_softmax(log_probs.mean(0), dim=-1)
    if how == "confident":
        return log_probs[log_probs.max(-1).values.argmax()]
    raise ValueError(f"how must be one of {list(COMBINES)}, got {how!r}")


@dataclass
class ClipWindows:
    """A clip ready for a fixed-window model.

    Attributes:
        windows: ``(W, window)`` float32 waveforms.
        starts: ``(W,)`` start of each window in the trimmed clip, in samples.
        sample_rate: their rate.
        seconds: the trimmed (and capped) clip's length.
        notes: one-line remarks for the user (the cap), empty when there is nothing to say.
    """

    windows: np.ndarray
    starts: np.ndarray
    sample_rate: int
    seconds: float
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.windows)


def prepare_clip(x: np.ndarray, sample_rate: int, window: int, *, hop: int | None = None, trim: bool = True,
                 threshold_db: float = TRIM_DB, max_seconds: float = MAX_SECONDS,
                 name: str = "the clip") -> ClipWindows:
    """A mono waveform at ``sample_rate`` → :class:`ClipWindows` (trim, cap, windows; module docstring)."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 1:
        raise DataError(f"{name}: expected a mono waveform (samples,), got shape {x.shape}")
    if not np.isfinite(x).all():
        raise DataError(f"{name}: the audio has NaN or infinite samples")
    x = trim_silence(x, sample_rate, threshold_db=threshold_db, name=name) if trim else x
    _check_silence(x, name)
    notes = []
    cap = int(max_seconds * sample_rate)
    if len(x) > cap:
        notes.append(f"{name} lasts {len(x) / sample_rate:.1f} s after trimming; only its first {max_seconds:g} s "
                     f"are read")
        x = x[:cap]
    windows, starts = split_windows(x, window, hop)
    return ClipWindows(windows, starts, sample_rate, len(x) / sample_rate, notes)


def _read_mono(path: str | Path, sample_rate: int) -> np.ndarray:
    samples, rate = read_audio(path)
    if rate < MIN_SAMPLE_RATE:
        raise DataError(f"{path}: a sample rate of {rate} Hz cannot hold speech (at least {MIN_SAMPLE_RATE} Hz)")
    return resample(to_mono(samples), rate, sample_rate)


def load_fitted(path: str | Path, sample_rate: int, window: int, *, threshold_db: float = TRIM_DB) -> np.ndarray:
    """Read a training clip of any length as at most ``window`` samples (:func:`fit_window`)."""
    return fit_window(_read_mono(path, sample_rate), sample_rate, window, threshold_db=threshold_db, name=str(path))


def load_clip(path: str | Path, sample_rate: int, window: int, **kw) -> ClipWindows:
    """Read an audio file of any length as :class:`ClipWindows` at ``sample_rate`` (module docstring).

    Errors (one :class:`DataError` line naming the file): unreadable or empty file, no samples, a sample
    rate below :data:`MIN_SAMPLE_RATE`, silence only.
    """
    return prepare_clip(_read_mono(path, sample_rate), sample_rate, window, name=str(path), **kw)


@torch.no_grad()
def classify_clip(model, windows: torch.Tensor, how: str = COMBINE) -> tuple[torch.Tensor, int]:
    """One clip's class log-probabilities ``(K,)`` from its windows ``(W, samples)``
    (:func:`combine_windows`), and the window that decided (the most confident)."""
    dev = next(model.parameters()).device
    log_probs = torch.log_softmax(model(windows.to(dev)).logits.float(), dim=-1).cpu()  # (W, K)
    return combine_windows(log_probs, how), int(log_probs.max(-1).values.argmax())
