"""Audio → tokens: a waveform becomes a log-mel spectrogram, the spectrogram is cut into patches.

"Audio is tokenized by first compressing (e.g., via spectrogram), and only then patching and
vectorizing." This is the Audio Spectrogram Transformer's front end (Gong et al. 2021,
https://arxiv.org/abs/2104.01778):

    X[f, t] = Σₙ x[tH + n] w[n] e^(−2πi f n / N_fft)     short-time Fourier transform (Hann window w, hop H)
    P[f, t] = |X[f, t]|²                                 power spectrogram, F = N_fft/2 + 1 bins
    S[m, t] = log(Σ_f M[f, m] P[f, t] + ε)               log-mel spectrogram, M triangular mel filters

The spectrogram ``(B, mels, frames)`` is a one-channel image: :func:`spectrogram_patches` cuts it with
the image :func:`~tokennet.tokens.image.patchify` (overlapping patches when the stride is smaller than
the patch, as AST's 16×16 patches at stride 10), and a linear map ``E`` embeds each patch
(:class:`~tokennet.tokens.image.PatchEmbed`, the ViT's embedding).

**Mel scale: HTK** (the default; O'Shaughnessy 1987), ``mel(f) = 2595 · log10(1 + f / 700)``, whose
triangular filters have peak 1 (``torchaudio.functional.melscale_fbanks(..., norm=None,
mel_scale="htk")``). ``scale="slaney"`` gives the Auditory Toolbox scale (linear below 1 kHz,
logarithmic above; librosa's default), with the same peak-1 triangles.

Files: :func:`read_audio` reads WAV with ``scipy.io.wavfile`` (and OGG/FLAC with ``soundfile`` when it
is installed); integer samples are scaled to [−1, 1] (int16 / 2¹⁵, int32 / 2³¹, uint8 (x − 128) / 2⁷),
float samples are kept. :func:`load_audio` also mixes stereo to mono and resamples with
``scipy.signal.resample_poly`` (a polyphase FIR filter: up by L, low-pass, down by M with L/M = the
ratio of the rates).
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from ..errors import ConfigError, DataError
from .image import patchify

__all__ = ["hz_to_mel", "mel_to_hz", "mel_filterbank", "power_spectrogram", "log_mel_spectrogram",
           "LogMelSpectrogram", "spectrogram_patches", "to_mono", "resample", "read_audio", "load_audio",
           "MEL_SCALES", "SILENCE"]

MEL_SCALES = ("htk", "slaney")
SILENCE = 1e-4  # a clip whose peak |x| stays below this (−80 dBFS) is silence
_SLANEY_F_SP, _SLANEY_MIN_LOG_HZ = 200.0 / 3, 1000.0
_SLANEY_LOGSTEP = math.log(6.4) / 27.0


def hz_to_mel(f, scale: str = "htk"):
    """Hertz → mels. HTK: ``2595 · log10(1 + f/700)``; Slaney: ``f / (200/3)`` below 1 kHz, then
    ``15 + log(f / 1000) / (log(6.4) / 27)``. Works on floats, numpy arrays and tensors."""
    lib = torch if torch.is_tensor(f) else np
    if scale == "htk":
        return 2595.0 * lib.log10(1.0 + f / 700.0)
    if scale == "slaney":
        lin = f / _SLANEY_F_SP
        log = _SLANEY_MIN_LOG_HZ / _SLANEY_F_SP + lib.log(lib.maximum(f, lib.ones_like(f) * 1e-10)
                                                          / _SLANEY_MIN_LOG_HZ) / _SLANEY_LOGSTEP
        return lib.where(f >= _SLANEY_MIN_LOG_HZ, log, lin)
    raise ConfigError(f"mel scale must be one of {list(MEL_SCALES)}, got {scale!r}")


def mel_to_hz(m, scale: str = "htk"):
    """Mels → hertz, the inverse of :func:`hz_to_mel`."""
    lib = torch if torch.is_tensor(m) else np
    if scale == "htk":
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)
    if scale == "slaney":
        min_log_mel = _SLANEY_MIN_LOG_HZ / _SLANEY_F_SP
        return lib.where(m >= min_log_mel, _SLANEY_MIN_LOG_HZ * lib.exp(_SLANEY_LOGSTEP * (m - min_log_mel)),
                         _SLANEY_F_SP * m)
    raise ConfigError(f"mel scale must be one of {list(MEL_SCALES)}, got {scale!r}")


def mel_filterbank(n_freqs: int, n_mels: int, sample_rate: int, f_min: float = 0.0, f_max: float | None = None,
                   scale: str = "htk") -> Tensor:
    """Triangular mel filters ``M`` of shape ``(n_freqs, n_mels)``: column m weights the STFT bins.

    The ``n_mels + 2`` edges are equally spaced in mels between ``f_min`` and ``f_max`` (default: the
    Nyquist frequency ``sample_rate / 2``); filter m rises linearly from edge m to 1 at edge m + 1 (its
    centre) and falls to 0 at edge m + 2, evaluated at the bin frequencies ``f_k = k · sr / N_fft``.
    """
    f_max = sample_rate / 2 if f_max is None else f_max
    if not 0 <= f_min < f_max <= sample_rate / 2:
        raise ConfigError(f"mel filters need 0 <= f_min < f_max <= sample_rate/2 = {sample_rate / 2}, "
                          f"got f_min={f_min}, f_max={f_max}")
    freqs = torch.linspace(0, sample_rate / 2, n_freqs, dtype=torch.float64)  # (F,)
    m = torch.linspace(hz_to_mel(torch.tensor(float(f_min), dtype=torch.float64), scale),
                       hz_to_mel(torch.tensor(float(f_max), dtype=torch.float64), scale),
                       n_mels + 2, dtype=torch.float64)
    edges = mel_to_hz(m, scale)  # (n_mels + 2,)
    lower, mid, upper = edges[:-2], edges[1:-1], edges[2:]  # (n_mels,) each
    rising = (freqs[:, None] - lower) / (mid - lower)  # (F, n_mels)
    falling = (upper - freqs[:, None]) / (upper - mid)  # (F, n_mels)
    return torch.clamp(torch.minimum(rising, falling), min=0.0).float()


def power_spectrogram(wave: Tensor, n_fft: int = 400, hop_length: int = 160) -> Tensor:
    """``(B, samples) → (B, n_fft/2 + 1, frames)``: ``|STFT|²`` with a periodic Hann window.

    Frames are centred (the signal is reflect-padded by ``n_fft/2`` on both sides), so
    ``frames = 1 + samples // hop_length``.
    """
    window = torch.hann_window(n_fft, device=wave.device, dtype=wave.dtype)
    spec = torch.stft(wave, n_fft, hop_length=hop_length, win_length=n_fft, window=window, center=True,
                      pad_mode="reflect", return_complex=True)  # (B, F, T)
    return spec.abs().square()


def log_mel_spectrogram(wave: Tensor, fbank: Tensor, n_fft: int = 400, hop_length: int = 160,
                        eps: float = 1e-6, top_db: float | None = None) -> Tensor:
    """``(B, samples) → (B, mels, frames)``: ``S = log(Mᵀ |STFT|² + ε)`` with ``M = fbank`` ``(F, mels)``.

    With ``top_db``, each clip's values are floored at ``top_db`` decibels below its largest one
    (``max(S, max S − top_db · ln 10 / 10)``, librosa's ``power_to_db(top_db=...)`` in natural log): digital
    silence (exact zeros) then looks like a quiet noise floor instead of ``log ε``, far below anything a
    recorded clip holds.
    """
    power = power_spectrogram(wave, n_fft, hop_length)  # (B, F, T)
    log_mel = torch.log(torch.einsum("bft,fm->bmt", power, fbank) + eps)  # (B, mels, T)
    if top_db is not None:
        log_mel = torch.maximum(log_mel, log_mel.amax(dim=(1, 2), keepdim=True) - top_db * math.log(10) / 10)
    return log_mel


class LogMelSpectrogram(nn.Module):
    """Waveforms ``(B, samples)`` → log-mel spectrograms ``(B, mels, frames)``; no parameters.

    The filterbank is a non-persistent buffer: it is a function of the config, recomputed on load, never
    saved (so it cannot go stale).

    Args:
        sample_rate: samples per second of the input.
        n_fft: FFT size (and window length); 400 = 25 ms at 16 kHz.
        hop_length: samples between frames; 160 = 10 ms at 16 kHz.
        n_mels: mel filters.
        f_min, f_max: the band the filters cover (default 0 .. Nyquist).
        scale: ``"htk"`` or ``"slaney"``.
        top_db: floor each clip at this many dB below its loudest bin (None: no floor).
    """

    def __init__(self, sample_rate: int = 16000, n_fft: int = 400, hop_length: int = 160, n_mels: int = 64,
                 f_min: float = 0.0, f_max: float | None = None, scale: str = "htk", top_db: float | None = None):
        super().__init__()
        self.sample_rate, self.n_fft, self.hop_length, self.n_mels = sample_rate, n_fft, hop_length, n_mels
        self.top_db = top_db
        self.register_buffer("fbank", mel_filterbank(n_fft // 2 + 1, n_mels, sample_rate, f_min, f_max, scale),
                             persistent=False)

    def num_frames(self, samples: int) -> int:
        return 1 + samples // self.hop_length

    def forward(self, wave: Tensor) -> Tensor:
        return log_mel_spectrogram(wave, self.fbank.to(wave.dtype), self.n_fft, self.hop_length, top_db=self.top_db)


def spectrogram_patches(spec: Tensor, patch_size, stride=None, *, pad: bool = False) -> Tensor:
    """Spectrograms ``(B, mels, frames)`` → flattened patches ``(B, N, ph·pw)``, row-major over the
    (frequency, time) grid, with :func:`~tokennet.tokens.image.patchify` on a one-channel image."""
    return patchify(spec[:, None], patch_size, stride, pad=pad)  # (B, 1, mels, T) → (B, N, ph·pw)


# -- files and signals -------------------------------------------------------------------------------

def to_mono(x: np.ndarray) -> np.ndarray:
    """``(samples,)`` or ``(samples, channels)`` → ``(samples,)``: the mean of the channels."""
    return x if x.ndim == 1 else x.mean(axis=1)


def resample(x: np.ndarray, orig_rate: int, new_rate: int) -> np.ndarray:
    """Resample a 1-D signal with ``scipy.signal.resample_poly`` (up by L, FIR low-pass, down by M)."""
    for name, rate in (("sample rate", orig_rate), ("target sample rate", new_rate)):
        if isinstance(rate, bool) or not isinstance(rate, (int, np.integer)) or rate < 1:
            raise DataError(f"{name} must be a positive integer, got {rate!r}")
    if orig_rate == new_rate:
        return x.astype(np.float32, copy=False)
    from scipy.signal import resample_poly

    divisor = math.gcd(int(orig_rate), int(new_rate))
    return resample_poly(x, int(new_rate) // divisor, int(orig_rate) // divisor).astype(np.float32)


MAX_SAMPLE_RATE = 1_536_000  # 8 × 192 kHz: above any recording format in use


def _normalize(a: np.ndarray, path) -> np.ndarray:
    if a.dtype == np.uint8:
        return (a.astype(np.float32) - 128.0) / 128.0
    if a.dtype.kind == "i":
        return a.astype(np.float32) / float(2 ** (8 * a.dtype.itemsize - 1))
    if a.dtype.kind == "f":
        samples = a.astype(np.float32)
        if not np.isfinite(samples).all():
            raise DataError(f"{path}: the audio has NaN or infinite samples")
        return np.clip(samples, -1.0, 1.0)
    raise DataError(f"{path}: unsupported sample format {a.dtype}")


def read_audio(path: str | Path) -> tuple[np.ndarray, int]:
    """Read an audio file as ``(float32 samples (samples,) or (samples, channels) in [−1, 1], rate)``.

    WAV through ``scipy.io.wavfile``; other formats (OGG, FLAC, ...) through ``soundfile`` if installed.
    A missing, empty, truncated or non-audio file raises :class:`DataError` naming the file.
    """
    file = Path(path)
    if not file.is_file():
        raise DataError(f"audio file {file} does not exist" if not file.exists()
                        else f"audio file {file} is not a file")
    if file.stat().st_size == 0:
        raise DataError(f"audio file {file} is empty")
    with open(file, "rb") as stream:
        head = stream.read(12)
    if head[:4] in (b"RIFF", b"RIFX", b"RF64") and head[8:12] == b"WAVE":
        from scipy.io import wavfile

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # scipy only warns on a truncated file: make it an error
                # ... but not on a chunk it skips (libsndfile's float WAVs carry PEAK/fact chunks): the data is whole
                warnings.filterwarnings("ignore", message="Chunk .*not understood")
                rate, samples = wavfile.read(file)
        except Exception as error:  # noqa: BLE001 - scipy fails on a damaged header in many ways (ZeroDivisionError, ...)
            first = (str(error).splitlines() or [""])[0]
            raise DataError(f"{file} is not a readable WAV file ({type(error).__name__}: {first})") from None
    else:
        try:
            import soundfile
        except ImportError:
            raise DataError(f"{file} is not a WAV file (other formats such as OGG and FLAC need the soundfile "
                            "package: pip install soundfile)") from None
        try:
            samples, rate = soundfile.read(str(file), dtype="float32", always_2d=False)
        except Exception as error:  # soundfile raises its own LibsndfileError (a RuntimeError) and others
            first = (str(error).splitlines() or [""])[0]
            raise DataError(f"{file} is not a readable audio file ({type(error).__name__}: {first})") from None
    if isinstance(rate, bool) or not isinstance(rate, (int, np.integer)) or rate < 1:
        raise DataError(f"{file}: the sample rate must be a positive integer, got {rate!r}")
    if rate > MAX_SAMPLE_RATE:  # a damaged header: resampling from it would design a filter of ~10·rate taps
        raise DataError(f"{file}: a sample rate of {rate} Hz is not plausible (at most {MAX_SAMPLE_RATE}); the header "
                        "is damaged")
    if samples.size == 0:
        raise DataError(f"{file} has no samples")
    return _normalize(samples, file), int(rate)


def load_audio(path: str | Path, sample_rate: int, *, max_samples: int | None = None) -> np.ndarray:
    """Read a file as a mono float32 waveform at ``sample_rate``.

    Raises :class:`DataError` on an unreadable file, on silence only (peak below ``SILENCE``) and, with
    ``max_samples``, on a clip longer than that (it is not cropped: cropping could cut the word off).
    """
    samples, rate = read_audio(path)
    x = resample(to_mono(samples), rate, sample_rate)
    if float(np.abs(x).max()) < SILENCE:
        raise DataError(f"{path} is silence only (peak amplitude below {SILENCE})")
    if max_samples is not None and len(x) > max_samples:
        raise DataError(f"{path} lasts {len(x) / sample_rate:.2f} s, longer than the model's maximum "
                        f"{max_samples / sample_rate:.2f} s; trim it (clips are not cropped)")
    return x
