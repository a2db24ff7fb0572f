"""Embedded captioning data: small images of one to three coloured shapes, and captions that describe them.

Each image is ``IMAGE_SIZE × IMAGE_SIZE`` RGB on a white background, divided into a 3 × 3 grid of
cells; each shape sits in its own cell, at a random offset inside it, with a random size in its size
class. An object is a (size, colour, shape) triple — 2 sizes × 4 colours × 3 shapes = 24 kinds.

The caption names the objects in reading order (cells row by row, left to right) and relates each
to the next: ``"above"`` when the next object is in a lower row, ``"left of"`` when it is in the same
row further right. So the caption is a function of the image::

    a small red circle
    a small red circle above a large blue square
    a large green triangle left of a small red circle above a small yellow square

Held-out combinations: a scene's *combination* is the set of its object kinds. A seeded hash assigns
a fraction of all combinations (of 1, 2 and 3 kinds) to the test set; training scenes never use them.
Every object kind still occurs in training, in other company: the test asks for new compositions,
not new words.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from ..errors import ConfigError
from .spec import DataSpec, register_data

__all__ = [
    "ShapeScenes",
    "IMAGE_SIZE",
    "GRID",
    "SIZES",
    "COLORS",
    "SHAPES",
    "Obj",
    "Scene",
    "caption",
    "render",
    "random_scene",
    "is_held_out",
    "sample_scenes",
    "held_out_scenes",
    "images_of",
    "caption_corpus",
    "ShapeCaptions",
    "encode_captions",
]

IMAGE_SIZE = 48
GRID = 3
CELL = IMAGE_SIZE // GRID  # 16 pixels
SIZES = {"small": (7, 8), "large": (12, 14)}  # side length range in pixels
COLORS = {"red": (0.86, 0.12, 0.12), "green": (0.13, 0.63, 0.2), "blue": (0.15, 0.3, 0.9),
          "yellow": (0.93, 0.78, 0.1)}
SHAPES = ("circle", "square", "triangle")
KINDS = tuple(itertools.product(SIZES, COLORS, SHAPES))  # the 24 (size, colour, shape) triples


@dataclass(frozen=True)
class Obj:
    """One shape: its kind, its grid cell and its exact placement (centre and side in pixels)."""

    size: str
    color: str
    shape: str
    row: int
    col: int
    cx: float
    cy: float
    side: int

    @property
    def kind(self) -> tuple[str, str, str]:
        return (self.size, self.color, self.shape)

    @property
    def words(self) -> str:
        return f"a {self.size} {self.color} {self.shape}"


@dataclass(frozen=True)
class Scene:
    """Objects in reading order (row, then column)."""

    objects: tuple[Obj, ...]

    @property
    def combination(self) -> tuple[tuple[str, str, str], ...]:
        """The set of object kinds, as a sorted tuple (what the held-out split is about)."""
        return tuple(sorted(obj.kind for obj in self.objects))


def caption(scene: Scene) -> str:
    """The scene's caption: objects in reading order, each related to the next ("above" / "left of")."""
    objs = scene.objects
    parts = [objs[0].words]
    for prev_obj, next_obj in zip(objs, objs[1:], strict=False):
        parts.append("above" if next_obj.row > prev_obj.row else "left of")
        parts.append(next_obj.words)
    return " ".join(parts)


def render(scene: Scene, image_size: int = IMAGE_SIZE) -> np.ndarray:
    """The scene as a float32 image ``(3, H, W)`` in [0, 1], white background."""
    img = np.ones((3, image_size, image_size), dtype=np.float32)
    pix_y, pix_x = np.mgrid[0:image_size, 0:image_size].astype(np.float32) + 0.5  # pixel centres
    for obj in scene.objects:
        half_side = obj.side / 2
        dx, dy = pix_x - obj.cx, pix_y - obj.cy
        if obj.shape == "circle":
            inside = dx * dx + dy * dy <= half_side * half_side
        elif obj.shape == "square":
            inside = (np.abs(dx) <= half_side) & (np.abs(dy) <= half_side)
        else:  # triangle pointing up: apex at the top, base at the bottom
            t = (dy + half_side) / (2 * half_side)  # 0 at the apex, 1 at the base
            inside = (t >= 0) & (t <= 1) & (np.abs(dx) <= t * half_side)
        img[:, inside] = np.asarray(COLORS[obj.color], dtype=np.float32)[:, None]
    return img


def random_scene(rng: random.Random, num_objects: int | None = None) -> Scene:
    """A random scene of 1–3 objects (``num_objects`` to fix it) in distinct cells."""
    n = rng.randint(1, 3) if num_objects is None else num_objects
    if not 1 <= n <= GRID * GRID:
        raise ValueError(f"num_objects must be in [1, {GRID * GRID}], got {n}")
    cells = sorted(rng.sample(range(GRID * GRID), n))  # reading order
    objs = []
    for cell in cells:
        size, color, shape = KINDS[rng.randrange(len(KINDS))]
        min_side, max_side = SIZES[size]
        side = rng.randint(min_side, max_side)
        slack = (CELL - side) / 2 - 0.5  # keep the shape inside its cell, a pixel from the border
        row, col = divmod(cell, GRID)
        centre_x = col * CELL + CELL / 2 + rng.uniform(-slack, slack)
        centre_y = row * CELL + CELL / 2 + rng.uniform(-slack, slack)
        objs.append(Obj(size, color, shape, row, col, centre_x, centre_y, side))
    return Scene(tuple(objs))


