"""One image from a file (PNG, JPEG, ... or a ``.npy`` array) as a float tensor ``(C, H, W)`` in [0, 1]."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .text import DataError

__all__ = ["read_image", "read_images", "write_image"]


def read_image(path: str | Path, channels: int | None = None) -> Tensor:
    """Read one image file as a float tensor ``(C, H, W)`` in [0, 1].

    Image files (PNG, JPEG, BMP, ... — whatever Pillow opens): grey images give C = 1, colour images
    C = 3; an alpha channel is dropped (the image is composited over white first) and palette images
    are converted to RGB. ``.npy`` files: an array ``(H, W)``, ``(H, W, C)`` or ``(C, H, W)`` with
    C in {1, 3}, values in [0, 1] for floats or 0..255 for integers. With ``channels`` (what a model
    takes), a grey image is repeated to 3 channels when 3 are wanted, and any other mismatch is an error.
    No resizing happens here: the caller checks the size its model takes. Errors are
    :class:`DataError` naming the file and the problem.
    """
    x = _read_image_file(Path(path))
    if channels is not None and x.shape[0] != channels:
        if x.shape[0] == 1 and channels == 3:
            return x.expand(3, -1, -1)
        raise DataError(f"{path}: the model takes images with {channels} channel(s), got {x.shape[0]}")
    return x


def read_images(paths, image_size: int, channels: int = 3, grey: str = "repeat") -> Tensor:
    """Image files for a model that takes ``image_size``×``image_size`` images: ``(B, C, H, W)`` in [0, 1].

    Nothing is resized: another size is a :class:`DataError` saying what is expected. ``grey="repeat"`` repeats a
    grey image to 3 channels (:func:`read_image`); ``grey="refuse"`` makes it an error, for a model whose answers
    depend on colour. No paths at all is an error too.
    """
    if grey not in ("repeat", "refuse"):
        raise ValueError(f"grey must be 'repeat' or 'refuse', not {grey!r}")
    out = []
    for path in paths:
        x = read_image(path) if grey == "refuse" else read_image(path, channels=channels)
        if x.shape[0] != channels:
            raise DataError(f"{path}: the model takes {'RGB' if channels == 3 else f'{channels}-channel'} images; this "
                            f"one has {x.shape[0]} channel{'s' if x.shape[0] > 1 else ''}"
                            f"{' (grey); convert it to RGB first' if x.shape[0] == 1 else ''}")
        if tuple(x.shape[1:]) != (image_size, image_size):
            raise DataError(f"{path}: the model takes {image_size}×{image_size} images, got {x.shape[1]}×{x.shape[2]}; "
                            "resize it first")
        out.append(x)
    if not out:
        raise DataError("no image given")
    return torch.stack(out)


def _load_npy(path: Path) -> np.ndarray:
    """``np.load`` of a ``.npy`` file whose header is checked first: its shape may not promise more bytes than the
    file holds (a damaged header must not make numpy allocate for it)."""
    try:
        with open(path, "rb") as file:
            version = np.lib.format.read_magic(file)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                np.lib.format.read_array_header_2_0
            shape, _, dtype = read_header(file)
            need = int(np.prod(shape, dtype=object)) * dtype.itemsize
            have = path.stat().st_size - file.tell()
        if need > have:
            raise DataError(f"{path}: the .npy header declares shape {shape} ({need} bytes) but the file holds "
                            f"{have}; it is truncated or damaged")
        return np.load(path, allow_pickle=False)
    except DataError:
        raise
    except Exception as err:  # noqa: BLE001 - numpy fails on a damaged header in many ways (EOFError, TokenError, ...)
        first = (str(err).splitlines() or [""])[0]
        raise DataError(f"{path} is not a readable .npy array ({type(err).__name__}: {first})") from None


def _read_image_file(path: Path) -> Tensor:
    if not path.is_file():
        raise DataError(f"image {path} does not exist" if not path.exists() else f"image {path} is not a file")
    if path.suffix.lower() == ".npy":
        pixels = _load_npy(path)
        if pixels.ndim == 2:
            pixels = pixels[None]
        elif pixels.ndim == 3 and pixels.shape[-1] in (1, 3) and pixels.shape[0] not in (1, 3):
            pixels = pixels.transpose(2, 0, 1)
        if pixels.ndim != 3 or pixels.shape[0] not in (1, 3):
            raise DataError(f"{path}: expected an array (H, W), (H, W, C) or (C, H, W) with C = 1 or 3, "
                            f"got shape {pixels.shape}")
        if pixels.dtype.kind in "iu":
            pixels = pixels.astype(np.float32) / 255.0
        elif pixels.dtype.kind == "f":
            pixels = pixels.astype(np.float32)
        else:
            raise DataError(f"{path}: expected a numeric array, got dtype {pixels.dtype}")
        if not np.isfinite(pixels).all() or pixels.min() < 0 or pixels.max() > 1:
            raise DataError(f"{path}: float pixel values must lie in [0, 1]")
        return torch.from_numpy(np.ascontiguousarray(pixels))
    import warnings

    from PIL import Image

    try:
        with warnings.catch_warnings():
            # Pillow's own bound on pixels (a header can declare 40000×40000 in a few bytes): an error, not a warning
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(path)
        with image:
            image.load()
            if image.mode in ("RGBA", "LA") or (image.mode == "P" and "transparency" in image.info):
                image = image.convert("RGBA")
                background = Image.new("RGBA", image.size, (255, 255, 255, 255))
                image = Image.alpha_composite(background, image).convert("RGB")
            elif image.mode not in ("L", "RGB"):
                image = image.convert("L" if image.mode in ("1", "I", "I;16", "F") else "RGB")
            pixels = np.asarray(image, dtype=np.float32)
    except Exception as err:  # noqa: BLE001 - Pillow fails on a damaged file in many ways (OSError, ValueError, ...)
        first = (str(err).splitlines() or [""])[0]
        raise DataError(f"{path} is not a readable image ({type(err).__name__}: {first})") from None
    if image.mode == "L":
        pixels = pixels[None]
    else:
        pixels = pixels.transpose(2, 0, 1)
    return torch.from_numpy(np.ascontiguousarray(pixels / 255.0, dtype=np.float32))


def write_image(x: Tensor, path: str | Path) -> Path:
    """Write an image ``(C, H, W)`` in [0, 1] as :func:`read_image` reads it back: ``.npy`` exactly (float32),
    an image format (PNG, ...) rounded to 8 bits."""
    path = Path(path)
    pixels = x.detach().float().clamp(0, 1).cpu().numpy()
    if path.suffix.lower() == ".npy":
        np.save(path, pixels.astype(np.float32))
        return path
    from PIL import Image

    pixels_u8 = (pixels * 255).round().astype(np.uint8)
    Image.fromarray(pixels_u8[0] if pixels_u8.shape[0] == 1 else pixels_u8.transpose(1, 2, 0)).save(path)
    return path
