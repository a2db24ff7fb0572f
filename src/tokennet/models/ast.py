"""AST: the Audio Spectrogram Transformer, a ViT over the patches of a log-mel spectrogram.

Gong, Chung and Glass 2021, https://arxiv.org/abs/2104.01778: a waveform becomes a log-mel
spectrogram (128 mel bins there, 10 ms frames), the spectrogram — a one-channel image of
``mels × frames`` — is cut into overlapping 16×16 patches (stride 10), and a ViT classifies the
patch tokens (98.1% on Speech Commands V2). Here the model is composed of existing pieces and nothing
else:

    S = standardize(max(log(Mᵀ |STFT(x)|² + ε), max S − 60 dB))   per clip (tokens.audio.LogMelSpectrogram)
    S ← warp(S), SpecAugment(S)                     training only: a random frequency warp (VTLP) and
                                                    frequency and time masks (Park et al. 2019)
    logits = ViT(S as a (B, 1, mels, frames) image)  :class:`~tokennet.models.vit.ViT`, unchanged

Each clip's log-mel spectrogram is floored ``top_db`` = 60 dB below its loudest bin, then standardized to
mean 0 and variance 1 over all its bins (no dataset statistics to store, and the loudness of a recording
does not matter); ``normalize="mel"`` first subtracts each mel band's mean over the clip's time (cepstral
mean normalization, Atal 1974, on the log-mel bands: a fixed filter on the signal — a channel, a
synthesizer's or a speaker's average spectral envelope — adds a constant to each band's log energy, and
this removes it). The training clips are noisy: without the floor, a clean file's digital silence (``log ε``)
put 4 of 10 clean espeak-ng words off a model that scored 99% on the noisy held-out voices; with it, 10 of
10, at the same 99% (measured by applying the floor at inference to that model). SpecAugment
(https://arxiv.org/abs/1904.08779) sets ``num_masks`` random bands of up to ``freq_mask`` mel bins and
``num_masks`` random spans of up to ``time_mask`` frames to 0 (the standardized mean) in training. With
``freq_warp`` = w > 0, each training spectrogram is first warped along frequency by a factor
α ~ U(1 − w, 1 + w), ``S'(f) = S(f / α)`` (vocal tract length perturbation, Jaitly & Hinton 2013: a
longer or shorter vocal tract scales the formants), by linear interpolation between mel bands.

Inputs are waveforms ``(B, samples)`` at ``sample_rate``, at most ``clip_samples`` long (shorter clips are
zero-padded at the end), or the standardized spectrograms ``(B, 1, mels, frames)`` that
:meth:`AST.spectrogram_image` returns (``[:, None]``): the front end has no parameters, so a recipe computes
them once for a whole dataset instead of at every step. The patch grid and the positions are those of
``clip_samples``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import ConfigError, DataError
from ..tokens.audio import MEL_SCALES, LogMelSpectrogram, hz_to_mel, mel_to_hz
from .registry import register_family, register_preset
from .vit import ViT, ViTConfig

__all__ = ["ASTConfig", "AST", "spec_augment", "freq_warp", "NORMALIZE"]

NORMALIZE = ("clip", "mel")


@dataclass
class ASTConfig(ViTConfig):
    """Config of :class:`AST`: a :class:`~tokennet.models.vit.ViTConfig` plus the spectrogram's settings.

    Args:
        sample_rate: samples per second the model takes (files are resampled to it).
        clip_samples: the longest clip, in samples (1 s at 16 kHz = 16000); shorter ones are zero-padded.
        n_fft: FFT size and Hann window length (400 = 25 ms at 16 kHz).
        hop_length: samples between frames (160 = 10 ms at 16 kHz); frames = 1 + clip_samples // hop_length.
        n_mels: mel filters: the spectrogram's height.
        f_min, f_max: the band of the mel filters in Hz (f_max None = sample_rate / 2).
        mel_scale: ``"htk"`` (2595 log10(1 + f/700)) or ``"slaney"``.
        top_db: floor each clip's log-mel spectrogram this many dB below its loudest bin (None: no floor), so
            that digital silence in a clean file looks like a quiet noise floor, as in the (noisy) training clips.
        freq_mask, time_mask: SpecAugment's widest frequency band (mel bins) and time span (frames); 0 = off.
        num_masks: masks of each kind per clip.
        normalize: ``"clip"`` (standardize over all bins) or ``"mel"`` (subtract each band's time mean first).
        freq_warp: the largest relative frequency warp in training (VTLP), 0 = off.
        image_size: derived, ``[n_mels, frames]``; leave it unset.
        in_channels: 1 (the spectrogram).

    The other fields are the ViT's (patch_size, patch_stride, dim, num_layers, pool, position, ...).
    """

    image_size: int | list[int] | None = None
    in_channels: int = 1
    num_classes: int = 10
    sample_rate: int = 16000
    clip_samples: int = 16000
    n_fft: int = 400
    hop_length: int = 160
    n_mels: int = 64
    f_min: float = 0.0
    f_max: float | None = None
    mel_scale: str = "htk"
    top_db: float | None = 60.0
    freq_mask: int = 0
    time_mask: int = 0
    num_masks: int = 2
    normalize: str = "clip"
    freq_warp: float = 0.0

    def __post_init__(self):
        self._positive(sample_rate=self.sample_rate, clip_samples=self.clip_samples, n_fft=self.n_fft,
                       hop_length=self.hop_length, n_mels=self.n_mels)
        self._choice("mel_scale", self.mel_scale, MEL_SCALES)
        self._choice("normalize", self.normalize, NORMALIZE)
        if isinstance(self.freq_warp, bool) or not 0 <= self.freq_warp < 0.5:
            raise ConfigError(f"freq_warp must be in [0, 0.5) (a relative warp), got {self.freq_warp!r}")
        for k in ("freq_mask", "time_mask", "num_masks"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"{k} must be an integer >= 0, got {v!r}")
        if self.top_db is not None and (isinstance(self.top_db, bool) or not self.top_db > 0):
            raise ConfigError(f"top_db must be a positive number of decibels or None, got {self.top_db!r}")
        if self.n_fft > self.clip_samples:
            raise ConfigError(f"n_fft={self.n_fft} is longer than the clip ({self.clip_samples} samples)")
        f_max = self.sample_rate / 2 if self.f_max is None else self.f_max
        if not 0 <= self.f_min < f_max <= self.sample_rate / 2:
            raise ConfigError(f"the mel band needs 0 <= f_min < f_max <= sample_rate/2 = {self.sample_rate / 2}, "
                              f"got f_min={self.f_min}, f_max={self.f_max}")
        derived = [self.n_mels, 1 + self.clip_samples // self.hop_length]
        if isinstance(self.image_size, tuple):
            self.image_size = list(self.image_size)
        if self.image_size is not None and self.image_size != derived:
            raise ConfigError(f"image_size of an AST is the spectrogram's [n_mels, frames] = {derived}; leave it "
                              f"unset (got {self.image_size})")
        self.image_size = derived
        if self.in_channels != 1:
            raise ConfigError(f"an AST takes a one-channel spectrogram: in_channels must be 1, got {self.in_channels}")
        super().__post_init__()
        if self.is_1d:
            raise ConfigError("an AST's spectrogram is 2-D")
        self.family = "ast"

    @property
    def num_frames(self) -> int:
        return self.image_size[1]


def spec_augment(spec: Tensor, freq_mask: int, time_mask: int, num_masks: int) -> Tensor:
    """SpecAugment's masks on ``(B, mels, frames)``: per clip, ``num_masks`` bands of width
    ``U{0..freq_mask}`` mel bins and ``num_masks`` spans of ``U{0..time_mask}`` frames set to 0."""
    B, M, T = spec.shape
    keep = torch.ones(B, M, T, dtype=torch.bool, device=spec.device)
    for size, width, axis in ((M, freq_mask, 1), (T, time_mask, 2)):
        if width == 0:
            continue
        pos = torch.arange(size, device=spec.device)
        for _ in range(num_masks):
            mask_width = torch.randint(0, width + 1, (B, 1), device=spec.device)  # (B, 1)
            start = (torch.rand(B, 1, device=spec.device) * (size - mask_width + 1)).long()  # (B, 1)
            band = (pos >= start) & (pos < start + mask_width)  # (B, size)
            keep &= ~(band[:, :, None] if axis == 1 else band[:, None, :])
    return spec * keep


def freq_warp(spec: Tensor, fbank_hz: Tensor, alpha: Tensor) -> Tensor:
    """Warp spectrograms ``(B, mels, frames)`` along frequency: band m takes the value the unwarped
    spectrogram has at ``f_m / α_b`` (``fbank_hz``: the bands' centre frequencies ``(mels,)``, ascending;
    ``alpha`` ``(B,)``), linearly interpolated between bands, the edge bands repeated beyond the ends."""
    B, M, T = spec.shape
    src = fbank_hz[None, :] / alpha[:, None]  # (B, M): where each band reads from, in Hz
    pos = torch.searchsorted(fbank_hz.contiguous(), src.contiguous()).clamp(1, M - 1)  # (B, M) right neighbour
    low, high = fbank_hz[pos - 1], fbank_hz[pos]
    t = ((src - low) / (high - low)).clamp(0.0, 1.0)[..., None]  # (B, M, 1)
    left = spec.gather(1, (pos - 1)[..., None].expand(B, M, T))
    right = spec.gather(1, pos[..., None].expand(B, M, T))
    return left + t * (right - left)


class AST(ViT):
    """Audio Spectrogram Transformer: ``forward(waveforms (B, samples), targets=None) → Output(logits, loss)``.

    Everything after the spectrogram is the :class:`~tokennet.models.vit.ViT`: ``attention_maps`` returns
    its maps over the spectrogram's patches (row-major over (mel, frame)), ``<cls>`` first if any.
    """

    def __init__(self, config: ASTConfig):
        super().__init__(config)
        cfg = config
        self.spectrogram = LogMelSpectrogram(cfg.sample_rate, cfg.n_fft, cfg.hop_length, cfg.n_mels, cfg.f_min,
                                             cfg.f_max, cfg.mel_scale, top_db=cfg.top_db)

    def example_input(self, batch_size: int = 2) -> Tensor:
        """Waveforms: tones of a few random frequencies with noise, ``(B, clip_samples)``."""
        cfg = self.config
        gen = torch.Generator().manual_seed(0)
        t = torch.arange(cfg.clip_samples) / cfg.sample_rate
        freq = 100 + torch.rand(batch_size, 1, generator=gen) * (cfg.sample_rate / 4)
        return (0.5 * torch.sin(2 * torch.pi * freq * t)
                + 0.01 * torch.randn(batch_size, cfg.clip_samples, generator=gen))

    def spectrogram_image(self, wave: Tensor) -> Tensor:
        """Waveforms ``(B, ≤ clip_samples)`` → standardized log-mel spectrograms ``(B, mels, frames)``."""
        cfg = self.config
        if wave.dim() == 1:
            wave = wave[None]
        if wave.dim() != 2 or not wave.dtype.is_floating_point:
            raise DataError(f"an AST takes float waveforms (B, samples) at {cfg.sample_rate} Hz, got "
                            f"{tuple(wave.shape)} {wave.dtype}")
        if wave.shape[1] > cfg.clip_samples:
            raise DataError(f"the clip has {wave.shape[1]} samples, more than the model's maximum {cfg.clip_samples} "
                            f"({cfg.clip_samples / cfg.sample_rate:.2f} s at {cfg.sample_rate} Hz)")
        wave = F.pad(wave, (0, cfg.clip_samples - wave.shape[1]))  # (B, clip_samples)
        spec = self.spectrogram(wave)  # (B, mels, frames)
        if cfg.normalize == "mel":  # cepstral mean normalization: each band's mean over time
            spec = spec - spec.mean(dim=2, keepdim=True)
        spec = (spec - spec.mean(dim=(1, 2), keepdim=True)) / (spec.std(dim=(1, 2), keepdim=True) + 1e-5)
        return spec

    def band_centres(self) -> Tensor:
        """Centre frequency (Hz) of each mel band ``(mels,)``: the peak of its triangle (equally spaced mels)."""
        cfg = self.config
        f_max = cfg.sample_rate / 2 if cfg.f_max is None else cfg.f_max
        low, high = (hz_to_mel(torch.tensor(float(freq_hz), dtype=torch.float64), cfg.mel_scale)
                     for freq_hz in (cfg.f_min, f_max))
        return mel_to_hz(torch.linspace(low, high, cfg.n_mels + 2, dtype=torch.float64), cfg.mel_scale)[1:-1].float()

    def _images(self, x: Tensor) -> Tensor:
        """Waveforms ``(B, samples)``, or spectrograms ``(B, 1, mels, frames)`` from :meth:`spectrogram_image`
        (a recipe computes them once instead of every step), → the ViT's image ``(B, 1, mels, frames)``."""
        cfg = self.config
        if x.dim() == 4:
            if tuple(x.shape[1:]) != (1, cfg.n_mels, cfg.num_frames):
                raise DataError(f"an AST takes waveforms (B, samples) or spectrograms (B, 1, {cfg.n_mels}, "
                                f"{cfg.num_frames}), got {tuple(x.shape)}")
            spec = x[:, 0]
        else:
            spec = self.spectrogram_image(x)
        if self.training and cfg.freq_warp > 0:
            alpha = 1 + (torch.rand(len(spec), device=spec.device) * 2 - 1) * cfg.freq_warp  # (B,)
            spec = freq_warp(spec, self.band_centres().to(spec.device, spec.dtype), alpha)
        if self.training and (cfg.freq_mask or cfg.time_mask) and cfg.num_masks:
            spec = spec_augment(spec, cfg.freq_mask, cfg.time_mask, cfg.num_masks)
        return super()._images(spec[:, None])  # (B, 1, mels, frames)


register_family("ast", ASTConfig, AST)
register_preset("ast", "ast", "AST as in the paper's shape, scaled to ViT-Ti: 128 mels, 16×16 patches at stride 10, "
                "12 layers × 192", n_mels=128, clip_samples=160000, patch_size=16, patch_stride=10, pad=True,
                dim=192, num_layers=12, num_heads=3, num_classes=527)
register_preset("ast-digits", "ast", "AST for 1-s spoken digits on 2 CPU cores: 40 mels × 101 frames, a conv stem "
                "(ViT_C) makes 5×13 = 65 tokens of 8×8 cells, 2 layers × 64, mean pooling, SpecAugment",
                n_mels=40, patch_size=8, patch_embed="conv-stem", dim=64, num_layers=2, num_heads=4,
                mlp_ratio=2.0, pool="mean", position="learned", freq_mask=6, time_mask=12, label_smoothing=0.1)
register_preset("ast-digits-patches", "ast", "AST for 1-s spoken digits, the paper's tokenizer scaled down: 40 mels × "
                "101 frames cut into overlapping 8×8 patches at stride 4 (9×25 = 225 tokens), 2 layers × 64",
                n_mels=40, patch_size=8, patch_stride=4, pad=True, dim=64, num_layers=2, num_heads=4,
                mlp_ratio=2.0, pool="mean", position="learned", freq_mask=6, time_mask=12, label_smoothing=0.1)
