"""ViT: the vision transformer, an encoder over image patches (Dosovitskiy et al. 2021).

Reads top to bottom like the paper (https://arxiv.org/abs/2010.11929, eq. 1–4):

    z₀ = [x_cls; x_p¹E; …; x_pᴺE] + E_pos        patch tokens, a <cls> token, positions
    z_ℓ = z_ℓ + MSA(LN(z_ℓ)),  z_ℓ = z_ℓ + MLP(LN(z_ℓ))   L pre-norm blocks (GELU MLP)
    y = Linear(LN(z_L⁰))                           the head: LayerNorm + linear on the <cls> token

With ``pool="mean"`` there is no <cls> token and the head reads the mean of the patch tokens
(as in timm's ``global_pool="avg"``, whose LayerNorm also comes after pooling). The same model
classifies 1-D signals: ``image_size=[L]`` cuts a ``(B, C, L)`` signal into ``(1, p)`` patches.

DeiT (Touvron et al. 2021, https://arxiv.org/abs/2012.12877) adds, with ``distill=True``, a distillation
token beside the class token, ``z₀ = [x_cls; x_dist; x_p¹E; …]``, read by a second head. In training the
class head learns the true label and the distillation head the teacher's hard label::

    L = ½ CE(ψ(z_L^cls), y) + ½ CE(ψ_dist(z_L^dist), y_t),   y_t = argmax teacher(x)

and at test time the two heads' logits are averaged. ``drop_path`` adds stochastic depth to the blocks.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..dropout import Dropout
from ..errors import ConfigError, DataError
from ..layers.drop_path import DropPath, drop_path_rates
from ..layers.init import init_trunc_normal
from ..layers.stack import AttentionMaps, Encoder
from ..position.concat import with_position_mode
from ..position.fourier import Fourier2DPosition
from ..position.learned import LearnedPosition2D
from ..tokens.image import EMBED_MODES, PROJECTIONS, ConvStem, PatchEmbed, grid_size, to_pair
from .registry import CountsParameters, Output, TransformerConfig, register_family, register_preset

__all__ = ["ViTConfig", "ViT", "POOLS", "POSITIONS"]

POOLS = ("cls", "mean")
POSITIONS = ("learned", "fourier", "none")


@dataclass
class ViTConfig(TransformerConfig, defaults=dict(dim=192, num_layers=12, num_heads=3)):
    """Config of :class:`ViT`.

    Args:
        image_size: the training image size: an int (square), ``[H, W]``, or ``[L]`` for 1-D signals.
            Learned and Fourier positions let other sizes through at inference (interpolated).
        patch_size: ``p`` (square patches; ``(1, p)`` for 1-D) or ``[ph, pw]``.
        patch_stride: step between patches; None = patch_size (non-overlapping), smaller = overlapping.
        in_channels: image channels C (1 grey, 3 RGB).
        num_classes: classes of the head.
        dim, num_layers, num_heads: width D, depth L, heads H.
        mlp_ratio: MLP width as a multiple of D.
        dropout: dropout on tokens, attention weights, residual branches and MLP.
        patch_dropout: fraction of patch tokens dropped at random per image during training (PatchDropout,
            Liu et al. 2022, https://arxiv.org/abs/2208.07220): fewer tokens make training steps cheaper and
            regularize; evaluation sees every patch.
        pool: ``"cls"`` (a learned <cls> token) or ``"mean"`` (mean of the patch tokens).
        distill: a DeiT distillation token (after the <cls> token, if any) and its own head; the logits are
            the mean of the two heads'. Train it with targets ``(labels, teacher labels)``.
        drop_path: stochastic depth rate of the last block, growing linearly from 0 at the first (DeiT: 0.1).
        position: ``"learned"`` (interpolated for other sizes), ``"fourier"`` (2-D sin-cos) or ``"none"``.
        position_mode: ``"add"`` (ViT's ``z₀ = [x_cls; x_pE] + E_pos``) or ``"concat"``: the tokens (patches,
            <cls>) are embedded at width ``D − pos_dim`` and each is concatenated with its position's vector,
            ``z₀ = [[x_cls; x_pE] ; E_pos]`` (the lecture: positions may be concatenated instead of added; see
            :mod:`tokennet.position.concat`).
        pos_dim: the position's width ``D_p`` with ``position_mode="concat"`` (``1 <= pos_dim < dim``; a multiple of
            4 for Fourier positions); None with ``"add"``.
        patch_embed: ``"conv"`` or ``"linear"`` (the same weights, see :class:`PatchEmbed`), or
            ``"conv-stem"``: early convolutions with total stride ``patch_size`` (:class:`ConvStem`, ViT_C).
        patch_projection: how the patch matrix ``E`` (the lecture's ``W_tokenize``) is made: ``"learned"``
            (trained, the default), or hard-coded and never trained: ``"random"`` (Gaussian, variance
            ``1 / (C·p²)``, drawn from the run's seed) or ``"dct"`` (the patch's 2-D DCT basis per channel, low
            frequencies first, cut or zero-padded to the width). The lecture: "that could be a learned matrix, or it
            could be somehow hard-coded". Not with ``patch_embed="conv-stem"``.
        stem_width: channels of the conv stem's first convolution (None = ``D / 2^(layers − 1)``, at least
            16); each stride-2 layer doubles them. Only for ``patch_embed="conv-stem"``.
        pad: zero-pad images whose size the patches do not tile (else an error).
        label_smoothing: the loss's label smoothing ε (Szegedy et al. 2016).
        bias: biases in linear layers and LayerNorms.
        norm_eps: LayerNorm epsilon (Hugging Face ViT checkpoints use 1e-12).
        backend: attention backend (``"auto"``, ``"sdpa"``, ``"math"``, ``"flash"``).
    """

    image_size: int | list[int] = 224
    patch_size: int | list[int] = 16
    patch_stride: int | list[int] | None = None
    in_channels: int = 3
    num_classes: int = 1000
    patch_dropout: float = 0.0
    pool: str = "cls"
    distill: bool = False
    drop_path: float = 0.0
    position: str = "learned"
    position_mode: str = "add"
    pos_dim: int | None = None
    patch_embed: str = "conv"
    patch_projection: str = "learned"
    stem_width: int | None = None
    pad: bool = False
    label_smoothing: float = 0.0
    bias: bool = True
    norm_eps: float = 1e-5

    def __post_init__(self):
        self.family = "vit"
        # JSON turns tuples into lists; keep one form so a saved config equals the one it came from.
        for k in ("image_size", "patch_size", "patch_stride"):
            if isinstance(getattr(self, k), tuple):
                setattr(self, k, list(getattr(self, k)))
        self._positive(in_channels=self.in_channels, num_classes=self.num_classes, dim=self.dim,
                       num_layers=self.num_layers, num_heads=self.num_heads)
        self._choice("pool", self.pool, POOLS)
        self._choice("position", self.position, POSITIONS)
        self._choice("patch_embed", self.patch_embed, EMBED_MODES)
        self._choice("patch_projection", self.patch_projection, PROJECTIONS)
        if self.patch_projection != "learned" and self.patch_embed == "conv-stem":
            raise ConfigError(f"patch_projection={self.patch_projection!r} fixes one patch matrix; a conv stem has "
                              "none: use patch_embed='conv' or 'linear'")
        self._mlp_and_backend()
        if self.dim % self.num_heads:
            raise ConfigError(f"num_heads={self.num_heads} must divide dim={self.dim}")
        if isinstance(self.norm_eps, bool) or not isinstance(self.norm_eps, (int, float)) or not self.norm_eps > 0:
            raise ConfigError(f"norm_eps must be a positive number, got {self.norm_eps!r}")
        if self.position == "fourier" and self.dim % 4:
            raise ConfigError(f"position='fourier' needs dim divisible by 4, got dim={self.dim}")
        self._position_mode(multiple=4 if self.position == "fourier" else 1)
        if self.position_mode == "concat" and self.position == "none":
            raise ConfigError("position_mode='concat' needs positions to concatenate: position='learned' or 'fourier'")
        self._fraction(dropout=self.dropout, patch_dropout=self.patch_dropout, label_smoothing=self.label_smoothing,
                       drop_path=self.drop_path)
        one_d = self.is_1d
        for k in ("patch_size", "patch_stride"):
            v = getattr(self, k)
            if one_d and isinstance(v, list) and len(v) != 1:
                raise ConfigError(f"{k} of a 1-D model (image_size=[L]) must be an int or [p], got {v}")
        if self.stem_width is not None:
            self._positive(stem_width=self.stem_width)
            if self.patch_embed != "conv-stem":
                raise ConfigError("stem_width applies to patch_embed='conv-stem' only")
        if self.patch_embed == "conv-stem":
            if one_d or self.patch_stride is not None:
                raise ConfigError("patch_embed='conv-stem' needs 2-D images and patch_stride=None (its stride is "
                                  "patch_size)")
            patch = self.patch_hw
            if patch[0] != patch[1] or patch[0] < 2 or patch[0] & (patch[0] - 1):
                raise ConfigError(f"patch_embed='conv-stem' needs patch_size a power of two >= 2, "
                                  f"got {self.patch_size}")
        try:
            grid_size(self.image_hw, self.patch_hw, self.stride_hw, pad=self.pad_grid)
        except ValueError as err:  # the patches do not tile the image
            raise ConfigError(str(err)) from None

    @property
    def token_dim(self) -> int:
        """The width tokens are embedded at: ``D``, or ``D − pos_dim`` with concatenated positions."""
        return self.dim - self.pos_dim if self.position_mode == "concat" else self.dim

    @property
    def is_1d(self) -> bool:
        """True for 1-D signals (``image_size=[L]``)."""
        return isinstance(self.image_size, list) and len(self.image_size) == 1

    @property
    def image_hw(self) -> tuple[int, int]:
        """``(H, W)``; ``(1, L)`` for 1-D signals."""
        return to_pair(self.image_size, "image_size")

    @property
    def patch_hw(self) -> tuple[int, int]:
        patch = self.patch_size
        return (1, to_pair(patch, "patch_size")[1]) if self.is_1d else to_pair(patch, "patch_size")

    @property
    def stride_hw(self) -> tuple[int, int]:
        stride = self.patch_stride
        if stride is None:
            return self.patch_hw
        return (1, to_pair(stride, "patch_stride")[1]) if self.is_1d else to_pair(stride, "patch_stride")

    @property
    def pad_grid(self) -> bool:
        """Whether the grid rounds up (``pad``, and always for the conv stem's ``⌈H/p⌉``)."""
        return self.pad or self.patch_embed == "conv-stem"

    @property
    def grid(self) -> tuple[int, int]:
        """The patch grid ``(gh, gw)`` at ``image_size``."""
        return grid_size(self.image_hw, self.patch_hw, self.stride_hw, pad=self.pad_grid)

    @property
    def num_prefix(self) -> int:
        """Tokens before the patches: <cls> (``pool="cls"``), then the distillation token (``distill``)."""
        return int(self.pool == "cls") + int(self.distill)

    @property
    def dist_index(self) -> int | None:
        """The distillation token's position, or None."""
        return self.num_prefix - 1 if self.distill else None


class ViT(CountsParameters, nn.Module):
    """Vision transformer classifier: ``forward(images (B, C, H, W), targets=None) → Output(logits, loss)``.

    1-D models (``image_size=[L]``) take signals ``(B, C, L)`` (or ``(B, L)`` when C = 1).
    """

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.config = cfg = config
        d_tok = cfg.token_dim  # D, or D − D_p when the positions are concatenated
        d_pos = cfg.pos_dim if cfg.position_mode == "concat" else cfg.dim
        if cfg.patch_embed == "conv-stem":
            self.patch_embed = ConvStem(cfg.in_channels, d_tok, cfg.patch_hw, width=cfg.stem_width, bias=cfg.bias)
        else:
            self.patch_embed = PatchEmbed(cfg.in_channels, d_tok, cfg.patch_hw, cfg.stride_hw, pad=cfg.pad,
                                          mode=cfg.patch_embed, bias=cfg.bias, projection=cfg.patch_projection)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d_tok)) if cfg.pool == "cls" else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, d_tok)) if cfg.distill else None
        self.pos_emb = None
        if cfg.position == "learned":
            self.pos_emb = LearnedPosition2D(cfg.grid, d_pos, num_prefix=cfg.num_prefix)
        elif cfg.position == "fourier":
            self.pos_emb = Fourier2DPosition(d_pos, cfg.grid, num_prefix=cfg.num_prefix)
        if self.pos_emb is not None:
            # "concat": ConcatPosition([z ; P]), its table the encoding added to zeros; the grid rides in its
            # offset argument (``forward(z, grid)``).
            self.pos_emb = with_position_mode(self.pos_emb, cfg.position_mode, d_pos)
        self.drop = Dropout(cfg.dropout)
        self.encoder = Encoder(cfg.dim, cfg.num_layers, cfg.num_heads, mlp_ratio=cfg.mlp_ratio, norm="pre",
                               dropout=cfg.dropout, activation="gelu", bias=cfg.bias, backend=cfg.backend,
                               norm_eps=cfg.norm_eps, value_proj=cfg.value_proj)
        # The head's LayerNorm closes the pre-norm stack instead of the encoder's own final norm: for
        # <cls> pooling that is the same function, and for mean pooling it normalizes the pooled token.
        self.encoder.norm = nn.Identity()
        # Stochastic depth: a block passes both residual branches (attention, MLP) through its `drop` module (the
        # identity; the sublayers drop their own outputs), so a per-sample DropPath there drops whole branches, with
        # an independent draw per branch (as timm's).
        for blk, rate in zip(self.encoder.layers(), drop_path_rates(cfg.drop_path, cfg.num_layers), strict=True):
            if rate > 0:
                blk.drop = nn.Sequential(blk.drop, DropPath(rate))
        self.head = self._head()
        self.head_dist = self._head() if cfg.distill else None
        self.apply(init_trunc_normal)
        for t in (self.cls_token, self.dist_token):
            if t is not None:
                nn.init.normal_(t, 0.0, 0.02)

    def _head(self) -> nn.Module:
        cfg = self.config
        return nn.Sequential(OrderedDict(
            norm=nn.LayerNorm(cfg.dim, eps=cfg.norm_eps, bias=cfg.bias),
            fc=nn.Linear(cfg.dim, cfg.num_classes, bias=cfg.bias),
        ))

    # -- inputs ------------------------------------------------------------------------------------
    def example_input(self, batch_size: int = 2) -> Tensor:
        """A valid input for tests and tracing: uniform random pixels at the configured size."""
        cfg = self.config
        gen = torch.Generator().manual_seed(0)
        shape = ((batch_size, cfg.in_channels, cfg.image_hw[1]) if cfg.is_1d
                 else (batch_size, cfg.in_channels, *cfg.image_hw))
        return torch.rand(shape, generator=gen)

    def example_targets(self, batch_size: int = 2) -> Tensor:
        """Class ids matching :meth:`example_input`."""
        gen = torch.Generator().manual_seed(1)
        return torch.randint(self.config.num_classes, (batch_size,), generator=gen)

    def _images(self, x: Tensor) -> Tensor:
        """Check the input and return it as ``(B, C, H, W)`` (1-D signals as ``(B, C, 1, L)``)."""
        cfg = self.config
        if cfg.is_1d:
            if x.dim() == 2 and cfg.in_channels == 1:
                x = x[:, None]  # (B, 1, L)
            if x.dim() != 3:
                raise ValueError(f"this 1-D ViT expects signals of shape (B, {cfg.in_channels}, L) with L = "
                                 f"{cfg.image_hw[1]} (image_size={cfg.image_size}), got {tuple(x.shape)}")
            x = x[:, :, None, :]  # (B, C, 1, L)
        elif x.dim() != 4:
            raise ValueError(f"this ViT expects images of shape (B, {cfg.in_channels}, {cfg.image_hw[0]}, "
                             f"{cfg.image_hw[1]}), got {tuple(x.shape)}")
        if x.shape[1] != cfg.in_channels:
            want = f"(B, {cfg.in_channels}, {'L' if cfg.is_1d else 'H, W'})"
            raise ValueError(f"this ViT expects {cfg.in_channels} channel(s) {want}; got shape {tuple(x.shape)} "
                             f"({x.shape[1]} channels)")
        try:
            self.patch_embed.grid(x.shape[-2:])
        except ValueError as err:
            size = "x".join(map(str, x.shape[-2:] if not cfg.is_1d else x.shape[-1:]))
            raise DataError(f"input of size {size} does not fit this ViT (image_size={cfg.image_size}, patch_size="
                            f"{cfg.patch_size}): {err}") from None
        if cfg.position == "none" and tuple(x.shape[-2:]) != cfg.image_hw:
            raise DataError(f"this ViT has no positions to resize: it expects size {cfg.image_hw}, got "
                            f"{tuple(x.shape[-2:])}")
        return x

    # -- the model ---------------------------------------------------------------------------------
    def forward_features(self, x: Tensor, *, return_attention: bool = False):
        """Images → final tokens ``(B, P + N, D)``: the P prefix tokens (<cls>, distillation), then N patches
        row-major.

        With ``return_attention``, ``(tokens, maps)``: each block's weights (see :meth:`Encoder.forward`).

        Images of another size than ``image_size`` are accepted when the patches tile them; learned
        positions are then interpolated bicubically, Fourier positions computed for the new grid.
        """
        x = self._images(x)
        grid = self.patch_embed.grid(x.shape[-2:])
        z = self.patch_embed(x)  # (B, N, D) (D − D_p with concatenated positions)
        B = z.shape[0]
        prefix = [t.expand(B, 1, -1).to(z.dtype) for t in (self.cls_token, self.dist_token) if t is not None]
        if prefix:
            z = torch.cat([*prefix, z], dim=1)  # (B, P + N, D)
        if self.pos_emb is not None:
            z = self.pos_emb(z, grid)  # (B, P + N, D): added, or concatenated to the D − D_p token dims
        if self.training and self.config.patch_dropout > 0:
            z = self._drop_patches(z)
        return self.encoder(self.drop(z), return_weights=return_attention)  # (B, P + N, D)

    def _drop_patches(self, z: Tensor) -> Tensor:
        """Keep a random ``1 − patch_dropout`` of each image's patch tokens (positions already added)."""
        P = self.config.num_prefix
        B, N, D = z.shape[0], z.shape[1] - P, z.shape[2]
        keep = max(1, round(N * (1 - self.config.patch_dropout)))
        idx = torch.rand(B, N, device=z.device).argsort(dim=1)[:, :keep]  # (B, keep): a random subset per image
        kept = z[:, P:].gather(1, idx[:, :, None].expand(B, keep, D))  # (B, keep, D)
        return torch.cat([z[:, :P], kept], dim=1)

    def pool(self, h: Tensor) -> Tensor:
        """Tokens ``(B, P + N, D)`` → one vector per image ``(B, D)``: the <cls> token or the patches' mean."""
        return h[:, 0] if self.config.pool == "cls" else h[:, self.config.num_prefix:].mean(dim=1)

    def forward_heads(self, h: Tensor) -> tuple[Tensor, Tensor | None]:
        """Final tokens → ``(class head logits, distillation head logits or None)``, each ``(B, num_classes)``."""
        cls = self.head(self.pool(h))
        if self.head_dist is None:
            return cls, None
        return cls, self.head_dist(h[:, self.config.dist_index])

    def forward_head(self, h: Tensor) -> Tensor:
        """Final tokens ``(B, P + N, D)`` → class logits ``(B, num_classes)``: pool, LayerNorm, linear (DeiT: the
        mean of the class and distillation heads' logits)."""
        cls, dist = self.forward_heads(h)
        return cls if dist is None else (cls + dist) / 2

    def forward(self, x: Tensor, targets=None) -> Output:
        """Class logits, and the (label-smoothed) cross-entropy when ``targets`` are given: class ids ``(B,)``
        or class probabilities ``(B, num_classes)`` (e.g. from mixup).

        A distilled model (``distill``) takes ``targets = (labels, teacher labels)``: its class head learns the
        labels and its distillation head the teacher's class ids (DeiT's hard distillation, ½ + ½); given
        labels alone, both heads learn them.
        """
        cls, dist = self.forward_heads(self.forward_features(x))  # (B, K) each
        logits = cls if dist is None else (cls + dist) / 2
        loss = None
        if targets is not None:
            labels, teacher = targets if isinstance(targets, (tuple, list)) else (targets, None)
            if teacher is not None and dist is None:
                raise ValueError("teacher labels need a distillation token (distill=True)")
            loss = F.cross_entropy(cls, labels, label_smoothing=self.config.label_smoothing)
            if dist is not None:
                distill_loss = (F.cross_entropy(dist, labels, label_smoothing=self.config.label_smoothing)
                                if teacher is None else F.cross_entropy(dist, teacher))
                loss = (loss + distill_loss) / 2
        return Output(logits, loss)

    # -- inspection --------------------------------------------------------------------------------
    def attention_maps(self, x: Tensor) -> AttentionMaps:
        """Every layer's attention ``A = softmax(Q Kᵀ / √E)``: ``{"self": [(B, H, P + N, P + N)] * L}``.

        Computed with the plain formula whatever the backend, so a model trained with a fused kernel can
        be inspected. Token 0 is <cls> when ``pool="cls"``, then the distillation token (``distill``), then the
        patches row-major.

        Args:
            x: images, as for :meth:`forward`.
        """
        _, maps = self.forward_features(x, return_attention=True)
        return {"self": [m["self"] for m in maps]}

    def position_table(self, grid: tuple[int, int] | None = None) -> Tensor:
        """The patch positions ``(gh·gw, D)`` the model adds (learned: interpolated to ``grid``); ``(gh·gw, D_p)``
        the ones it concatenates."""
        cfg = self.config
        grid = cfg.grid if grid is None else grid
        enc = getattr(self.pos_emb, "encoding", self.pos_emb)  # the additive encoding inside ConcatPosition
        if isinstance(enc, LearnedPosition2D):
            return enc.interpolate(grid)[cfg.num_prefix:].detach()
        if isinstance(enc, Fourier2DPosition):
            z = torch.zeros(1, cfg.num_prefix + grid[0] * grid[1],
                            cfg.pos_dim if cfg.position_mode == "concat" else cfg.dim)
            return enc(z, grid)[0, cfg.num_prefix:]
        raise ValueError("this ViT has no position embeddings (position='none')")


