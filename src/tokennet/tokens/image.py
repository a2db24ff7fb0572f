"""Images → tokens: cut an image into patches, flatten each patch, project it to the model width.

ViT (Dosovitskiy et al. 2021, https://arxiv.org/abs/2010.11929): an image ``x ∈ R^(C×H×W)`` becomes
``N = (H/p)·(W/p)`` flattened patches ``x_p ∈ R^(N × C·p²)``, and the tokens are ``T = x_p E`` with
``E ∈ R^(C·p² × D)``. A convolution with kernel = stride = p computes exactly that product, so
:class:`PatchEmbed` offers both forms over one weight. With a stride smaller than the patch, patches
overlap (more tokens, each seeing some of its neighbours' pixels).

A 1-D signal ``(B, C, L)`` is an image of height 1: it is cut into ``(1, p)`` patches by the same code.

Patches are numbered in row-major order: patch ``n`` sits at grid row ``n // gw``, column ``n % gw``.
Each flattened patch lists channel 0's ``p × p`` pixels row by row, then channel 1's, … — the layout
of a convolution weight ``(D, C, p, p)`` flattened, which is what makes the two forms agree.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ConfigError

__all__ = ["PatchEmbed", "ConvStem", "patchify", "grid_size", "patch_padding", "to_pair", "EMBED_MODES", "PROJECTIONS",
           "dct_basis", "fixed_projection"]

EMBED_MODES = ("conv", "linear", "conv-stem")
PROJECTIONS = ("learned", "random", "dct")


def to_pair(value, name: str = "size") -> tuple[int, int]:
    """``p`` → ``(p, p)``; ``(h, w)`` stays; a one-element list ``[l]`` means a 1-D size ``(1, l)``."""
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be an int or a pair of ints, got {value!r}")
    if isinstance(value, int):
        pair = (value, value)
    elif isinstance(value, (tuple, list)) and len(value) in (1, 2) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        pair = (1, value[0]) if len(value) == 1 else (value[0], value[1])
    else:
        raise ConfigError(f"{name} must be an int, [length] or [height, width], got {value!r}")
    if min(pair) < 1:
        raise ConfigError(f"{name} must be positive, got {value!r}")
    return pair


def patch_padding(size: int, patch: int, stride: int) -> int:
    """Pixels to add along one side length so that patches of ``patch`` at ``stride`` tile it exactly."""
    if size <= patch:
        return patch - size
    return (-(size - patch)) % stride


def _check_fit(size: tuple[int, int], patch: tuple[int, int], stride: tuple[int, int], pad: bool) -> None:
    for axis, side, patch_side, step in zip(("height", "width"), size, patch, stride, strict=True):
        if pad:
            continue
        if side < patch_side:
            raise ValueError(f"image {axis} {side} is smaller than the patch {axis} {patch_side}; use a smaller "
                             "patch_size or pad=True")
        if (side - patch_side) % step:
            fix = ("a patch size that divides it" if patch_side == step
                   else "a patch/stride with (size - patch) % stride == 0")
            raise ValueError(f"image {axis} {side} is not covered by patches of {patch_side} at stride {step} "
                             f"({(side - patch_side) % step} pixels left over); use {fix}, or pad=True to zero-pad")


def grid_size(image_size, patch_size, stride=None, *, pad: bool = False) -> tuple[int, int]:
    """The patch grid ``(gh, gw)`` of an image: ``g = (size + padding − patch) / stride + 1`` per axis.

    Args:
        image_size: ``(H, W)``, an int for a square, or ``[L]`` for a 1-D signal.
        patch_size: ``p`` or ``(ph, pw)`` (``[p]`` for 1-D).
        stride: step between patches (default: the patch size, non-overlapping).
        pad: zero-pad sizes that the patches do not tile (else a ``ValueError``).
    """
    size, patch = to_pair(image_size, "image_size"), to_pair(patch_size, "patch_size")
    stride = patch if stride is None else to_pair(stride, "stride")
    _check_fit(size, patch, stride, pad)
    out = []
    for side, patch_side, step in zip(size, patch, stride, strict=True):
        side = side + (patch_padding(side, patch_side, step) if pad else 0)
        out.append((side - patch_side) // step + 1)
    return out[0], out[1]


def _pad_images(images: Tensor, patch: tuple[int, int], stride: tuple[int, int]) -> Tensor:
    """Zero-pad (B, C, H, W) symmetrically (the odd pixel at the bottom/right) so the patches tile it."""
    pad_h = patch_padding(images.shape[-2], patch[0], stride[0])
    pad_w = patch_padding(images.shape[-1], patch[1], stride[1])
    if pad_h == 0 and pad_w == 0:
        return images
    return F.pad(images, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2))


def _as_images(images: Tensor, what: str = "images") -> Tensor:
    if images.dim() == 3:  # a 1-D signal (B, C, L) is an image of height 1
        return images[:, :, None, :]  # (B, C, 1, L)
    if images.dim() != 4:
        raise ValueError(f"{what} must have shape (B, C, H, W), or (B, C, L) for 1-D signals; "
                         f"got {tuple(images.shape)}")
    return images


def patchify(images: Tensor, patch_size, stride=None, *, pad: bool = False) -> Tensor:
    """Cut images into flattened patches: ``(B, C, H, W) → (B, N, C·ph·pw)``, patches in row-major order.

    A 224×224 RGB image with 16×16 patches gives N = 14·14 = 196 tokens of 3·16·16 = 768 numbers.

    Args:
        images: ``(B, C, H, W)``, or ``(B, C, L)`` for 1-D signals (patches ``(1, p)``).
        patch_size: ``p`` or ``(ph, pw)``.
        stride: step between patches; smaller than the patch for overlapping patches (default: patch).
        pad: zero-pad sizes the patches do not tile; otherwise such sizes raise ``ValueError``.
    """
    x = _as_images(images)
    patch = (1, to_pair(patch_size, "patch_size")[1]) if images.dim() == 3 else to_pair(patch_size, "patch_size")
    stride = patch if stride is None else ((1, to_pair(stride, "stride")[1]) if images.dim() == 3
                                           else to_pair(stride, "stride"))
    _check_fit(tuple(x.shape[-2:]), patch, stride, pad)
    if pad:
        x = _pad_images(x, patch, stride)
    cols = F.unfold(x, kernel_size=patch, stride=stride)  # (B, C·ph·pw, N)
    return cols.transpose(1, 2)  # (B, N, C·ph·pw)


def dct_basis(channels: int, patch_hw: tuple[int, int]) -> Tensor:
    """The orthonormal 2-D DCT-II basis of a patch, one channel at a time: ``(C·ph·pw, C, ph, pw)``.

    Basis image ``(u, v)`` of channel ``c`` is ``α_u α_v cos(π (2i + 1) u / 2ph) cos(π (2j + 1) v / 2pw)`` on channel
    ``c`` and zero on the others (``α_0 = √(1/n)``, ``α_k = √(2/n)``). The rows are ordered from low to high
    frequency (``u + v``, then ``u``, then the channel), so truncating keeps the coarse content of every channel.
    """
    patch_h, patch_w = patch_hw

    def cosines(n: int) -> Tensor:  # (n frequencies, n pixels), orthonormal rows
        k, i = torch.arange(n, dtype=torch.float64)[:, None], torch.arange(n, dtype=torch.float64)[None, :]
        table = torch.cos(math.pi * (2 * i + 1) * k / (2 * n)) * math.sqrt(2 / n)
        table[0] /= math.sqrt(2)
        return table

    rows_h, rows_w = cosines(patch_h), cosines(patch_w)
    order = sorted((freq_h + freq_w, freq_h, channel, freq_w)
                   for freq_h in range(patch_h) for freq_w in range(patch_w) for channel in range(channels))
    basis = torch.zeros(len(order), channels, patch_h, patch_w, dtype=torch.float64)
    for row, (_, freq_h, channel, freq_w) in enumerate(order):
        basis[row, channel] = rows_h[freq_h][:, None] * rows_w[freq_w][None, :]  # (ph, pw): two cosines' product
    return basis.float()


def fixed_projection(kind: str, dim: int, channels: int, patch_hw: tuple[int, int]) -> Tensor:
    """A hard-coded ``W_tokenize`` of shape ``(D, C, ph, pw)`` (the lecture: "that could be a learned matrix, or it
    could be somehow hard-coded").

    ``"dct"``: the first ``D`` rows of :func:`dct_basis` (zero rows beyond ``C·ph·pw``): each token lists the
    patch's frequencies. ``"random"``: Gaussian entries of variance ``1 / (C·ph·pw)``, drawn from PyTorch's global
    generator (so from the run's seed); tokens then have about the patch's mean squared pixel as their mean square.
    """
    patch_h, patch_w = patch_hw
    fan_in = channels * patch_h * patch_w
    if kind == "random":
        return torch.randn(dim, channels, patch_h, patch_w) / math.sqrt(fan_in)
    if kind == "dct":
        basis = dct_basis(channels, patch_hw)[:dim]
        padding = torch.zeros(dim - len(basis), channels, patch_h, patch_w)
        return torch.cat([basis, padding])
    raise ConfigError(f"patch_projection must be one of {', '.join(PROJECTIONS)}, got {kind!r}")


class PatchEmbed(nn.Module):
    """Patch embedding ``T = patchify(x) E + b``: one token of width D per patch.

    ``mode="conv"`` computes it as a convolution with kernel = stride = patch size (what ViT
    implementations do, fast); ``mode="linear"`` as the lecture writes it, flattened patches times a
    matrix. Both use the same parameter ``weight`` of shape ``(D, C, ph, pw)`` (``E`` is its
    ``(D, C·ph·pw)`` view, transposed), so a checkpoint works in either mode and they agree to rounding.

    ``projection`` picks how ``E`` is made. The lecture: "you could use some matrix that you multiply the pixel
    values by W tokenize to get a D dimensional vector. And that could be a learned matrix, or it could be somehow
    hard-coded." ``"learned"`` trains it; ``"random"`` and ``"dct"`` fix it (:func:`fixed_projection`): ``weight``
    is then a buffer, saved with the model and never trained (the bias ``b`` is still learned).

    Args:
        in_channels: channels C of the input.
        dim: token width D.
        patch_size: ``p`` or ``(ph, pw)``; ``(1, p)`` for 1-D signals.
        stride: step between patches (default: the patch size; smaller = overlapping patches).
        pad: zero-pad images whose size the patches do not tile (else a ``ValueError``).
        mode: ``"conv"`` or ``"linear"``.
        bias: add a bias ``b``.
        projection: ``"learned"``, ``"random"`` or ``"dct"`` (see above).
    """

    def __init__(self, in_channels: int, dim: int, patch_size, stride=None, *, pad: bool = False,
                 mode: str = "conv", bias: bool = True, projection: str = "learned"):
        super().__init__()
        if in_channels < 1 or dim < 1:
            raise ValueError(f"in_channels and dim must be positive, got {in_channels}, {dim}")
        if mode not in ("conv", "linear"):
            raise ValueError(f"mode must be 'conv' or 'linear' (see ConvStem for 'conv-stem'), got {mode!r}")
        self.in_channels, self.dim, self.mode, self.pad = in_channels, dim, mode, pad
        self.projection = projection
        self.patch_size = to_pair(patch_size, "patch_size")
        self.stride = self.patch_size if stride is None else to_pair(stride, "stride")
        patch_h, patch_w = self.patch_size
        if projection == "learned":
            self.weight = nn.Parameter(torch.empty(dim, in_channels, patch_h, patch_w))
            # nn.Conv2d's default initialisation: uniform with fan_in = C·ph·pw.
            nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        else:  # hard-coded: a buffer, so the optimizer never sees it and the saved model keeps it
            self.register_buffer("weight", fixed_projection(projection, dim, in_channels, self.patch_size))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None
        if self.bias is not None:
            bound = 1 / math.sqrt(in_channels * patch_h * patch_w)
            nn.init.uniform_(self.bias, -bound, bound)

    def grid(self, image_size) -> tuple[int, int]:
        """The patch grid ``(gh, gw)`` for images of ``image_size`` ``(H, W)``."""
        return grid_size(tuple(image_size), self.patch_size, self.stride, pad=self.pad)

    def check(self, images: Tensor) -> Tensor:
        """Return ``images`` as ``(B, C, H, W)``, or raise a ``ValueError`` that says what is expected."""
        x = _as_images(images)
        if x.shape[1] != self.in_channels:
            raise ValueError(f"expected images with {self.in_channels} channel(s) (B, {self.in_channels}, H, W), "
                             f"got shape {tuple(images.shape)} with {x.shape[1]} channel(s)")
        if not x.dtype.is_floating_point:
            raise ValueError(f"images must be floating point (e.g. pixels / 255), got dtype {x.dtype}")
        _check_fit(tuple(x.shape[-2:]), self.patch_size, self.stride, self.pad)
        return x

    def forward(self, images: Tensor) -> Tensor:
        """``(B, C, H, W) → (B, N, D)`` with ``N = gh·gw`` patches in row-major order."""
        x = self.check(images)
        if self.pad:
            x = _pad_images(x, self.patch_size, self.stride)
        if self.mode == "conv":
            y = F.conv2d(x, self.weight, self.bias, stride=self.stride)  # (B, D, gh, gw)
            return y.flatten(2).transpose(1, 2)  # (B, N, D)
        patches = F.unfold(x, kernel_size=self.patch_size, stride=self.stride).transpose(1, 2)  # (B, N, C·ph·pw)
        return F.linear(patches, self.weight.flatten(1), self.bias)  # (B, N, D)

    def extra_repr(self) -> str:
        return (f"in_channels={self.in_channels}, dim={self.dim}, patch_size={self.patch_size}, "
                f"stride={self.stride}, pad={self.pad}, mode={self.mode!r}, projection={self.projection!r}")


class ConvStem(nn.Module):
    """Early convolutions instead of one patchify layer (ViT_C, Xiao et al. 2021, https://arxiv.org/abs/2106.14881).

    ``log2(p)`` layers of 3×3 convolution with stride 2 (+ BatchNorm + ReLU), each halving the grid and
    doubling the channels, then a 1×1 convolution to width D: every token still stands for a ``p × p``
    cell of the image (the grid is ``⌈H/p⌉ × ⌈W/p⌉``), but it is computed by a small CNN that sees
    overlapping neighbourhoods. Xiao et al. found this makes ViT optimization faster and more stable
    at the cost of a few percent more compute.

    Args:
        in_channels: channels C of the input.
        dim: token width D.
        patch_size: the total stride p, a power of two ≥ 2 (square cells).
        width: channels of the first convolution (default ``D / 2^(layers − 1)``, at least 16).
        bias: bias of the final 1×1 projection.
    """

    def __init__(self, in_channels: int, dim: int, patch_size, *, width: int | None = None, bias: bool = True):
        super().__init__()
        patch_h, patch_w = to_pair(patch_size, "patch_size")
        if patch_h != patch_w or patch_h < 2 or patch_h & (patch_h - 1):
            raise ValueError(f"a conv stem needs a square patch_size that is a power of two >= 2, got {patch_size}")
        n = patch_h.bit_length() - 1
        self.in_channels, self.dim, self.pad = in_channels, dim, True
        self.patch_size, self.stride = (patch_h, patch_w), (patch_h, patch_w)
        width = max(16, dim // 2 ** (n - 1)) if width is None else width
        layers: list[nn.Module] = []
        channels = in_channels
        for i in range(n):
            out = width * 2**i
            layers += [nn.Conv2d(channels, out, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(out),
                       nn.ReLU(inplace=True)]
            channels = out
        layers.append(nn.Conv2d(channels, dim, 1, bias=bias))
        self.stem = nn.Sequential(*layers)

    def grid(self, image_size) -> tuple[int, int]:
        """The token grid ``(⌈H/p⌉, ⌈W/p⌉)`` for images of ``image_size`` ``(H, W)``."""
        return grid_size(tuple(image_size), self.patch_size, self.stride, pad=True)

    def check(self, images: Tensor) -> Tensor:
        """Return ``images`` as ``(B, C, H, W)``, or raise a ``ValueError`` that says what is expected."""
        x = _as_images(images)
        if x.shape[1] != self.in_channels:
            raise ValueError(f"expected images with {self.in_channels} channel(s) (B, {self.in_channels}, H, W), "
                             f"got shape {tuple(images.shape)} with {x.shape[1]} channel(s)")
        if not x.dtype.is_floating_point:
            raise ValueError(f"images must be floating point (e.g. pixels / 255), got dtype {x.dtype}")
        if x.shape[-2] == 1:
            raise ValueError("a conv stem needs 2-D images; use patch_embed='conv' for 1-D signals")
        return x

    def forward(self, images: Tensor) -> Tensor:
        """``(B, C, H, W) → (B, N, D)`` with ``N = ⌈H/p⌉·⌈W/p⌉`` tokens in row-major order."""
        return self.stem(self.check(images)).flatten(2).transpose(1, 2)  # (B, D, gh, gw) → (B, N, D)

    def extra_repr(self) -> str:
        return f"in_channels={self.in_channels}, dim={self.dim}, patch_size={self.patch_size}"
