"""Waveform augmentation for spoken-word training: speed perturbation and background noise, per batch.

:class:`WaveFeatures` plugs into :class:`~tokennet.data.image_batches.ImageBatches` (its ``augment`` hook,
seeded by the batch index, so a resumed run sees the same batches) over the training *waveforms*: it
perturbs each clip of a batch and turns the batch into the model's inputs with ``features`` (e.g. an AST's
parameter-free ``spectrogram_image``). The perturbations (:class:`WaveAugment`), each applied to a clip
with its own probability:

- **speed** (Ko et al. 2015, "Audio augmentation for speech recognition"): the clip is resampled by a
  factor ``s ~ U(speed)``, ``y(t) = x(s·t)`` (linear interpolation), which changes tempo and pitch
  together, as playing a tape faster; a slowed clip keeps its loudest ``samples`` (the word), a sped-up
  one is zero-padded at the end.
- **equalization** (``eq_db``): a random smooth filter, a spectral tilt of U(−½, ½)·eq_db dB per octave
  around 1 kHz plus a bump of U(−1, 1)·eq_db dB, one octave wide, at a log-uniform 300 Hz–5 kHz — a
  different microphone, room, or synthesizer's average envelope;
- **low-pass** (``lowpass``): frequencies above a cut-off ~ U(lowpass) Hz removed (a cosine taper over
  10 % of the cut-off), as a narrow-band recording or an 8 kHz voice has nothing up there;
- **source** (``resynth``): the word through an LPC vocoder with a new voice source — per 25-ms frame
  (every 10 ms) the spectral envelope ``g / A(z)`` of order 18 is fitted (autocorrelation method,
  Levinson–Durbin), and the frame is re-synthesized from a pulse train at a new pitch ``f0 ~ U(resynth)`` Hz
  (with 1 % jitter) where the frame was voiced, white noise where it was not (voicing: the residual's
  normalized autocorrelation peak over 2.5–12.5 ms above 0.3), windowed and overlap-added. The envelope —
  the formants that make the word — is kept; the excitation, which differs most between synthesizers
  (espeak-ng's formant source, a diphone recording's, a vocoder's), and the pitch are new: pitch
  perturbation at the same tempo;
- **noise**: white, pink or babble noise (:mod:`tokennet.data.noise`; the babble made of words that no
  evaluation set uses) at an SNR ``~ U(noise_snr)`` dB of the clip's active speech power.

SpecAugment (frequency and time masks) is the model's own (``freq_mask``, ``time_mask`` of the AST).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .noise import NOISES, babble_noise, mix_at_snr, pink_noise, white_noise

__all__ = ["WaveAugment", "speed_perturb", "equalize", "lowpass", "lpc_resynthesize", "WaveFeatures"]


@dataclass
class WaveAugment:
    """What :class:`WaveFeatures` does to a training clip (module docstring).

    Args:
        speed: the range of the speed factor (None: off).
        speed_prob: the share of clips perturbed.
        noises: kinds of noise mixed in, one drawn per clip (empty: off).
        noise_prob: the share of clips that get noise.
        noise_snr: the SNR range in dB.
        eq_db: the size of the random equalization in dB (0: off); eq_prob: the share of clips equalized.
        lowpass: the range of the low-pass cut-off in Hz (None: off); lowpass_prob: the share of clips.
        resynth: the range of the new pitch in Hz for the LPC re-synthesis (None: off); resynth_prob: the share.
    """

    speed: tuple[float, float] | None = None
    speed_prob: float = 1.0
    eq_db: float = 0.0
    eq_prob: float = 0.5
    lowpass: tuple[float, float] | None = None
    lowpass_prob: float = 0.3
    resynth: tuple[float, float] | None = None
    resynth_prob: float = 0.5
    noises: tuple[str, ...] = ()
    noise_prob: float = 0.5
    noise_snr: tuple[float, float] = (0.0, 20.0)

    def __post_init__(self):
        bad = [n for n in self.noises if n not in NOISES]
        if bad:
            raise ValueError(f"noises must be among {list(NOISES)}, got {bad}")
        if self.speed is not None and not 0 < self.speed[0] <= self.speed[1]:
            raise ValueError(f"speed must be a range 0 < lo <= hi, got {self.speed}")


def equalize(x: Tensor, tilt_db: float, bump_db: float, bump_hz: float, sample_rate: int) -> Tensor:
    """``x`` through the filter ``g(f) = tilt·log2(f/1 kHz) + bump·exp(−log2(f/f_b)²/(2·0.5²))`` dB."""
    spec = torch.fft.rfft(x.double())
    freqs = torch.fft.rfftfreq(x.shape[-1], 1 / sample_rate, dtype=torch.float64).clamp_min(20.0)
    octaves = torch.log2(freqs / 1000.0)
    g_db = tilt_db * octaves + bump_db * torch.exp(-torch.log2(freqs / bump_hz) ** 2 / (2 * 0.5**2))
    return torch.fft.irfft(spec * 10 ** (g_db / 20), n=x.shape[-1]).to(x.dtype)


def lowpass(x: Tensor, cutoff: float, sample_rate: int) -> Tensor:
    """``x`` without frequencies above ``cutoff`` Hz (a raised-cosine taper from 0.9·cutoff to cutoff)."""
    spec = torch.fft.rfft(x.double())
    freqs = torch.fft.rfftfreq(x.shape[-1], 1 / sample_rate, dtype=torch.float64)
    t = ((freqs - 0.9 * cutoff) / (0.1 * cutoff)).clamp(0.0, 1.0)
    return torch.fft.irfft(spec * 0.5 * (1 + torch.cos(torch.pi * t)), n=x.shape[-1]).to(x.dtype)


def _levinson(r: Tensor, order: int) -> tuple[Tensor, Tensor]:
    """Levinson–Durbin on autocorrelations ``r`` ``(..., order + 1)``: the inverse filter ``A`` ``(..., order + 1)``
    (``A_0 = 1``) and the prediction error ``(...,)``."""
    coeffs = torch.zeros(*r.shape[:-1], order + 1, dtype=r.dtype, device=r.device)
    coeffs[..., 0] = 1.0
    err = r[..., 0].clone()
    for i in range(1, order + 1):
        acc = (coeffs[..., :i] * r[..., 1:i + 1].flip(-1)).sum(-1)  # Σ_j a_j r_{i−j}
        k = -acc / err.clamp_min(1e-12)
        prev = coeffs[..., :i + 1].clone()
        coeffs[..., 1:i + 1] = prev[..., 1:i + 1] + k[..., None] * prev[..., :i].flip(-1)
        err = err * (1 - k**2)
    return coeffs, err.clamp_min(0.0)


def lpc_resynthesize(x: Tensor, sample_rate: int, f0: Tensor, generator: torch.Generator | None = None, *,
                     order: int = 18, frame: int = 400, hop: int = 160, n_fft: int = 512) -> Tensor:
    """Clips ``(B, samples)`` re-synthesized from their LPC envelopes with pulse trains at ``f0`` ``(B,)`` Hz
    (module docstring), in the frequency domain: per windowed frame, ``Y(ω) = E(ω) · √(err/frame) / A(ω)``
    (``E`` the windowed excitation), windowed again and overlap-added; each clip keeps its peak level."""
    B, n = x.shape
    x_float = x.float()
    win = torch.hann_window(frame, periodic=False)
    pad = (-(n - frame) % hop) if n > frame else frame - n
    x_padded = torch.nn.functional.pad(x_float, (0, pad))
    frames = x_padded.unfold(-1, frame, hop) * win  # (B, F, frame)
    spec = torch.fft.rfft(frames, n_fft)  # (B, F, n_fft/2+1)
    autocorr = torch.fft.irfft(spec.abs() ** 2, n_fft)[..., :order + 1].double()  # (B, F, order+1) autocorrelation
    # a little white noise: a well-posed system for every frame
    autocorr[..., 0] = autocorr[..., 0] * (1 + 1e-6) + 1e-12
    A, err = _levinson(autocorr, order)  # (B, F, order+1), (B, F)
    A, err = A.float(), err.float()
    A_spectrum = torch.fft.rfft(A, n_fft)  # (B, F, n_fft/2+1)
    resid_ac = torch.fft.irfft((spec * A_spectrum).abs() ** 2, n_fft)  # (B, F, n_fft): the residual's autocorrelation
    min_lag, max_lag = int(sample_rate / 400), int(sample_rate / 80)  # pitch lags 2.5–12.5 ms
    voiced = resid_ac[..., min_lag:max_lag].amax(-1) > 0.3 * resid_ac[..., 0].clamp_min(1e-12)  # (B, F)
    # excitation: a pulse train of unit power at a 1 %-jittered period, or white noise
    total = x_padded.shape[-1]
    period = sample_rate / f0.double()  # (B,)
    count = int((total / period.min()).ceil()) + 2
    steps = period[:, None] * (1 + 0.01 * torch.randn(B, count, generator=generator, dtype=torch.float64))
    times = torch.rand(B, 1, generator=generator, dtype=torch.float64) * period[:, None] + steps.cumsum(1) - steps
    pulses = torch.zeros(B, total)
    idx = times.long()
    keep = idx < total
    pulses[torch.arange(B)[:, None].expand_as(idx)[keep], idx[keep]] = 1.0
    pulses = pulses * period.sqrt().float()[:, None]
    noise = torch.randn(B, total, generator=generator)
    src = torch.where(voiced[..., None], pulses.unfold(-1, frame, hop), noise.unfold(-1, frame, hop)) * win
    gain = (err / frame).sqrt()[..., None]  # (B, F, 1)
    y = torch.fft.irfft(torch.fft.rfft(src, n_fft) * gain / A_spectrum, n_fft)[..., :frame] * win  # (B, F, frame)
    num_frames = frames.shape[1]
    out = torch.zeros(B, total)
    norm = torch.zeros(total)
    for frame_index in range(num_frames):  # overlap-add (F ≈ 100 slices)
        out[:, frame_index * hop:frame_index * hop + frame] += y[:, frame_index]
        norm[frame_index * hop:frame_index * hop + frame] += win**2
    out = out[:, :n] / norm[:n].clamp_min(1e-3)
    peak_in, peak_out = x_float.abs().amax(-1, keepdim=True), out.abs().amax(-1, keepdim=True)
    scale = torch.where(peak_out > 0, peak_in / peak_out.clamp_min(1e-12), torch.zeros_like(peak_out))
    return (out * scale).to(x.dtype)


def speed_perturb(x: Tensor, factor: float) -> Tensor:
    """One clip ``(samples,)`` played ``factor`` times faster, the same length (module docstring)."""
    n = x.shape[-1]
    m = max(2, round(n / factor))
    y = F.interpolate(x[None, None], size=m, mode="linear", align_corners=True)[0, 0]  # (m,)
    if m <= n:
        return F.pad(y, (0, n - m))
    energy = F.pad(y.double().square().cumsum(0), (1, 0))  # (m + 1,)
    start = int(torch.argmax(energy[n:] - energy[:-n]))
    return y[start:start + n]


class WaveFeatures:
    """``augment(waves, generator) → features`` for :class:`~tokennet.data.image_batches.ImageBatches`'s
    ``augment`` hook: the batch source then draws waveforms exactly as it draws precomputed features
    (the same clips in the same order for the same seed), perturbs them (:class:`WaveAugment`, seeded by the
    batch's generator) and turns them into the model's inputs.

    Args:
        augment: a :class:`WaveAugment` (None: no perturbation).
        features: waveforms ``(B, samples)`` → model inputs, e.g. ``lambda w: ast.spectrogram_image(w)[:, None]``.
        words: the babble's word bank (waveforms at ``sample_rate``) when ``"babble"`` is among the noises.
        sample_rate: of the clips.
    """

    def __init__(self, augment: WaveAugment | None, features: Callable[[Tensor], Tensor], *,
                 words: list[np.ndarray] | None = None, sample_rate: int = 16000):
        self.augment, self.features = augment or WaveAugment(), features
        self.words, self.sample_rate = words, sample_rate
        if "babble" in self.augment.noises and not words:
            raise ValueError("babble noise needs a word bank (words=...)")

    def _noise(self, kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
        if kind == "white":
            return white_noise(n, rng)
        if kind == "pink":
            return pink_noise(n, rng)
        return babble_noise(n, self.words, rng, sample_rate=self.sample_rate)

    def perturb(self, x: Tensor, rng: np.random.Generator) -> Tensor:
        """Each clip of ``x`` ``(B, samples)`` perturbed as :attr:`augment` says (a new tensor)."""
        x = x.clone()
        aug = self.augment
        if aug.resynth is not None:  # one batched re-synthesis for the chosen clips
            pick = torch.from_numpy(rng.random(len(x)) < aug.resynth_prob)
            if pick.any():
                pitches = torch.from_numpy(rng.uniform(*aug.resynth, size=int(pick.sum())))
                generator = torch.Generator().manual_seed(int(rng.integers(2**62)))
                x[pick] = lpc_resynthesize(x[pick], self.sample_rate, pitches, generator)
        for item in range(len(x)):
            if aug.speed is not None and rng.random() < aug.speed_prob:
                x[item] = speed_perturb(x[item], float(rng.uniform(*aug.speed)))
            if aug.eq_db > 0 and rng.random() < aug.eq_prob:
                x[item] = equalize(x[item], float(rng.uniform(-0.5, 0.5)) * aug.eq_db,
                                   float(rng.uniform(-1, 1)) * aug.eq_db,
                                   float(np.exp(rng.uniform(np.log(300.0), np.log(5000.0)))), self.sample_rate)
            if aug.lowpass is not None and rng.random() < aug.lowpass_prob:
                x[item] = lowpass(x[item], float(rng.uniform(*aug.lowpass)), self.sample_rate)
            if aug.noises and rng.random() < aug.noise_prob and float(x[item].abs().max()) > 0:
                kind = aug.noises[int(rng.integers(len(aug.noises)))]
                clip = x[item].numpy()
                snr = float(rng.uniform(*aug.noise_snr))
                x[item] = torch.from_numpy(mix_at_snr(clip, self._noise(kind, len(clip), rng), snr, self.sample_rate))
        return x

    def __call__(self, x: Tensor, generator: torch.Generator) -> Tensor:
        rng = np.random.default_rng(int(torch.randint(2**62, (1,), generator=generator)))
        with torch.no_grad():
            return self.features(self.perturb(x, rng))