register_family("vit", ViTConfig, ViT)
register_preset("vit", "vit", "ViT-Ti/16 (DeiT-Tiny shape): 224×224 RGB, 16×16 patches, 12 layers × 192, 1000 classes")
register_preset("vit-digits", "vit", "ViT for 8×8 digits: overlapping 4×4 patches at stride 2 (3×3 = 9 tokens), "
                "4 layers × 64, mean pooling",
                image_size=8, patch_size=4, patch_stride=2, in_channels=1, num_classes=10, dim=64,
                num_layers=4, num_heads=4, mlp_ratio=2.0, pool="mean", label_smoothing=0.1)
register_preset("vit-fashion", "vit", "ViT_C for 28×28 Fashion-MNIST: a conv stem makes 4×4 = 16 tokens (8×8 cells), "
                "1 block × 96 (the depth 10 CPU minutes pay for best), mean pooling",
                image_size=28, patch_size=8, patch_embed="conv-stem", in_channels=1, num_classes=10, dim=96,
                num_layers=1, num_heads=4, mlp_ratio=2.0, pool="mean", label_smoothing=0.1)
register_preset("vit-1d", "vit", "ViT for 1-D signals (MNIST-1D, length 40): overlapping patches of 8 at stride 2 "
                "(17 tokens), 4 layers × 64",
                image_size=[40], patch_size=8, patch_stride=2, in_channels=1, num_classes=10, dim=64, num_layers=4,
                num_heads=4, mlp_ratio=2.0, pool="mean", label_smoothing=0.1)
register_preset("vit-micro", "vit", "ViT, 16×16 RGB, 4×4 patches, 2 layers × 32 (tests and demos)",
                image_size=16, patch_size=4, in_channels=3, num_classes=10, dim=32, num_layers=2, num_heads=2)
register_preset("deit-micro", "vit", "DeiT: ViT-micro with a distillation token and stochastic depth (tests and demos)",
                image_size=16, patch_size=4, in_channels=3, num_classes=10, dim=32, num_layers=2, num_heads=2,
                distill=True, drop_path=0.1)