def is_held_out(scene: Scene, seed: int = 0, fraction: float = 0.2) -> bool:
    """Whether the scene's combination of object kinds belongs to the test set (a seeded hash)."""
    key = f"{seed}|" + ";".join(",".join(k) for k in scene.combination)
    return (zlib.crc32(key.encode()) % 10_000) < fraction * 10_000


def sample_scenes(n: int, seed: int | str, *, held_out: bool, split_seed: int = 0, fraction: float = 0.2,
                  num_objects: int | None = None) -> list[Scene]:
    """``n`` scenes from the training combinations (``held_out=False``) or the test ones (``True``).

    A pure function of its arguments. Scenes are drawn and kept when their combination is on the
    requested side of the split (rejection sampling).
    """
    if not 0 < fraction < 1:
        raise ConfigError(f"fraction must be in (0, 1), got {fraction}")
    rng = random.Random(seed)
    out: list[Scene] = []
    while len(out) < n:
        scene = random_scene(rng, num_objects)
        if is_held_out(scene, split_seed, fraction) == held_out:
            out.append(scene)
    return out


def held_out_scenes(seed: int, n: int, fraction: float = 0.2) -> list[Scene]:
    """The held-out test set of a split: ``n`` scenes whose combinations training never sees."""
    return sample_scenes(n, f"test-{seed}", held_out=True, split_seed=seed, fraction=fraction)


def caption_corpus() -> list[str]:
    """Text that covers every caption word in every position, for training the tokenizer."""
    lines = []
    for (size_a, color_a, shape_a), (size_b, color_b, shape_b) in itertools.product(KINDS, KINDS):
        for rel in ("above", "left of"):
            lines.append(f"a {size_a} {color_a} {shape_a} {rel} a {size_b} {color_b} {shape_b}")
    return lines


def encode_captions(captions: Sequence[str], tokenizer, pad_id: int = 0) -> tuple[Tensor, Tensor]:
    """``(tgt_in, tgt_out)`` ``(B, T)``: ``[<bos>, y]`` and ``[y, <eos>]``, ``tgt_out`` = -100 at padding."""
    ids = [tokenizer.encode(text) for text in captions]
    T = max(len(seq) for seq in ids) + 1
    tgt_in = torch.full((len(ids), T), pad_id, dtype=torch.long)
    tgt_out = torch.full((len(ids), T), -100, dtype=torch.long)
    for row, seq in enumerate(ids):
        tgt_in[row, : len(seq) + 1] = torch.tensor([tokenizer.bos_id, *seq])
        tgt_out[row, : len(seq) + 1] = torch.tensor([*seq, tokenizer.eos_id])
    return tgt_in, tgt_out


def images_of(scenes: Sequence[Scene], image_size: int = IMAGE_SIZE) -> Tensor:
    """Render scenes into a batch ``(B, 3, H, W)``."""
    return torch.from_numpy(np.stack([render(scene, image_size) for scene in scenes]))


class ShapeCaptions:
    """Batch source: ``batch(i) → ((images (B, 3, H, W), tgt_in (B, T)), tgt_out (B, T))``.

    Batch ``i`` is drawn from the training combinations with the seed ``(seed, i)`` only.

    Args:
        tokenizer: a tokenizer that covers the caption words.
        batch_size: images per batch.
        seed: the data seed.
        split_seed, fraction: the held-out split (see :func:`is_held_out`).
    """

    def __init__(self, tokenizer, batch_size: int, seed: int = 0, *, split_seed: int = 0, fraction: float = 0.2):
        self.tokenizer, self.batch_size, self.seed = tokenizer, batch_size, seed
        self.split_seed, self.fraction = split_seed, fraction

    def batch(self, index: int):
        scenes = sample_scenes(self.batch_size, f"train-{self.seed}-{index}", held_out=False,
                               split_seed=self.split_seed, fraction=self.fraction)
        tgt_in, tgt_out = encode_captions([caption(scene) for scene in scenes], self.tokenizer, self.tokenizer.pad_id)
        return (images_of(scenes), tgt_in), tgt_out


@register_data
@dataclasses.dataclass
class ShapeScenes(DataSpec):
    """The captioning data: generated scenes split by combination of object kinds (``seed``,
    ``held_out_fraction``), and the sizes of the held-out validation and test sets.

    Args:
        seed: draws the scenes and which combinations of object kinds are held out.
        held_out_fraction: the share of the combinations of object kinds never seen in training (the test's).
        test_size: scenes in the test set, all of held-out combinations.
        val_size: scenes in the validation set, all of held-out combinations.
    """

    kind: ClassVar[str] = "shapes"
    legacy_recipes: ClassVar[tuple[str, ...]] = ("caption",)
    seed: int = 0
    held_out_fraction: float = 0.2
    test_size: int = 1000
    val_size: int = 250

    def __post_init__(self):
        if not 0 < self.held_out_fraction < 1 or self.test_size < 1 or self.val_size < 1:
            raise ConfigError("held_out_fraction must be in (0, 1); test_size and val_size >= 1")

    def val_scenes(self) -> list[Scene]:
        """Validation scenes: held-out combinations too, a different draw from the test set."""
        return sample_scenes(self.val_size, f"val-{self.seed}", held_out=True, split_seed=self.seed,
                             fraction=self.held_out_fraction)

    def held_out(self) -> list[Scene]:
        """The test scenes, whose combinations training never sees."""
        return held_out_scenes(self.seed, self.test_size, self.held_out_fraction)
