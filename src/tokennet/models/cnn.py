"""Convolutional networks: a plain conv stack and a small ResNet, the receptive field, FiLM conditioning.

The transformer's foil in the lecture: *"you chop it up into pieces, you process with filters, you aggregate
the results"*. A convolution ``y[i] = Σ_{t} w[t] · x[i·s + t·d]`` (kernel ``k``, stride ``s``, dilation ``d``)
mixes only a window of its input, so after a stack of them each output unit sees a bounded window of the
image, its **receptive field** (:func:`receptive_field`):

    r_0 = 1, j_0 = 1;   r_ℓ = r_{ℓ−1} + d_ℓ (k_ℓ − 1) · j_{ℓ−1},   j_ℓ = j_{ℓ−1} · s_ℓ

(``r`` the field's size in input pixels, ``j`` the distance between neighbouring units' fields). *"No neuron
in the output has gotten dye from both x1 and x7"* is ``r < 7``: a decision that depends jointly on two
inputs farther apart than ``r`` cannot be made by any unit.

The head is global average pooling and one linear layer (as in ResNet, He et al. 2016,
https://arxiv.org/abs/1512.03385), so the logits are a *sum of local votes*: ``logits = W · mean_u h_u =
mean_u (W h_u)``, each ``h_u`` a function of one receptive field. When the field is smaller than the
distance between two things, the logits are additive in them — enough to count, not enough to compare.

Two architectures share one trunk (:class:`ConvTrunk`): ``arch="plain"`` (conv → norm → ReLU per layer) and
``arch="resnet"`` (basic residual blocks of two 3×3 convolutions). Stage ``i`` has ``widths[i]`` channels
and ``depths[i]`` blocks; every stage after the first halves the resolution (stride 2 in its first block).
A block can be conditioned by FiLM (Perez et al. 2018, https://arxiv.org/abs/1709.07871): after its last
normalization, ``h ← (1 + γ) ⊙ h + β`` with ``(γ, β)`` computed from something else (a question,
:mod:`tokennet.models.vqa`). The ``cnn`` family is the image classifier; its ``example_input`` and
``forward`` match :class:`~tokennet.models.vit.ViT`'s, so a CNN run is an image-classifier run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..dropout import Dropout
from ..errors import ConfigError
from ..layers.init import init_conv_weights
from ..tokens.image import to_pair
from .registry import CountsParameters, ModelConfig, Output, register_family, register_preset

__all__ = ["ReceptiveField", "receptive_field", "ConvTrunkConfig", "ConvTrunk", "CNNConfig", "CNN", "ARCHS",
           "NORMS"]

ARCHS = ("plain", "resnet")
NORMS = ("batch", "none")


@dataclass(frozen=True)
class ReceptiveField:
    """What one output unit of a conv stack sees: ``size`` input positions, units ``jump`` positions apart,
    the first unit's field starting at ``start`` (negative: it reaches into the padding)."""

    size: int
    jump: int
    start: int

    def covers(self, extent: int) -> bool:
        """Whether one unit's field spans ``extent`` input positions (two inputs ``extent − 1`` apart)."""
        return self.size >= extent


def receptive_field(layers, *, paddings=None) -> ReceptiveField:
    """The receptive field of a stack of convolutions, first layer first.

    ``r_ℓ = r_{ℓ−1} + d_ℓ (k_ℓ − 1) j_{ℓ−1}``, ``j_ℓ = j_{ℓ−1} s_ℓ``, ``start_ℓ = start_{ℓ−1} − p_ℓ j_{ℓ−1}``
    (Araujo et al. 2019, *Computing receptive fields of CNNs*, https://distill.pub/2019/computing-receptive-fields/).

    Args:
        layers: ``(kernel, stride, dilation)`` per layer (``(kernel, stride)`` means dilation 1). Pooling
            layers count as layers too (a 2×2 max-pool is ``(2, 2)``).
        paddings: zero padding per layer (default: none), which only moves ``start``.
    """
    field, j, start = 1, 1, 0
    layers = list(layers)
    paddings = [0] * len(layers) if paddings is None else list(paddings)
    if len(paddings) != len(layers):
        raise ValueError(f"{len(layers)} layers but {len(paddings)} paddings")
    for layer, pad in zip(layers, paddings, strict=True):
        k, stride, dilation = (*layer, 1) if len(layer) == 2 else layer
        if min(k, stride, dilation) < 1:
            raise ValueError(f"kernel, stride and dilation must be >= 1, got {layer}")
        field += dilation * (k - 1) * j
        start -= pad * j
        j *= stride
    return ReceptiveField(field, j, start)


