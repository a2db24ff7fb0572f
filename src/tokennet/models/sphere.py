"""Sphere transformer: patches of a spherical signal are tokens; positions absolute or by angle only.

    T⁰ = patches(f) W_in (+ W_pos Y(c_i))         patch tokens (+ real SH of the centre, degree ≤ L,
                                                   or + W_c P(c_i·u), the angle to the signal's centroid u)
    Tˡ = Block(Tˡ⁻¹; bias)                         pre-norm blocks
    y  = head(LN(mean_i T^L_i))                    mean over the patches

``position`` picks how attention learns where patches are:

- ``"sh"``: absolute positions, a linear map of the real spherical harmonics of each centre
  (:class:`~tokennet.position.spherical.SphericalHarmonicsPosition`) — knows where north is.
- ``"angle-bias"``: a *rotation-invariant* additive bias, the sphere's relative position. By the
  addition theorem, ``Σ_m Y_lm(x) Y_lm(y) = (2l+1)/(4π) P_l(x·y)`` depends on the angle between x and y
  only, so per head h a learned weighting of the degrees,

      b_h(i, j) = Σ_{l=0..L} w_hl · (2l+1)/(4π) · P_l(c_i · c_j),

  is a learned function of the angle between patch centres (a Legendre series: any smooth zonal kernel),
  with ``w = GAIN · w'`` for the learned ``w'``, started as a locality prior (see :class:`AngleBias`).
- ``"angle-bias+centroid"``: the same bias, and each token told its angle to the signal's centre of mass
  u (:class:`CentroidPosition`, a Legendre series in c_i·u): still invariant, since u turns with the
  signal; the bias alone cannot say which patches lie in the middle of the pattern, and learns slowly.
- ``"frame"``: the angle bias, and absolute SH positions of the centres *in the signal's own frame*
  (:func:`~tokennet.tokens.sphere.signal_frame`: the centroid u and the principal axis e1),
  ``W Y(F c_i)``. The frame turns with the signal, so the positions do too: invariant, and as informative
  as absolute positions on an upright image. e1 has no sign, so the model is a frame average over the
  half-turn about u: in training each signal gets one of the two frames at random; in evaluation the
  output is the mean of both frames' probabilities, ``log ½(p(·|F) + p(·|F'))``.
- ``"none"``: a set model.

With ``position="angle-bias"`` or ``"angle-bias+centroid"`` and ``descriptor="rings"`` or ``"zonal"``
(patch descriptors invariant to a rotation about the centre) nothing in the model knows an orientation:
rotating the signal permutes and resamples the tokens and leaves the output unchanged — exactly for
rotations that map the grids onto themselves, approximately (resampling error) for others; ``"zonal"``,
smooth in the rotation, keeps that error small. ``position="frame"`` with ``descriptor="zonal-frame"``
(the zonal coefficients with their orientation kept, relative to the frame's axis) is invariant the same
way and far more accurate: on the digits (400 steps × 32) NR/NR 70 → 88 %, NR/R 69 → 86 %
(``bench/sphere_invariant.py`` has the steps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..dropout import Dropout
from ..layers.stack import AttentionMaps, Encoder
from ..position.spherical import SphericalHarmonicsPosition
from ..tokens.sphere import DESCRIPTORS, SpherePatches, signal_frame, to_angles
from .registry import CountsParameters, Output, TransformerConfig, register_family, register_preset

__all__ = ["SphereConfig", "SphereTransformer", "AngleBias", "CentroidPosition", "legendre", "POSITIONS"]

POSITIONS = ("sh", "angle-bias", "angle-bias+centroid", "frame", "none")


def legendre(t: Tensor, L: int) -> Tensor:
    """Legendre polynomials ``P_0..P_L`` at t, ``(..., L+1)``, by Bonnet's recurrence
    ``(l+1) P_{l+1} = (2l+1) t P_l − l P_{l−1}``."""
    polys = [torch.ones_like(t), t]
    for deg in range(1, L):
        polys.append(((2 * deg + 1) * t * polys[deg] - deg * polys[deg - 1]) / (deg + 1))
    return torch.stack(polys[: L + 1], dim=-1)


class AngleBias(nn.Module):
    """Per-head bias from the angle between patch centres: ``b_h(i, j) = G Σ_l w_hl (2l+1)/(4π) P_l(c_i·c_j)``.

    Args:
        L: the largest degree.
        num_heads: H.
    """

    GAIN = 16.0

    def __init__(self, L: int, num_heads: int):
        super().__init__()
        self.L = L
        # The bias is GAIN · Σ_l w_hl k_l: Adam moves w by ~lr a step, and a useful bias is O(10), so the
        # gain lets it get there in hundreds of steps rather than thousands. It starts as a locality prior,
        # ALiBi's idea on the sphere (Press et al. 2022, https://arxiv.org/abs/2108.12409): b_h = s_h cos(angle)
        # with slopes s_h = 0, 2, 4, 8, … (degree 1 only: (2·1+1)/(4π) P_1 = 3/(4π) cos): one head global.
        weight = torch.zeros(num_heads, L + 1)
        if L >= 1:
            slopes = torch.tensor([0.0] + [2.0 ** (1 + head % 3) for head in range(num_heads - 1)])
            weight[:, 1] = slopes * 4 * math.pi / 3 / self.GAIN
        self.weight = nn.Parameter(weight)

    def forward(self, centres: Tensor) -> Tensor:
        """``(N, 3)`` unit centres → ``(1, H, N, N)`` bias."""
        cos = (centres @ centres.T).clamp(-1.0, 1.0)  # (N, N)
        scale = torch.tensor([(2 * deg + 1) / (4 * math.pi) for deg in range(self.L + 1)], dtype=cos.dtype,
                             device=cos.device)
        k = legendre(cos, self.L) * scale  # (N, N, L+1): the addition theorem's zonal kernels
        return self.GAIN * (k.to(self.weight.dtype) @ self.weight.T).permute(2, 0, 1)[None]  # (1, H, N, N)


class CentroidPosition(nn.Module):
    """Each token's angle to the signal's centre of mass, as a learned Legendre series:

        u   = Σ_j |f(s_j)| s_j / ‖Σ_j |f(s_j)| s_j‖        (channels summed; the signal's mean direction)
        p_i = W · (P_0(c_i·u), …, P_L(c_i·u))                 (N, D), added to the patch tokens

    A rotation R of the signal turns u into R u (up to quadrature), and c_i·Ru = (Rᵀc_i)·u: the position
    moves with the signal, like the descriptors, so it keeps the model invariant while telling each token
    how far from the middle of the pattern it lies (which the angle bias alone, a function of c_i·c_j,
    cannot). Meant for a pattern on a zero background (the projected images): a large constant offset
    would leave Σ_j |f(s_j)| s_j near 0 and u ill-defined. A zero signal has no direction: u = 0 then,
    and every token gets W·P(0).

    Args:
        L: the largest degree.
        dim: D.
    """

    def __init__(self, L: int, dim: int):
        super().__init__()
        self.L = L
        self.proj = nn.Linear(L + 1, dim)

    def forward(self, signal: Tensor, samples: Tensor, centres: Tensor) -> Tensor:
        """``signal (B, C, M)``, ``samples (M, 3)``, ``centres (N, 3)`` → ``(B, N, D)``."""
        mass = signal.abs().sum(1).to(samples.dtype)  # (B, M)
        centre = F.normalize(mass @ samples, dim=-1)  # (B, 3)
        t = (centre @ centres.T).clamp(-1.0, 1.0)  # (B, N)
        return self.proj(legendre(t, self.L).to(self.proj.weight.dtype))


@dataclass
class SphereConfig(TransformerConfig, defaults=dict(dim=48, mlp_ratio=2.0)):
    """Config of :class:`SphereTransformer`.

    Args:
        num_classes, in_channels: classes K and signal channels C.
        num_centres: N patch centres (tokens).
        num_samples: M points of the input signal's grid.
        patch_size: samples per patch.
        rings: distance rings per patch (divides patch_size, except with ``descriptor="zonal"``, which does not
            use patch_size).
        descriptor: ``"ordered"`` (local frame), ``"rings"`` (rotation-invariant per ring), ``"zonal"``
            (smooth invariant ring-kernel quadrature; uses every sample within 4·√(4/N) rad, not patch_size)
            or ``"zonal-frame"`` (the same, oriented by the signal's frame; needs ``position="frame"``).
        position: ``"sh"``, ``"angle-bias"``, ``"angle-bias+centroid"`` (the bias plus
            :class:`CentroidPosition`), ``"frame"`` (the bias plus SH positions in the signal's frame) or ``"none"``.
        sh_degree: L, the largest degree of the harmonics (or Legendre polynomials).
        dim, num_layers, num_heads, mlp_ratio, dropout, backend: the encoder.
    """

    num_classes: int = 10
    in_channels: int = 1
    num_centres: int = 256
    num_samples: int = 2048
    patch_size: int = 16
    rings: int = 4
    descriptor: str = "zonal"
    position: str = "angle-bias+centroid"
    sh_degree: int = 8

    def __post_init__(self):
        self.family = "sphere"
        self._positive(num_classes=self.num_classes, in_channels=self.in_channels, num_centres=self.num_centres,
                       num_samples=self.num_samples, patch_size=self.patch_size, rings=self.rings, dim=self.dim,
                       num_layers=self.num_layers, num_heads=self.num_heads)
        self._choice("descriptor", self.descriptor, DESCRIPTORS)
        self._choice("position", self.position, POSITIONS)
        self._fraction(dropout=self.dropout)
        self._mlp_and_backend()
        from ..errors import ConfigError

        if isinstance(self.sh_degree, bool) or not isinstance(self.sh_degree, int) or self.sh_degree < 0:
            raise ConfigError(f"sh_degree must be an integer >= 0, got {self.sh_degree!r}")
        if self.num_classes < 2:
            raise ConfigError(f"a classifier needs num_classes >= 2, got {self.num_classes}")
        if self.descriptor == "zonal-frame" and self.position != "frame":
            raise ConfigError(f"descriptor='zonal-frame' is oriented by the signal's frame: it needs position='frame', "
                              f"got {self.position!r}")
        if not self.descriptor.startswith("zonal") and self.patch_size % self.rings:  # zonal: no patch_size
            raise ConfigError(f"rings={self.rings} must divide patch_size={self.patch_size}")
        if self.patch_size > self.num_samples:
            raise ConfigError(f"patch_size={self.patch_size} exceeds num_samples={self.num_samples}")
        if self.dim % self.num_heads:
            raise ConfigError(f"num_heads={self.num_heads} must divide dim={self.dim}")


class SphereTransformer(CountsParameters, nn.Module):
    """``forward(signal (B, C, M), targets=None) → Output(logits (B, num_classes), loss)``."""

    def __init__(self, config: SphereConfig):
        super().__init__()
        self.config = cfg = config
        self.patches = SpherePatches(cfg.num_centres, cfg.num_samples, cfg.patch_size, cfg.rings, cfg.descriptor)
        self.patch_proj = nn.Linear(self.patches.out_features(cfg.in_channels), cfg.dim)
        self.pos = SphericalHarmonicsPosition(cfg.sh_degree, cfg.dim) if cfg.position in ("sh", "frame") else None
        self.angle_bias = AngleBias(cfg.sh_degree, cfg.num_heads) if cfg.position.startswith("angle-bias") or \
            cfg.position == "frame" else None
        self.centroid = CentroidPosition(cfg.sh_degree, cfg.dim) if cfg.position == "angle-bias+centroid" else None
        self.drop = Dropout(cfg.dropout) if cfg.dropout > 0 else nn.Identity()
        self.encoder = Encoder(cfg.dim, cfg.num_layers, cfg.num_heads, mlp_ratio=cfg.mlp_ratio, norm="pre",
                               dropout=cfg.dropout, backend=cfg.backend, value_proj=cfg.value_proj)
        self.head = nn.Linear(cfg.dim, cfg.num_classes)

    @property
    def centres(self) -> Tensor:
        """The patch centres ``(N, 3)``, one per token."""
        return self.patches.centres

    @property
    def samples(self) -> Tensor:
        """The input grid ``(M, 3)``: where a signal must be sampled."""
        return self.patches.samples

    def frame(self, x: Tensor, half_turn: Tensor | None = None) -> Tensor:
        """The signal's frame ``(B, 3, 3)`` (rows e1, e2, u); ``half_turn`` ``(B,)`` bool: use (−e1, −e2, u)."""
        sig_frame = signal_frame(x, self.samples)
        if half_turn is not None:
            flip = 1.0 - 2.0 * half_turn.to(sig_frame.dtype)  # (B,): −1 where turned
            sig_frame = sig_frame * torch.stack([flip, flip, torch.ones_like(flip)], dim=1)[:, :, None]
        return sig_frame

    def forward_features(self, signal: Tensor, *, return_attention: bool = False, half_turn: Tensor | None = None):
        """Patch tokens after the encoder ``(B, N, D)``.

        With ``position="frame"``, ``half_turn`` ``(B,)`` picks each signal's frame; default: a random one in
        training, the first in evaluation (:meth:`forward` averages over both).
        """
        cfg = self.config
        x = self.patches.check(signal, cfg.in_channels).to(self.patch_proj.weight.dtype)
        frame = None
        if cfg.position == "frame":
            if half_turn is None:
                half_turn = torch.rand(len(x), device=x.device) < 0.5 if self.training else \
                    torch.zeros(len(x), dtype=torch.bool, device=x.device)
            frame = self.frame(x, half_turn)
        feats = self.patch_proj(self.patches(x, frame))  # (B, N, D)
        if frame is not None:
            theta, phi = to_angles(torch.einsum("nj,bij->bni", self.centres, frame))  # centres in the frame (B, N)
            feats = feats + self.pos(theta, phi)  # (B, N, D)
        elif self.pos is not None:
            theta, phi = to_angles(self.centres)
            feats = feats + self.pos(theta, phi)  # (N, D) broadcast over B
        if self.centroid is not None:
            feats = feats + self.centroid(x, self.samples, self.centres)  # (B, N, D)
        bias = self.angle_bias(self.centres) if self.angle_bias is not None else None
        return self.encoder(self.drop(feats), bias=bias, return_weights=return_attention)

    def pool(self, h: Tensor) -> Tensor:
        """Tokens ``(B, N, D)`` → one vector per signal ``(B, D)``: the mean over patches, invariant to their order
        (what the head reads)."""
        return h.mean(1)

    def forward_head(self, h: Tensor) -> Tensor:
        return self.head(self.pool(h))

    def forward(self, signal: Tensor, targets: Tensor | None = None) -> Output:
        if self.config.position == "frame" and not self.training:  # the frame average: log ½(p(·|F) + p(·|F'))
            B = signal.shape[0]
            log_probs = [F.log_softmax(self.forward_head(self.forward_features(signal, half_turn=torch.full(
                (B,), t, dtype=torch.bool, device=signal.device))).float(), -1) for t in (False, True)]
            logits = torch.logsumexp(torch.stack(log_probs), 0) - math.log(2)  # (B, K) log-probabilities
        else:
            logits = self.forward_head(self.forward_features(signal))  # (B, K)
        loss = F.cross_entropy(logits, targets) if targets is not None else None
        return Output(logits, loss)

    def attention_maps(self, signal: Tensor) -> AttentionMaps:
        """Every layer's attention between patches, plain formula: ``{"self": [(B, H, N, N)] * L}``."""
        _, maps = self.forward_features(signal, return_attention=True)
        return {"self": [m["self"] for m in maps]}

    # -- examples for tests --------------------------------------------------------------------
    def example_input(self, batch_size: int = 2) -> Tensor:
        gen = torch.Generator().manual_seed(0)
        return torch.rand(batch_size, self.config.in_channels, self.config.num_samples, generator=gen)

    def example_targets(self, batch_size: int = 2) -> Tensor:
        gen = torch.Generator().manual_seed(1)
        return torch.randint(self.config.num_classes, (batch_size,), generator=gen)


register_family("sphere", SphereConfig, SphereTransformer)
register_preset("sphere-small", "sphere", "Sphere transformer: 256 patches (2,048-point Fibonacci grid), zonal "
                "descriptors, 2 layers × 48, rotation-invariant angle bias + centroid angle (Legendre, L=8)")
register_preset("sphere-micro", "sphere", "Sphere transformer, 48 patches of 8 samples, 1 layer × 32 (tests)",
                num_centres=48, num_samples=256, patch_size=8, rings=2, sh_degree=4, dim=32, num_layers=1,
                num_heads=2)
