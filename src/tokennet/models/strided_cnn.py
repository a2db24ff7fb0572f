"""An all-convolutional trunk strided down to **one output unit**, whose receptive field is a window of the picture.

The pooled CNN (:class:`~tokennet.models.cnn.ConvTrunk` then global average pooling) answers with the mean of
hundreds of local votes; when only a few central units see two far-apart things, their votes are diluted by all
the others. Here nothing is pooled (all-convolutional, as in Springenberg et al. 2015,
https://arxiv.org/abs/1412.6806): strided convolutions halve the map until one unit is left, and the answer is
read from that unit alone. What it can see is exactly its receptive field, so a sweep over the field asks the
lecture's question directly — *"if the receptive fields are big enough, it can do it"*.

The field is a window of ``window`` pixels centred on the picture (:func:`centre_window`): a patchify stem
(kernel = stride = ``p``) turns it into a ``g × g`` grid, ``g = window / p``, and unpadded ("valid") strided
convolutions (:func:`reduction_kernels`: kernel 3 on an odd grid, 2 on an even one, stride 2) take the grid to
``1 × 1``. Each valid layer uses every unit it is given, so the one output unit sees the whole window and
nothing else: its receptive field is ``window`` pixels (the formula, :meth:`StridedTrunk.receptive_field`,
and autograd agree; ``tests/models/test_strided_cnn.py``). Before each reduction, ``depths[i] − 1`` blocks of
stride 1 ("same" padding inside the window: they add depth, not field) can be added, and every block can be
conditioned by FiLM as the pooled trunk's are.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ConfigError
from .cnn import ConvTrunkConfig, ReceptiveField, _Block, _norm

__all__ = ["reduction_kernels", "centre_window", "check_window", "StridedTrunk"]


def reduction_kernels(grid: int) -> list[int]:
    """Kernels of the valid stride-2 convolutions that take a ``grid × grid`` map to ``1 × 1``: 3 on an odd
    grid (``g → (g − 1)/2``), 2 on an even one (``g → g/2``); ``[]`` for a grid of 1."""
    if grid < 1:
        raise ValueError(f"grid must be >= 1, got {grid}")
    kernels = []
    while grid > 1:
        kernel = 3 if grid % 2 else 2
        kernels.append(kernel)
        grid = (grid - kernel) // 2 + 1
    return kernels


def centre_window(x: Tensor, window: int) -> Tensor:
    """The centred ``window × window`` crop of images ``(B, C, H, W)`` (``window`` ≤ H, W)."""
    H, W = x.shape[-2:]
    top, left = (H - window) // 2, (W - window) // 2
    return x[..., top:top + window, left:left + window]


def check_window(config: ConvTrunkConfig, window: int, image_size: int) -> None:
    """A window the trunk can build: at most the picture, a whole number of patchify-stem patches."""
    if isinstance(window, bool) or not isinstance(window, int):
        raise ConfigError(f"window must be a whole number of pixels, got {window!r}")
    if config.stem_kernel != config.stem_stride:
        raise ConfigError(f"readout='unit' needs a patchify stem (stem_kernel = stem_stride), got stem_kernel="
                          f"{config.stem_kernel}, stem_stride={config.stem_stride}")
    if not config.stem_stride <= window <= image_size:
        raise ConfigError(f"window={window} must be between the stem's patch ({config.stem_stride} px) and the "
                          f"picture ({image_size} px): one unit cannot see more than the picture")
    if window % config.stem_stride:
        raise ConfigError(f"window={window} must be a multiple of stem_stride={config.stem_stride} (whole patches)")


def _per_scale(values: list[int], i: int) -> int:
    return values[min(i, len(values) - 1)]


class StridedTrunk(nn.Module):
    """Images ``(B, C, image_size, image_size)`` → one unit ``(B, C', 1, 1)`` that sees the centred ``window``.

    Scale ``i`` (grid ``g_i``, the first ``window / p``) has ``widths[i]`` channels and ``depths[i]`` blocks:
    ``depths[i] − 1`` of stride 1 (``arch``, ``kernel_size``, ``dilation``, "same" padding), then the valid strided
    reduction (conv → norm → [FiLM] → ReLU); lists shorter than the number of scales repeat their last entry.
    """

    def __init__(self, c: ConvTrunkConfig, window: int, image_size: int):
        super().__init__()
        self.window, self.offset = window, (image_size - window) // 2
        self.stem = nn.Conv2d(c.in_channels, c.widths[0], c.stem_kernel, c.stem_stride, bias=c.norm == "none")
        self.stem_norm = _norm(c.norm, c.widths[0])
        blocks, c_in = [], c.widths[0]
        self.kernels = reduction_kernels(window // c.stem_stride)
        for i, kernel in enumerate(self.kernels):
            width = _per_scale(c.widths, i)
            for _ in range(_per_scale(c.depths, i) - 1):
                blocks.append(_Block(c.arch, c_in, width, c.kernel_size, 1, c.dilation, c.norm))
                c_in = width
            blocks.append(_Block("plain", c_in, width, kernel, 2, 1, c.norm, padding=0))
            c_in = width
        self.blocks = nn.ModuleList(blocks)
        self.out_channels = c_in

    def film_channels(self) -> list[int]:
        """The channels each block's FiLM ``(γ, β)`` must have, in order."""
        return [block.conv1.out_channels for block in self.blocks]

    def receptive_field(self) -> ReceptiveField:
        """The one unit's field: the window, ``start`` its offset from the picture's edge (``jump``: the window,
        there being no neighbouring unit)."""
        return ReceptiveField(self.window, self.window, self.offset)

    def forward(self, x: Tensor, films: list[tuple[Tensor, Tensor]] | None = None) -> Tensor:
        feats = F.relu(self.stem_norm(self.stem(centre_window(x, self.window))))  # (B, widths[0], g, g)
        for i, blk in enumerate(self.blocks):
            feats = blk(feats, None if films is None else films[i])
        return feats  # (B, C', 1, 1)
