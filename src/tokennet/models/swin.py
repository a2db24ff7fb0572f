"""Swin: a hierarchical vision transformer with shifted windows (Liu et al. 2021, https://arxiv.org/abs/2103.14030).

Reads top to bottom like the paper's Figure 3:

    z = LN(PatchEmbed(x))                          patches of p × p pixels → a (h, w) grid of C-wide tokens
    stage s = 1 … S:  d_s blocks, alternately W-MSA and SW-MSA (layers/windowed.py), width C·2^(s−1)
                      then patch merging (grid / 2, width × 2), except after the last stage
    y = Linear(mean_tokens(LN(z)))                 the head: LayerNorm, global average pool, linear

Attention is local (M × M windows, cost linear in the number of tokens); the shifted windows of every
second block connect neighbouring windows, and merging makes the windows of later stages cover more of the
image, as a CNN's receptive field grows. Positions are a learned relative bias inside each window
(position/relative_bias.py); there is no absolute position embedding (Swin's default). A grid no larger
than the window on an axis is one window there (the last stages of small images attend globally).

``image_size=[L]`` makes a 1-D Swin for signals ``(B, C, L)``: ``(1, p)`` patches, windows of ``(1, M)``,
merging of neighbouring pairs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..dropout import Dropout
from ..errors import ConfigError, DataError
from ..layers.drop_path import drop_path_rates
from ..layers.init import init_trunc_normal
from ..layers.stack import AttentionMaps
from ..layers.windowed import PatchMerging, SwinBlock
from ..tokens.image import EMBED_MODES, ConvStem, PatchEmbed, grid_size, to_pair
from .registry import CountsParameters, ModelConfig, Output, register_family, register_preset

__all__ = ["SwinConfig", "Swin"]


@dataclass
class SwinConfig(ModelConfig):
    """Config of :class:`Swin`.

    Args:
        image_size: an int (square), ``[H, W]``, or ``[L]`` for 1-D signals.
        patch_size: ``p`` of the patch embedding (square; ``(1, p)`` for 1-D).
        in_channels: image channels C.
        num_classes: classes of the head.
        dim: width of the first stage, C (doubled by each patch merging).
        depths: blocks per stage (Swin-T: ``[2, 2, 6, 2]``); an even depth alternates W-MSA and SW-MSA.
        num_heads: heads of the first stage, doubled with the width (the head width ``dim / num_heads`` is
            the same in every stage).
        window_size: the window M (tokens per side).
        mlp_ratio: MLP width as a multiple of the stage's width.
        dropout: dropout on attention weights, outputs and MLP.
        drop_path: stochastic depth rate of the last block; it grows linearly from 0 over the blocks.
        patch_embed: ``"conv"``, ``"linear"`` or ``"conv-stem"`` (see :class:`~tokennet.models.vit.ViTConfig`).
        stem_width: first channels of a conv stem (None: its default).
        pad: zero-pad images whose size the patches do not tile (else an error).
        label_smoothing: the loss's label smoothing ε.
        bias: biases in linear layers and LayerNorms.
        norm_eps: LayerNorm epsilon.
        backend: attention backend.
    """

    image_size: int | list[int] = 224
    patch_size: int | list[int] = 4
    in_channels: int = 3
    num_classes: int = 1000
    dim: int = 96
    depths: list[int] = field(default_factory=lambda: [2, 2, 6, 2])
    num_heads: int = 3
    window_size: int = 7
    mlp_ratio: float = 4.0
    dropout: float = 0.0
    drop_path: float = 0.0
    patch_embed: str = "conv"
    stem_width: int | None = None
    pad: bool = False
    label_smoothing: float = 0.0
    bias: bool = True
    norm_eps: float = 1e-5
    backend: str = "auto"

    def __post_init__(self):
        self.family = "swin"
        for k in ("image_size", "patch_size", "depths"):
            if isinstance(getattr(self, k), tuple):
                setattr(self, k, list(getattr(self, k)))
        self._positive(in_channels=self.in_channels, num_classes=self.num_classes, dim=self.dim,
                       num_heads=self.num_heads, window_size=self.window_size)
        if not isinstance(self.depths, list) or not self.depths:
            raise ConfigError(f"depths must be a non-empty list of blocks per stage, got {self.depths!r}")
        self._positive(**{f"depths[{i}]": depth for i, depth in enumerate(self.depths)})
        self._choice("patch_embed", self.patch_embed, EMBED_MODES)
        self._mlp_and_backend()
        if self.dim % self.num_heads:
            raise ConfigError(f"num_heads={self.num_heads} must divide dim={self.dim}")
        self._fraction(dropout=self.dropout, drop_path=self.drop_path, label_smoothing=self.label_smoothing)
        if isinstance(self.norm_eps, bool) or not isinstance(self.norm_eps, (int, float)) or not self.norm_eps > 0:
            raise ConfigError(f"norm_eps must be a positive number, got {self.norm_eps!r}")
        if self.is_1d and isinstance(self.patch_size, list) and len(self.patch_size) != 1:
            raise ConfigError(f"patch_size of a 1-D model (image_size=[L]) must be an int or [p], "
                              f"got {self.patch_size}")
        if self.stem_width is not None:
            self._positive(stem_width=self.stem_width)
            if self.patch_embed != "conv-stem":
                raise ConfigError("stem_width applies to patch_embed='conv-stem' only")
        if self.patch_embed == "conv-stem":
            patch = self.patch_hw
            if self.is_1d or patch[0] != patch[1] or patch[0] < 2 or patch[0] & (patch[0] - 1):
                raise ConfigError(f"patch_embed='conv-stem' needs 2-D images and patch_size a power of two >= 2, "
                                  f"got patch_size={self.patch_size}")
        try:
            grid_size(self.image_hw, self.patch_hw, pad=self.pad_grid)
        except ValueError as err:
            raise ConfigError(str(err)) from None

    @property
    def is_1d(self) -> bool:
        return isinstance(self.image_size, list) and len(self.image_size) == 1

    @property
    def image_hw(self) -> tuple[int, int]:
        return to_pair(self.image_size, "image_size")

    @property
    def patch_hw(self) -> tuple[int, int]:
        patch = self.patch_size
        return (1, to_pair(patch, "patch_size")[1]) if self.is_1d else to_pair(patch, "patch_size")

    @property
    def stride_hw(self) -> tuple[int, int]:
        return self.patch_hw

    @property
    def pad_grid(self) -> bool:
        """Whether the grid rounds up (``pad``, and always for the conv stem's ``⌈H/p⌉``)."""
        return self.pad or self.patch_embed == "conv-stem"

    @property
    def grid(self) -> tuple[int, int]:
        """The first stage's token grid at ``image_size``."""
        return grid_size(self.image_hw, self.patch_hw, pad=self.pad_grid)

    @property
    def merge_factor(self) -> tuple[int, int]:
        return (1, 2) if self.is_1d else (2, 2)

    @property
    def num_layers(self) -> int:
        """Blocks in all (the depth a report or a picture counts)."""
        return sum(self.depths)

    @property
    def num_prefix(self) -> int:
        return 0  # no <cls> token: the head averages the last stage's tokens

    def stage_dims(self) -> list[int]:
        return [self.dim * 2**stage for stage in range(len(self.depths))]

    def stage_heads(self) -> list[int]:
        return [self.num_heads * 2**stage for stage in range(len(self.depths))]

    def stage_grids(self, grid: tuple[int, int] | None = None) -> list[tuple[int, int]]:
        """Each stage's token grid (merging rounds odd sizes up)."""
        current = self.grid if grid is None else tuple(grid)
        out = []
        for _ in self.depths:
            out.append(current)
            current = tuple(-(-n // factor) for n, factor in zip(current, self.merge_factor, strict=True))
        return out


class SwinStage(nn.Module):
    """``depth`` Swin blocks (W-MSA, SW-MSA, W-MSA, ...) and, unless it is the last stage, a patch merging."""

    def __init__(self, c: SwinConfig, s: int, rates: list[float]):
        super().__init__()
        dim, heads, grid = c.stage_dims()[s], c.stage_heads()[s], c.stage_grids()[s]
        window = (min(c.window_size, grid[0]), min(c.window_size, grid[1]))  # a small grid is one window
        self.blocks = nn.ModuleList(
            SwinBlock(dim, heads, window, shifted=i % 2 == 1, mlp_ratio=c.mlp_ratio, dropout=c.dropout,
                      drop_path=rates[i], bias=c.bias, norm_eps=c.norm_eps, backend=c.backend)
            for i in range(c.depths[s]))
        last = s == len(c.depths) - 1
        self.merge = None if last else PatchMerging(dim, 2 * dim, factor=c.merge_factor, norm_eps=c.norm_eps,
                                                    bias=c.bias)


class Swin(CountsParameters, nn.Module):
    """Swin classifier: ``forward(images (B, C, H, W), targets=None) → Output(logits, loss)``."""

    def __init__(self, config: SwinConfig):
        super().__init__()
        self.config = cfg = config
        if cfg.patch_embed == "conv-stem":
            self.patch_embed = ConvStem(cfg.in_channels, cfg.dim, cfg.patch_hw, width=cfg.stem_width, bias=cfg.bias)
        else:
            self.patch_embed = PatchEmbed(cfg.in_channels, cfg.dim, cfg.patch_hw, cfg.patch_hw, pad=cfg.pad,
                                          mode=cfg.patch_embed, bias=cfg.bias)
        self.embed_norm = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps, bias=cfg.bias)  # Swin's patch_norm
        self.drop = Dropout(cfg.dropout)
        rates = drop_path_rates(cfg.drop_path, cfg.num_layers)
        starts = [sum(cfg.depths[:stage]) for stage in range(len(cfg.depths))]
        self.stages = nn.ModuleList(SwinStage(cfg, stage, rates[starts[stage]:starts[stage] + cfg.depths[stage]])
                                    for stage in range(len(cfg.depths)))
        width = cfg.stage_dims()[-1]
        self.norm = nn.LayerNorm(width, eps=cfg.norm_eps, bias=cfg.bias)
        self.head = nn.Linear(width, cfg.num_classes, bias=cfg.bias)
        self.apply(init_trunc_normal)

    # -- inputs ------------------------------------------------------------------------------------
    def example_input(self, batch_size: int = 2) -> Tensor:
        cfg = self.config
        gen = torch.Generator().manual_seed(0)
        shape = ((batch_size, cfg.in_channels, cfg.image_hw[1]) if cfg.is_1d
                 else (batch_size, cfg.in_channels, *cfg.image_hw))
        return torch.rand(shape, generator=gen)

    def example_targets(self, batch_size: int = 2) -> Tensor:
        gen = torch.Generator().manual_seed(1)
        return torch.randint(self.config.num_classes, (batch_size,), generator=gen)

    def _images(self, x: Tensor) -> Tensor:
        """Check the input and return it as ``(B, C, H, W)`` (1-D signals as ``(B, C, 1, L)``)."""
        cfg = self.config
        if cfg.is_1d:
            if x.dim() == 2 and cfg.in_channels == 1:
                x = x[:, None]  # (B, 1, L)
            if x.dim() != 3:
                raise ValueError(f"this 1-D Swin expects signals of shape (B, {cfg.in_channels}, L), got "
                                 f"{tuple(x.shape)}")
            x = x[:, :, None, :]  # (B, C, 1, L)
        elif x.dim() != 4:
            raise ValueError(f"this Swin expects images of shape (B, {cfg.in_channels}, H, W), got {tuple(x.shape)}")
        if x.shape[1] != cfg.in_channels:
            raise ValueError(f"this Swin expects {cfg.in_channels} channel(s); got shape {tuple(x.shape)}")
        try:
            self.patch_embed.grid(x.shape[-2:])
        except ValueError as err:
            size = "x".join(map(str, x.shape[-2:] if not cfg.is_1d else x.shape[-1:]))
            raise DataError(f"input of size {size} does not fit this Swin (patch_size={cfg.patch_size}): "
                            f"{err}") from None
        return x

    # -- the model ---------------------------------------------------------------------------------
    def forward_features(self, x: Tensor, *, return_attention: bool = False):
        """Images → the last stage's tokens, normalized, ``(B, h·w, D_last)`` row-major.

        With ``return_attention``, ``(tokens, maps)``: per block, first block first, ``{"self": (B, H, L, L)}``
        on that block's grid (zero outside each token's window), and ``grids``: each block's grid.
        """
        x = self._images(x)
        grid_h, grid_w = self.patch_embed.grid(x.shape[-2:])
        z = self.embed_norm(self.patch_embed(x))  # (B, N, C)
        z = self.drop(z).view(z.shape[0], grid_h, grid_w, -1)  # (B, gh, gw, C): tokens stay a grid
        maps = []
        for stage in self.stages:
            for blk in stage.blocks:
                z = blk(z, return_weights=return_attention)
                if return_attention:
                    z, weights = z
                    maps.append({**weights, "grid": tuple(z.shape[1:3])})
            if stage.merge is not None:
                z = stage.merge(z)  # (B, ⌈gh/2⌉, ⌈gw/2⌉, 2·D)
        feats = self.norm(z.flatten(1, 2))  # (B, L, D_last)
        return (feats, maps) if return_attention else feats

    def forward_head(self, h: Tensor) -> Tensor:
        """Final tokens ``(B, L, D)`` → logits ``(B, num_classes)``: the mean token, then a linear layer."""
        return self.head(h.mean(dim=1))

    def forward(self, x: Tensor, targets: Tensor | None = None) -> Output:
        """Class logits, and the (label-smoothed) cross-entropy when ``targets`` are given: class ids ``(B,)``
        or class probabilities ``(B, num_classes)`` (mixup, cutmix)."""
        logits = self.forward_head(self.forward_features(x))  # (B, K)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits, targets, label_smoothing=self.config.label_smoothing)
        return Output(logits, loss)

    # -- inspection --------------------------------------------------------------------------------
    def attention_maps(self, x: Tensor) -> AttentionMaps:
        """Every block's window attention on its whole grid: ``{"self": [(B, H, L, L)] * blocks}`` (the grids
        shrink from stage to stage; a pair in different windows has weight 0). Plain formula, any backend."""
        _, maps = self.forward_features(x, return_attention=True)
        return {"self": [m["self"] for m in maps]}

    def block_layouts(self, grid: tuple[int, int] | None = None) -> list[dict]:
        """Per block: ``stage``, ``grid``, ``layout`` (:class:`~tokennet.attention.windows.WindowLayout`) and the
        token's size in input pixels (``cell``), for drawing the windows on an image."""
        cfg = self.config
        grids = cfg.stage_grids(grid)
        out = []
        for stage_index, stage in enumerate(self.stages):
            cell = (cfg.patch_hw[0] * cfg.merge_factor[0] ** stage_index,
                    cfg.patch_hw[1] * cfg.merge_factor[1] ** stage_index)
            for blk in stage.blocks:
                out.append({"stage": stage_index, "grid": grids[stage_index],
                            "layout": blk.attn.layout(grids[stage_index]), "cell": cell})
        return out


register_family("swin", SwinConfig, Swin)
register_preset("swin-t", "swin", "Swin-T: 224×224 RGB, 4×4 patches, C = 96, depths 2-2-6-2, heads 3-6-12-24, "
                "7×7 windows, 1000 classes", drop_path=0.2)
register_preset("swin-micro", "swin", "Swin, 16×16 RGB, 2×2 patches (8×8 grid), C = 16, depths 2-2, 4×4 windows "
                "(tests and demos)", image_size=16, patch_size=2, in_channels=3, num_classes=10, dim=16,
                depths=[2, 2], num_heads=2, window_size=4, mlp_ratio=2.0)