# -- the trunk --------------------------------------------------------------------------------------------------
@dataclass
class ConvTrunkConfig(ModelConfig):
    """The convolutional part shared by the ``cnn`` classifier and the ``vqa-cnn`` baseline.

    Args:
        arch: ``"plain"`` (conv–norm–ReLU layers) or ``"resnet"`` (basic residual blocks).
        in_channels: image channels.
        widths: channels of each stage.
        depths: blocks (plain: conv layers) per stage.
        stem_kernel, stem_stride: the first convolution (in_channels → widths[0]); a stem with kernel =
            stride = p is a patchify stem (one unit per p × p patch).
        kernel_size: the blocks' kernel (odd: "same" padding).
        dilation: the blocks' dilation (widens the field without more parameters).
        norm: ``"batch"`` (BatchNorm; per channel at inference, so the field stays local) or ``"none"``.
    """

    arch: str = "resnet"
    in_channels: int = 3
    widths: list[int] = field(default_factory=lambda: [32, 64, 128])
    depths: list[int] = field(default_factory=lambda: [1, 1, 1])
    stem_kernel: int = 3
    stem_stride: int = 1
    kernel_size: int = 3
    dilation: int = 1
    norm: str = "batch"

    def _check_trunk(self, *, one_per_stage: bool = True) -> None:
        """Check the trunk's fields; ``one_per_stage=False`` lets ``widths`` and ``depths`` differ in length (a
        trunk that repeats their last entries: :class:`~tokennet.models.strided_cnn.StridedTrunk`)."""
        self._choice("arch", self.arch, ARCHS)
        self._choice("norm", self.norm, NORMS)
        for k in ("widths", "depths"):
            v = getattr(self, k)
            if isinstance(v, tuple):
                setattr(self, k, list(v))
            if not isinstance(getattr(self, k), list) or not getattr(self, k):
                raise ConfigError(f"{k} must be a non-empty list of positive integers, got {v!r}")
            for x in getattr(self, k):
                self._positive(**{k: x})
        if one_per_stage and len(self.widths) != len(self.depths):
            raise ConfigError(f"widths {self.widths} and depths {self.depths} must have one entry per stage")
        self._positive(in_channels=self.in_channels, stem_kernel=self.stem_kernel, stem_stride=self.stem_stride,
                       kernel_size=self.kernel_size, dilation=self.dilation)
        if self.kernel_size % 2 == 0:
            raise ConfigError(f"kernel_size must be odd (same padding), got {self.kernel_size}")

    def __post_init__(self):
        self._check_trunk()


def _norm(kind: str, c: int) -> nn.Module:
    return nn.BatchNorm2d(c) if kind == "batch" else nn.Identity()


class _Block(nn.Module):
    """One block: plain ``conv → norm → [FiLM] → ReLU``, or residual ``relu(F(x) + shortcut(x))`` with
    ``F = conv → norm → ReLU → conv → norm → [FiLM]``."""

    def __init__(self, arch: str, c_in: int, c_out: int, k: int, stride: int, dilation: int, norm: str,
                 padding: int | None = None):
        super().__init__()
        pad = dilation * (k - 1) // 2 if padding is None else padding  # None: "same"; 0: "valid"
        bias = norm == "none"
        self.arch, self.stride, self.k, self.dilation, self.pad = arch, stride, k, dilation, pad
        self.conv1 = nn.Conv2d(c_in, c_out, k, stride, pad, dilation=dilation, bias=bias)
        self.norm1 = _norm(norm, c_out)
        if arch == "resnet":
            self.conv2 = nn.Conv2d(c_out, c_out, k, 1, pad, dilation=dilation, bias=bias)
            self.norm2 = _norm(norm, c_out)
            self.shortcut = nn.Identity() if stride == 1 and c_in == c_out else nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=bias), _norm(norm, c_out))

    def layers(self) -> list[tuple[tuple[int, int, int], int]]:
        """``((kernel, stride, dilation), padding)`` of the convolutions on the longest path."""
        first = ((self.k, self.stride, self.dilation), self.pad)
        return [first] if self.arch == "plain" else [first, ((self.k, 1, self.dilation), self.pad)]

    def forward(self, x: Tensor, film: tuple[Tensor, Tensor] | None = None) -> Tensor:
        feats = self.norm1(self.conv1(x))
        if self.arch == "resnet":
            feats = self.norm2(self.conv2(F.relu(feats)))
        if film is not None:
            gamma, beta = film  # (B, C) each
            feats = (1 + gamma[:, :, None, None]) * feats + beta[:, :, None, None]
        return F.relu(feats + self.shortcut(x)) if self.arch == "resnet" else F.relu(feats)


class ConvTrunk(nn.Module):
    """Stem and stages: images ``(B, C, H, W)`` → feature map ``(B, widths[-1], H', W')``."""

    def __init__(self, c: ConvTrunkConfig):
        super().__init__()
        self.stem = nn.Conv2d(c.in_channels, c.widths[0], c.stem_kernel, c.stem_stride,
                              (c.stem_kernel - 1) // 2 if c.stem_kernel != c.stem_stride else 0,
                              bias=c.norm == "none")
        self.stem_norm = _norm(c.norm, c.widths[0])
        blocks, c_in = [], c.widths[0]
        for i, (width, n) in enumerate(zip(c.widths, c.depths, strict=True)):
            for block_index in range(n):
                blocks.append(_Block(c.arch, c_in, width, c.kernel_size, 2 if i > 0 and block_index == 0 else 1,
                                     c.dilation, c.norm))
                c_in = width
        self.blocks = nn.ModuleList(blocks)
        self.out_channels = c_in

    def film_channels(self) -> list[int]:
        """The channels each block's FiLM ``(γ, β)`` must have, in order."""
        return [block.conv1.out_channels for block in self.blocks]

    def layer_specs(self) -> tuple[list[tuple[int, int, int]], list[int]]:
        """``(layers, paddings)`` of the longest path, for :func:`receptive_field`."""
        stem = self.stem
        layers, pads = [(stem.kernel_size[0], stem.stride[0], 1)], [stem.padding[0]]
        for block in self.blocks:
            for spec, pad in block.layers():
                layers.append(spec)
                pads.append(pad)
        return layers, pads

    def receptive_field(self) -> ReceptiveField:
        """The receptive field of one unit of the output feature map (the longest path: residual shortcuts
        are shorter)."""
        layers, pads = self.layer_specs()
        return receptive_field(layers, paddings=pads)

    def forward(self, x: Tensor, films: list[tuple[Tensor, Tensor]] | None = None) -> Tensor:
        feats = F.relu(self.stem_norm(self.stem(x)))  # (B, widths[0], H/stem_stride, W/stem_stride)
        for i, blk in enumerate(self.blocks):
            feats = blk(feats, None if films is None else films[i])
        return feats  # (B, widths[-1], H', W')


# -- the classifier ---------------------------------------------------------------------------------------------
@dataclass
class CNNConfig(ConvTrunkConfig):
    """Config of :class:`CNN` (the trunk's fields, then the classifier's).

    Args:
        image_size: the training image size (int or ``[H, W]``; any size works at inference: the head pools).
        num_classes: classes of the head.
        dropout: dropout before the head.
        label_smoothing: the loss's label smoothing.
    """

    image_size: int | list[int] = 28
    num_classes: int = 10
    dropout: float = 0.0
    label_smoothing: float = 0.0

    def __post_init__(self):
        self.family = "cnn"
        self._check_trunk()
        if isinstance(self.image_size, tuple):
            self.image_size = list(self.image_size)
        to_pair(self.image_size, "image_size")
        self._positive(num_classes=self.num_classes)
        self._fraction(dropout=self.dropout, label_smoothing=self.label_smoothing)

    @property
    def image_hw(self) -> tuple[int, int]:
        return to_pair(self.image_size, "image_size")

    @property
    def is_1d(self) -> bool:  # the image-classification task asks (a CNN here is 2-D)
        return False

    @property
    def num_layers(self) -> int:
        """Convolutions on the longest path: the stem and each block's (one plain, two residual)."""
        return 1 + sum(self.depths) * (1 if self.arch == "plain" else 2)


class CNN(CountsParameters, nn.Module):
    """A CNN image classifier: ``forward(images (B, C, H, W), targets=None) → Output(logits, loss)``.

    ``logits = W · GAP(trunk(x)) + b``: global average pooling, then one linear layer.
    """

    def __init__(self, config: CNNConfig):
        super().__init__()
        self.config = cfg = config
        self.trunk = ConvTrunk(cfg)
        self.drop = Dropout(cfg.dropout)
        self.head = nn.Linear(self.trunk.out_channels, cfg.num_classes)
        self.apply(init_conv_weights)

    def receptive_field(self) -> ReceptiveField:
        return self.trunk.receptive_field()

    def example_input(self, batch_size: int = 2) -> Tensor:
        cfg = self.config
        return torch.rand((batch_size, cfg.in_channels, *cfg.image_hw), generator=torch.Generator().manual_seed(0))

    def example_targets(self, batch_size: int = 2) -> Tensor:
        return torch.randint(self.config.num_classes, (batch_size,), generator=torch.Generator().manual_seed(1))

    def _check(self, x: Tensor) -> None:
        cfg = self.config
        if x.dim() != 4 or x.shape[1] != cfg.in_channels:
            raise ValueError(f"this CNN expects images (B, {cfg.in_channels}, H, W), got {tuple(x.shape)}")

    def forward_features(self, x: Tensor) -> Tensor:
        """Images → the last feature map ``(B, C', H', W')``."""
        self._check(x)
        return self.trunk(x)

    def forward_head(self, h: Tensor) -> Tensor:
        """Feature map → logits ``(B, K)``: global average pooling, dropout, linear."""
        return self.head(self.drop(h.mean((2, 3))))  # (B, K)

    def forward(self, x: Tensor, targets: Tensor | None = None) -> Output:
        logits = self.forward_head(self.forward_features(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits, targets, label_smoothing=self.config.label_smoothing)
        return Output(logits, loss)

    def class_activation_map(self, x: Tensor, cls: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """CAM (Zhou et al. 2016, https://arxiv.org/abs/1512.04150): ``M_c(u) = w_c · h_u``, the local vote
        of every unit for class ``c`` (their mean plus the bias is the logit). Returns ``(maps (B, H', W'),
        classes (B,))`` for the predicted class (or ``cls``)."""
        feats = self.forward_features(x)  # (B, C', H', W')
        if cls is None:
            cls = self.forward_head(feats).argmax(-1)
        class_weight = self.head.weight[cls]  # (B, C')
        return torch.einsum("bc,bchw->bhw", class_weight, feats), cls


register_family("cnn", CNNConfig, CNN)
register_preset("cnn", "cnn", "a small ResNet classifier: 3 stages 32/64/128, one basic block each, GAP + linear "
                "(28×28 grey, 10 classes)")
register_preset("cnn-plain", "cnn", "a plain conv stack: conv–BN–ReLU, stages 32/64/128, one layer each",
                arch="plain")
register_preset("cnn-fashion", "cnn", "ResNet for 28×28 Fashion-MNIST: a stride-2 stem, stages 24/48/96, one block "
                "each", widths=[24, 48, 96], stem_stride=2)
register_preset("cnn-digits", "cnn", "ResNet for 8×8 digits: stages 16/32, one block each",
                image_size=8, widths=[16, 32], depths=[1, 1])
