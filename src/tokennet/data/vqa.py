"""Questions about a picture: generated scenes of animals, template questions, one-word answers.

The lecture's opening question, as data: *how many birds are in this image?* and *is the top right bird
the same species as the bottom left bird?*. A scene is a ``64 × 64`` RGB picture on a 4 × 4 grid of
16-pixel cells; 1–9 animals sit in distinct cells (at a random offset inside the cell, either facing),
with clutter — grey pebbles and brown twigs — scattered anywhere. An animal is a (species, colour) pair:
five species drawn as distinct silhouettes (bird, fish, cat, impala, turtle) in five named colours (red,
green, blue, yellow, purple) — or, a quarter of the time, in a colour no question names (teal, pink,
charcoal), so that every species is seen in many colours and its shape, not its colour, is what names it.

Questions come from five templates, as text; every answer is one word of :data:`ANSWERS`:

=================  ==========================================================  ===============
template           question                                                    answer
=================  ==========================================================  ===============
``count``          how many birds are there? / how many animals are there?     ``0`` … ``9``
``count_colour``   how many red animals are there?                             ``0`` … ``9``
``same_species``   is the top right animal the same species as the bottom      ``yes`` / ``no``
                   left animal? (any of the six pairs of corners)
``species``        what species is the top right animal? (any corner)          a species
``colour``         what colour is the impala?  (exactly one impala in the      a colour
                   scene)
=================  ==========================================================  ===============

A *corner* animal is the one in that corner's cell of the grid; a ``same_species`` or ``species`` question is
asked only of a scene with its corners occupied, and ``same_species`` answers are balanced (half yes). As in
CLEVR (Johnson et al. 2017), a question that compares two things comes with one that queries one: looking a
corner up (``species``) gives a learner a first-order signal that the comparison alone does not — equality of
two unseen variables is invisible until both are found. A question's answer is drawn before its scene: a
count question's count uniformly over ``0`` … ``9`` (``1`` … ``9`` for *animals*) less its held-out count, so
every count but that one is as frequent as every other; then the number of animals, uniformly over what the
answer allows (from the count, at least 1, to 9; exactly the count for *animals*; 2 to 9 for ``same_species``,
1 to 9 otherwise).

**Held out of training** (whole combinations, chosen by ``seed``): one colour per species — five
(species, colour) kinds no training picture ever shows, a Latin square so that every species and every
colour still appears in training, in four other pairings — and, for each count question, one count
(*how many fish are there?* is never answered ``7`` in training). The test set (and the validation set) is
drawn as training is — the same templates, questions, answers and numbers of animals, in the same proportions,
no count question asking a held-out count — except that one animal of each picture, in a slot drawn uniformly,
is a held-out kind on purpose, and the others may be any named kind (held-out ones included) or an unnamed
colour; the held-out counts are asked by a test set of their own (template ``unseen_count``, drawn the same
way with the held-out count as the answer).

Everything is a pure function of the seed and an index: batch ``i`` of training is the same in every run
(exact resume), and the test set is the same in every process.

**Your own pictures** (``--data DIR``): a directory with an answers file ``answers.tsv`` — tab-separated,
UTF-8, one question per line under a header line::

    image	question	answer	split	template
    pics/0001.png	how many birds are there?	3	train	count
    pics/0001.png	what colour is the impala?	red	test	colour

``image`` is a path relative to ``DIR`` and inside it (PNG, JPEG, ... or ``.npy``; RGB; every image the same size, a
multiple of the model's patch size; a path that leaves ``DIR`` — ``..``, an absolute path, a symbolic link to
elsewhere — is refused, so an answers file cannot make a run read any picture on the disk), ``question`` any text
(lower-cased, punctuation dropped, split on spaces), ``answer`` one word. The ``split`` (``train``/``test``) and
``template`` (a label for per-template metrics) columns are optional: without ``split`` a seeded 20% of the images
(with all their questions) is the test set; without ``template`` every question counts as ``question``.
:func:`write_question_dir` writes generated scenes in this format (a starting point, and what the tests use).
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import random
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from ..errors import ConfigError, DataError
from .spec import DataSpec, register_data

__all__ = [
    "SPECIES", "PLURAL", "COLOURS", "CORNERS", "TEMPLATES", "ANSWERS", "IMAGE_SIZE", "GRID", "CELL",
    "Animal", "Scene", "Item", "QASet", "AnimalQuestions", "held_out_kinds", "held_out_counts", "render",
    "sample_item", "sample_items", "question_words", "tokenize_question", "encode_questions",
    "write_question_dir", "read_question_dir", "ANSWERS_FILE", "object_patches",
]

IMAGE_SIZE = 64
GRID = 4
CELL = IMAGE_SIZE // GRID  # 16 pixels
SPECIES = ("bird", "fish", "cat", "impala", "turtle")
PLURAL = {"bird": "birds", "fish": "fish", "cat": "cats", "impala": "impalas", "turtle": "turtles",
          "animal": "animals"}
COLOURS = {"red": (0.86, 0.14, 0.12), "green": (0.14, 0.62, 0.2), "blue": (0.16, 0.32, 0.92),
           "yellow": (0.95, 0.8, 0.08), "purple": (0.6, 0.2, 0.74)}
# Corner name → grid cell (row, column).
CORNERS = {"top left": (0, 0), "top right": (0, GRID - 1), "bottom left": (GRID - 1, 0),
           "bottom right": (GRID - 1, GRID - 1)}
CORNER_PAIRS = tuple((a, b) for i, a in enumerate(CORNERS) for b in list(CORNERS)[i + 1:])  # the 6 pairs
TEMPLATES = ("count", "count_colour", "same_species", "species", "colour")
MAX_ANIMALS = 9
ANSWERS = (*(str(i) for i in range(MAX_ANIMALS + 1)), "yes", "no", *COLOURS, *SPECIES)
# Colours no question names, worn by every species in training and test alike: each species is seen in many
# colours, so what makes a bird a bird cannot be its colour (the held-out kinds are named colours only).
EXTRA_COLOURS = {"teal": (0.08, 0.62, 0.62), "pink": (0.96, 0.56, 0.76), "charcoal": (0.22, 0.22, 0.26)}
EXTRA_SHARE = 0.25
ALL_COLOURS = {**COLOURS, **EXTRA_COLOURS}
BACKGROUND = (0.95, 0.93, 0.87)
COLOUR_JITTER = 0.12
ANSWERS_FILE = "answers.tsv"


# -- scenes ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Animal:
    """One animal: its kind, its grid cell and where its sprite's top-left pixel is; ``size`` in pixels."""

    species: str
    colour: str
    row: int
    col: int
    top: int
    left: int
    size: int
    flip: bool

    @property
    def kind(self) -> tuple[str, str]:
        return (self.species, self.colour)

    @property
    def box(self) -> tuple[int, int, int, int]:
        """``(top, left, height, width)`` in pixels."""
        return (self.top, self.left, self.size, self.size)


@dataclass(frozen=True)
class Scene:
    """Animals (in distinct cells) and clutter: ``(kind, y, x, length, angle)`` with kind pebble or twig."""

    animals: tuple[Animal, ...]
    clutter: tuple[tuple[str, float, float, float, float], ...] = ()

    def at(self, cell: tuple[int, int]) -> Animal | None:
        return next((animal for animal in self.animals if (animal.row, animal.col) == cell), None)


@dataclass(frozen=True)
class Item:
    """One question about one scene: the text, its answer, its template and the animals it is about."""

    scene: Scene
    question: str
    answer: str
    template: str
    about: tuple[Animal, ...]  # the animals the question asks about (what its attention should find)


# -- drawing -----------------------------------------------------------------------------------------------
def _silhouette(species: str, n: int) -> np.ndarray:
    """The species' shape as a boolean mask ``(n, n)`` in unit coordinates (u right, v down, both in [-1, 1])."""
    centres = (np.arange(n) + 0.5) / n * 2 - 1
    v_coord, u_coord = np.meshgrid(centres, centres, indexing="ij")

    def ell(cu, cv, ru, rv):
        return ((u_coord - cu) / ru) ** 2 + ((v_coord - cv) / rv) ** 2 <= 1

    def tri(p, q, r):  # inside the triangle pqr (either orientation)
        def side(a, b):
            return (u_coord - b[0]) * (a[1] - b[1]) - (a[0] - b[0]) * (v_coord - b[1])

        side_pq, side_qr, side_rp = side(p, q), side(q, r), side(r, p)
        return ~(((side_pq < 0) | (side_qr < 0) | (side_rp < 0)) & ((side_pq > 0) | (side_qr > 0) | (side_rp > 0)))

    def rect(u0, v0, u1, v1):
        return (u_coord >= u0) & (u_coord <= u1) & (v_coord >= v0) & (v_coord <= v1)

    if species == "bird":  # body, head and beak, a raised wing, a tail
        m = ell(-0.05, 0.2, 0.55, 0.3) | ell(0.5, -0.15, 0.25, 0.25) | tri((0.7, -0.28), (1.0, -0.12), (0.7, -0.02))
        m |= tri((-0.35, 0.05), (0.25, 0.05), (-0.55, -0.85)) | tri((-0.5, 0.15), (-1.0, -0.05), (-0.95, 0.4))
        return m
    if species == "fish":  # an oval body with an eye, a forked tail
        m = ell(0.1, 0.0, 0.62, 0.38) | tri((-0.45, 0.0), (-1.0, -0.55), (-1.0, 0.55))
        return m & ~ell(0.42, -0.08, 0.1, 0.1)
    if species == "cat":  # a round head with two pointed ears and two eyes
        m = ell(0.0, 0.2, 0.62, 0.55) | tri((-0.62, -0.05), (-0.1, -0.3), (-0.55, -0.95))
        m |= tri((0.62, -0.05), (0.1, -0.3), (0.55, -0.95))
        return m & ~ell(-0.25, 0.1, 0.11, 0.11) & ~ell(0.25, 0.1, 0.11, 0.11)
    if species == "impala":  # a body on four thin legs, a neck, a head with two horns
        m = ell(-0.1, 0.05, 0.55, 0.25)
        for leg_left in (-0.55, -0.35, 0.1, 0.3):
            m |= rect(leg_left, 0.1, leg_left + 0.12, 0.95)
        m |= tri((0.25, 0.05), (0.45, -0.1), (0.62, -0.6)) | tri((0.25, 0.05), (0.62, -0.6), (0.45, 0.1))
        m |= ell(0.68, -0.58, 0.2, 0.14)
        m |= tri((0.55, -0.65), (0.63, -0.65), (0.45, -1.0)) | tri((0.7, -0.65), (0.78, -0.65), (0.72, -1.0))
        return m
    if species == "turtle":  # a domed shell over four stubby legs, a head in front
        m = ell(0.0, 0.25, 0.7, 0.6) & (v_coord <= 0.3)
        m |= rect(-0.75, 0.25, 0.75, 0.42)
        for leg_left in (-0.6, 0.35):
            m |= rect(leg_left, 0.4, leg_left + 0.25, 0.7)
        return m | ell(0.82, 0.1, 0.18, 0.16)
    raise ValueError(f"unknown species {species!r}")


SUPERSAMPLE = 4
SPRITE = 14  # an animal's side in pixels: it sits in its 16-pixel cell at an offset of 0–2 pixels


@functools.lru_cache(maxsize=64)
def sprite(species: str, size: int, flip: bool = False) -> np.ndarray:
    """The species' alpha mask ``(size, size)`` in [0, 1], antialiased (drawn at 4× and averaged)."""
    n = size * SUPERSAMPLE
    m = _silhouette(species, n).astype(np.float32)
    alpha = m.reshape(size, SUPERSAMPLE, size, SUPERSAMPLE).mean((1, 3))  # (size, size)
    return np.ascontiguousarray(alpha[:, ::-1]) if flip else alpha


def _paste(img: np.ndarray, alpha: np.ndarray, colour: np.ndarray, top: int, left: int) -> None:
    """Alpha-blend a sprite of one colour into ``img`` ``(3, H, W)`` in place, clipped to the image."""
    H, W = img.shape[1:]
    sprite_h, sprite_w = alpha.shape
    first_row, first_col = max(0, top), max(0, left)
    end_row, end_col = min(H, top + sprite_h), min(W, left + sprite_w)
    if first_row >= end_row or first_col >= end_col:
        return
    visible = alpha[first_row - top:end_row - top, first_col - left:end_col - left][None]  # (1, h', w')
    region = img[:, first_row:end_row, first_col:end_col]
    region *= 1 - visible
    region += visible * colour[:, None, None]


@functools.lru_cache(maxsize=64)
def _clutter_sprite(kind: str, length: float, angle: float) -> np.ndarray:
    n = int(np.ceil(length)) + 2
    n += n % 2
    offsets = np.arange(n * SUPERSAMPLE) / SUPERSAMPLE + 0.5 / SUPERSAMPLE - n / 2
    y, x = np.meshgrid(offsets, offsets, indexing="ij")
    if kind == "pebble":
        m = x * x + (y * 1.3) ** 2 <= (length / 2) ** 2
    else:  # a twig: a thin segment at an angle
        distance = np.abs(-np.sin(angle) * x + np.cos(angle) * y)
        along = np.abs(np.cos(angle) * x + np.sin(angle) * y)
        m = (distance <= 0.55) & (along <= length / 2)
    return m.astype(np.float32).reshape(n, SUPERSAMPLE, n, SUPERSAMPLE).mean((1, 3))


def render(scene: Scene, image_size: int = IMAGE_SIZE, seed: int = 0) -> np.ndarray:
    """The scene as float32 ``(3, H, W)`` in [0, 1]: background, clutter, then the animals on top.

    Colours vary per animal (a seeded jitter of ±``COLOUR_JITTER`` per channel), so a colour is a region of
    colour space rather than one exact value (and a species is seen in many shades).
    """
    rng = np.random.default_rng(seed)
    img = np.empty((3, image_size, image_size), np.float32)
    img[:] = np.asarray(BACKGROUND, np.float32)[:, None, None]
    for kind, y, x, length, angle in scene.clutter:
        piece = _clutter_sprite(kind, length, angle)
        grey = 0.45 + 0.2 * rng.random()
        col = np.array([grey, grey, grey] if kind == "pebble" else [0.55, 0.42, 0.3], np.float32)
        _paste(img, piece, col, int(round(y - piece.shape[0] / 2)), int(round(x - piece.shape[1] / 2)))
    for animal in scene.animals:
        jitter = rng.uniform(-COLOUR_JITTER, COLOUR_JITTER, 3).astype(np.float32)
        col = np.clip(np.asarray(ALL_COLOURS[animal.colour], np.float32) + jitter, 0, 1)
        _paste(img, sprite(animal.species, animal.size, animal.flip), col, animal.top, animal.left)
    return img


# -- held-out combinations ----------------------------------------------------------------------------------
def _rng(seed, *key) -> random.Random:
    return random.Random(zlib.crc32(repr((seed, *key)).encode()))


@functools.lru_cache(maxsize=16)
def held_out_kinds(seed: int) -> frozenset[tuple[str, str]]:
    """Five (species, colour) kinds training never shows: species ``i`` with colour ``π(i)``, a seeded
    permutation, so every species and every colour keeps four pairings in training."""
    colours = list(COLOURS)
    _rng(seed, "kinds").shuffle(colours)
    return frozenset(zip(SPECIES, colours, strict=True))


@functools.lru_cache(maxsize=16)
def held_out_counts(seed: int) -> frozenset[tuple[str, int]]:
    """One held-out count per count question (``(question, count)`` pairs training never asks): the
    questions of ``count`` (each species and "animals") and of ``count_colour`` (each colour)."""
    rng = _rng(seed, "counts")
    out = set()
    for species in (*SPECIES, "animal"):
        out.add((f"how many {PLURAL[species]} are there", rng.randint(1 if species == "animal" else 0, MAX_ANIMALS)))
    for colour in COLOURS:
        out.add((f"how many {colour} animals are there", rng.randint(0, MAX_ANIMALS)))
    return frozenset(out)


# -- sampling questions and scenes ----------------------------------------------------------------------------
def _place(rng: random.Random, kinds: list[tuple[str, str]], cells: list[tuple[int, int]],
           num_clutter: int) -> Scene:
    animals = []
    for (species, colour), (row, col) in zip(kinds, cells, strict=True):
        size = SPRITE
        slack = CELL - size
        animals.append(Animal(species, colour, row, col, row * CELL + rng.randint(0, slack),
                              col * CELL + rng.randint(0, slack), size, rng.random() < 0.5))
    # Sizes and angles from small sets, so each piece's sprite is drawn once and cached.
    clutter = tuple(("pebble" if k == 0 else "twig", rng.uniform(0, IMAGE_SIZE), rng.uniform(0, IMAGE_SIZE),
                     rng.choice((3.0, 4.0, 5.0)) if k == 0 else rng.choice((5.0, 7.0, 9.0)),
                     0.0 if k == 0 else rng.randrange(8) * np.pi / 8)
                    for k in (rng.randrange(2) for _ in range(rng.randint(0, num_clutter))))
    return Scene(tuple(sorted(animals, key=lambda animal: (animal.row, animal.col))), clutter)


def _kind(rng: random.Random, allowed, species: str | None = None, colour: str | None = None,
          not_species: str | None = None, not_colour: str | None = None, named: bool = False) -> tuple[str, str]:
    """A random allowed (species, colour) kind under the constraints: a named colour, or (a quarter of the
    time, unless a named colour is asked for) one of the unnamed :data:`EXTRA_COLOURS`."""
    if colour is None and not named and rng.random() < EXTRA_SHARE:
        opts = [(kind_species, kind_colour) for kind_species in SPECIES for kind_colour in EXTRA_COLOURS
                if (species is None or kind_species == species) and kind_species != not_species]
        return rng.choice(opts)
    opts = [(kind_species, kind_colour) for kind_species, kind_colour in allowed
            if (species is None or kind_species == species) and (colour is None or kind_colour == colour)
            and kind_species != not_species and kind_colour != not_colour]
    return rng.choice(opts)


def _held_kind(rng: random.Random, held, species: str | None = None, colour: str | None = None,
               not_species: str | None = None, not_colour: str | None = None, named: bool = False) -> tuple[str, str]:
    """A random held-out kind under the same constraints as :func:`_kind` (every held-out kind is a named
    colour, and each species and each colour has exactly one, so every constraint a slot has is satisfiable)."""
    del named
    opts = [(kind_species, kind_colour) for kind_species, kind_colour in sorted(held)
            if (species is None or kind_species == species) and (colour is None or kind_colour == colour)
            and kind_species != not_species and kind_colour != not_colour]
    return rng.choice(opts)


def _kinds(rng: random.Random, allowed, slots: list[dict], held, j: int) -> list[tuple[str, str]]:
    """One kind per slot (each slot a dict of :func:`_kind`'s constraints); slot ``j`` holds a held-out kind
    (``held``; none when ``held`` is empty)."""
    return [_held_kind(rng, held, **constraints) if held and i == j else _kind(rng, allowed, **constraints)
            for i, constraints in enumerate(slots)]


def sample_item(rng: random.Random, *, seed: int, held_out: bool, num_clutter: int = 6,
                template: str | None = None) -> Item:
    """One (scene, question, answer): training side (``held_out=False``: no held-out kind in the picture) or
    test side (``held_out=True``: one animal, in a slot drawn uniformly, is a held-out kind on purpose; the
    others are drawn from all named kinds, held-out ones included, and the unnamed colours). A count question
    never asks a held-out (question, count) pair — except with ``template="unseen_count"``, which asks only
    those (a ``count`` or ``count_colour`` question whose count training never answered it with).

    The template is drawn uniformly from :data:`TEMPLATES` (or given); then its question and answer (a count
    question's count uniform over ``0`` … ``9``, ``1`` … ``9`` for *animals*, less its held-out count: a held-out
    count redraws question and count), then a scene that fits the answer. Nothing is drawn again for the
    held-out kind, so the test side's questions, answers and numbers of animals follow exactly the training
    side's distribution.
    """
    held_kinds, held_counts = held_out_kinds(seed), held_out_counts(seed)
    all_kinds = [(species, colour) for species in SPECIES for colour in COLOURS]
    allowed = all_kinds if held_out else [k for k in all_kinds if k not in held_kinds]
    template_name = template or rng.choice(TEMPLATES)
    for _ in range(1000):
        item = _try_item(rng, template_name, allowed, held_counts, num_clutter, held_kinds if held_out else frozenset())
        if item is not None:
            return item
    raise RuntimeError("no scene fits the constraints")  # pragma: no cover - the constraints are satisfiable


_CELLS = tuple((row, col) for row in range(GRID) for col in range(GRID))  # every cell of the grid, row by row


def _try_item(rng, template, allowed, held_counts, num_clutter, held) -> Item | None:
    """One item of ``template``, or None when the drawn count is a held-out one (the caller draws again).
    With ``held`` (the held-out kinds; test side), one slot drawn uniformly holds one of them."""
    if template == "unseen_count":
        counting = rng.choice(("count", "count_colour"))
        return _count_item(rng, counting, allowed, held_counts, num_clutter, held, unseen=True)
    build = _TEMPLATE_ITEMS.get(template)
    if build is None:
        raise ValueError(f"unknown template {template!r}; templates: {', '.join(TEMPLATES)}")
    return build(rng, template, allowed, held_counts, num_clutter, held)


def _count_item(rng, template, allowed, held_counts, num_clutter, held, unseen=False) -> Item | None:
    """The question "how many {species / colour} animals are there?" (``unseen``: a held-out (question, count)
    pair)."""
    if template == "count":
        species = rng.choice((*SPECIES, "animal"))
        question = f"how many {PLURAL[species]} are there"
    else:
        colour = rng.choice(list(COLOURS))
        question = f"how many {colour} animals are there"
    held_for_question = sorted(count for asked, count in held_counts if asked == question)
    if unseen:
        count = held_for_question[0]
    else:
        count = rng.randint(1 if template == "count" and species == "animal" else 0, MAX_ANIMALS)
        if count in held_for_question:
            return None
    n = rng.randint(max(1, count), MAX_ANIMALS)
    if template == "count":
        if species == "animal":
            n = count  # count >= 1 here
            slots = [{}] * n
        else:
            slots = [{"species": species}] * count + [{"not_species": species}] * (n - count)
    else:
        slots = [{"colour": colour}] * count + [{"not_colour": colour}] * (n - count)
    kinds = _kinds(rng, allowed, slots, held, rng.randrange(n) if held else -1)
    rng.shuffle(kinds)
    scene = _place(rng, kinds, rng.sample(_CELLS, n), num_clutter)
    about = tuple(animal for animal in scene.animals
                  if (template == "count" and (species == "animal" or animal.species == species))
                  or (template == "count_colour" and animal.colour == colour))
    return Item(scene, question + "?", str(count), "unseen_count" if unseen else template, about)


def _same_species_item(rng, template, allowed, held_counts, num_clutter, held) -> Item:
    """The lecture's question, "is the {corner} animal the same species as the {corner} animal?"."""
    corner_a, corner_b = rng.choice(CORNER_PAIRS)
    if rng.random() < 0.5:
        corner_a, corner_b = corner_b, corner_a  # either order of the two corners
    same = rng.random() < 0.5
    n = rng.randint(2, MAX_ANIMALS)
    j = rng.randrange(n) if held else -1  # 0: corner a, 1: corner b, else one of the others
    kind_a = _held_kind(rng, held) if j == 0 else _kind(rng, allowed)
    pick = functools.partial(_held_kind, rng, held) if j == 1 else functools.partial(_kind, rng, allowed)
    kind_b = pick(species=kind_a[0]) if same else pick(not_species=kind_a[0])
    rest = [cell for cell in _CELLS if cell not in (CORNERS[corner_a], CORNERS[corner_b])]
    kinds = [kind_a, kind_b] + _kinds(rng, allowed, [{}] * (n - 2), held, j - 2)
    scene = _place(rng, kinds, [CORNERS[corner_a], CORNERS[corner_b], *rng.sample(rest, n - 2)], num_clutter)
    question = f"is the {corner_a} animal the same species as the {corner_b} animal?"
    return Item(scene, question, "yes" if same else "no", template,
                (scene.at(CORNERS[corner_a]), scene.at(CORNERS[corner_b])))


def _species_item(rng, template, allowed, held_counts, num_clutter, held) -> Item:
    """The question "what species is the {corner} animal?"."""
    corner = rng.choice(list(CORNERS))
    n = rng.randint(1, MAX_ANIMALS)
    rest = [cell for cell in _CELLS if cell != CORNERS[corner]]
    kinds = _kinds(rng, allowed, [{}] * n, held, rng.randrange(n) if held else -1)
    scene = _place(rng, kinds, [CORNERS[corner], *rng.sample(rest, n - 1)], num_clutter)
    target = scene.at(CORNERS[corner])
    return Item(scene, f"what species is the {corner} animal?", target.species, template, (target,))


def _colour_item(rng, template, allowed, held_counts, num_clutter, held) -> Item:
    """The question "what colour is the {species}?" (the species named appears once)."""
    species = rng.choice(SPECIES)
    n = rng.randint(1, MAX_ANIMALS)
    slots = [{"species": species, "named": True}] + [{"not_species": species}] * (n - 1)
    kinds = _kinds(rng, allowed, slots, held, rng.randrange(n) if held else -1)
    rng.shuffle(kinds)
    scene = _place(rng, kinds, rng.sample(_CELLS, n), num_clutter)
    target = next(animal for animal in scene.animals if animal.species == species)
    return Item(scene, f"what colour is the {species}?", target.colour, template, (target,))


# one function per question template (unseen_count is count's with a held-out pair: _try_item)
_TEMPLATE_ITEMS = {"count": _count_item, "count_colour": _count_item, "same_species": _same_species_item,
                   "species": _species_item, "colour": _colour_item}


def sample_items(n: int, key: str, *, seed: int, held_out: bool, num_clutter: int = 6,
                 template: str | None = None) -> list[Item]:
    """``n`` items drawn from ``(seed, key)`` alone (a pure function of its arguments)."""
    rng = _rng(seed, key)
    return [sample_item(rng, seed=seed, held_out=held_out, num_clutter=num_clutter, template=template)
            for _ in range(n)]


# -- questions as tokens -----------------------------------------------------------------------------------------
PAD = "<pad>"


# Corner names are one token each, as a word-piece tokenizer would learn them (the two words always come
# together): "top right" is one place, and its token can look that place up in one step of attention.
PHRASES = tuple(CORNERS)


def tokenize_question(text: str) -> list[str]:
    """Lower-case, drop punctuation, split on white space, and join each corner name into one token:
    ``"Is the top right animal ...?"`` → ``["is", "the", "top right", "animal", ...]``."""
    words = re.sub(r"[^\w\s]", " ", str(text).lower()).split()
    out, i = [], 0
    while i < len(words):
        pair = " ".join(words[i:i + 2])
        if pair in PHRASES:
            out.append(pair)
            i += 2
        else:
            out.append(words[i])
            i += 1
    return out


def question_words() -> list[str]:
    """The vocabulary of the generated questions (``<pad>`` first), in a fixed order."""
    words = {"how", "many", "are", "there", "animals", "is", "the", "animal", "same", "species", "as", "what",
             "colour", *PHRASES}
    words |= set(SPECIES) | {PLURAL[species] for species in SPECIES} | set(COLOURS)
    return [PAD, *sorted(words)]


def encode_questions(questions: Sequence[str], words: Sequence[str], max_len: int) -> Tensor:
    """Questions → word ids ``(B, max_len)``, padded with 0 (``<pad>``).

    Raises:
        DataError: an empty question, a word outside ``words``, or more than ``max_len`` words.
    """
    index = {word: i for i, word in enumerate(words)}
    out = torch.zeros(len(questions), max_len, dtype=torch.long)
    for row, question in enumerate(questions):
        toks = tokenize_question(question)
        if not toks:
            raise DataError(f"the question {question!r} is empty; ask something, e.g. 'how many birds are there?'")
        unknown = [word for word in toks if word not in index or word == PAD]
        if unknown:
            shown = ", ".join(sorted(set(unknown))[:5])
            raise DataError(f"the question {question!r} has words outside the model's vocabulary: {shown} (it knows "
                            f"{len(words) - 1} words, e.g. {', '.join(list(words)[1:9])})")
        if len(toks) > max_len:
            raise DataError(f"the question {question!r} has {len(toks)} words; the model takes at most {max_len}")
        out[row, :len(toks)] = torch.tensor([index[word] for word in toks])
    return out


def object_patches(boxes, grid: tuple[int, int], patch: int) -> list[int]:
    """The patches (row-major on ``grid``) that a pixel box ``(top, left, height, width)`` of any of ``boxes``
    overlaps."""
    grid_h, grid_w = grid
    out = set()
    for top, left, box_h, box_w in boxes:
        for row in range(max(0, top // patch), min(grid_h, (top + box_h - 1) // patch + 1)):
            for col in range(max(0, left // patch), min(grid_w, (left + box_w - 1) // patch + 1)):
                out.add(row * grid_w + col)
    return sorted(out)


# -- a set of questions, as tensors ---------------------------------------------------------------------------------
@dataclass
class QASet:
    """Questions about images as the models take them.

    Attributes:
        images: float32 ``(N, 3, H, W)`` in [0, 1] (one per question; the same picture may repeat).
        questions: the question texts; ``answers``: answer ids into the spec's ``answers``.
        templates: each question's template (per-template metrics).
        boxes: per question, the ``(top, left, height, width)`` pixel boxes of the objects it is about
            (generated scenes; empty for a user's data).
        other_boxes: per question, the boxes of the picture's other animals (those it is not about; generated
            scenes): the control that tells looking at *the asked* animal from looking at animals at all.
    """

    images: Tensor
    questions: list[str]
    answers: Tensor
    templates: list[str]
    boxes: list[list[tuple[int, int, int, int]]] = field(default_factory=list)
    other_boxes: list[list[tuple[int, int, int, int]]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.questions)

    def subset(self, idx: list[int]) -> QASet:
        """The questions at the positions ``idx``, in that order."""
        return QASet(self.images[idx], [self.questions[i] for i in idx], self.answers[idx],
                     [self.templates[i] for i in idx], [self.boxes[i] for i in idx] if self.boxes else [],
                     [self.other_boxes[i] for i in idx] if self.other_boxes else [])


def _qaset(items: Sequence[Item], answers: Sequence[str], image_size: int, seed: int) -> QASet:
    index = {answer: i for i, answer in enumerate(answers)}
    images = torch.from_numpy(np.stack([render(item.scene, image_size, seed=zlib.crc32(f"{seed}-{i}".encode()))
                                        for i, item in enumerate(items)]))
    return QASet(images, [item.question for item in items], torch.tensor([index[item.answer] for item in items]),
                 [item.template for item in items], [[animal.box for animal in item.about] for item in items],
                 [[animal.box for animal in item.scene.animals if animal not in item.about] for item in items])


# -- the user's own pictures ---------------------------------------------------------------------------------------
def write_question_dir(directory: str | Path, n: int, *, seed: int = 0, test_fraction: float = 0.25) -> Path:
    """Write ``n`` generated questions as a ``--data DIR`` directory (PNG images and ``answers.tsv``)."""
    from PIL import Image

    root = Path(directory)
    (root / "images").mkdir(parents=True, exist_ok=True)
    items = sample_items(n, "export", seed=seed, held_out=False)
    rows = ["image\tquestion\tanswer\tsplit\ttemplate"]
    for i, item in enumerate(items):
        img = render(item.scene, seed=i)
        name = f"images/{i:05d}.png"
        Image.fromarray((img.transpose(1, 2, 0) * 255 + 0.5).astype(np.uint8)).save(root / name)
        split = "test" if i >= round(n * (1 - test_fraction)) else "train"
        rows.append(f"{name}\t{item.question}\t{item.answer}\t{split}\t{item.template}")
    (root / ANSWERS_FILE).write_text("\n".join(rows) + "\n", encoding="utf-8")
    return root


@dataclass
class QuestionDir:
    """A user's directory, read: the train and test sets, the vocabulary and the answers."""

    train: QASet
    test: QASet
    words: list[str]
    answers: list[str]
    image_size: int


def _check_inside(root: Path, name: str, where: str) -> None:
    """Refuse an image path that resolves outside ``root`` (by ``..``, an absolute path or a symbolic link)."""
    try:
        inside = (root / name).resolve().is_relative_to(root)
    except (OSError, RuntimeError, ValueError):  # a symlink loop, a NUL byte in the name
        inside = False
    if not inside:
        raise DataError(f"{where}: the image {name!r} is outside {root}; images must be files inside the directory "
                        f"that holds {ANSWERS_FILE}")


def _read_answer_rows(directory: Path) -> tuple[Path, list[str], list[list[str]]]:
    """The answers file of a ``--data DIR`` directory, checked down to its header: its path, the header's column
    names (lower case) and its rows (the header first; blank lines dropped)."""
    if not directory.is_dir():
        raise DataError(f"question data {directory} is not a directory (expected a directory with {ANSWERS_FILE} "
                        "and the images it names)")
    answers_path = directory / ANSWERS_FILE
    if not answers_path.is_file():
        raise DataError(f"{directory} has no {ANSWERS_FILE}: a tab-separated file with the header "
                        "image<TAB>question<TAB>answer[<TAB>split][<TAB>template]")
    try:
        lines = answers_path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise DataError(f"{answers_path} is not UTF-8 text ({err})") from None
    try:
        rows = list(csv.reader([line for line in lines if line.strip()], delimiter="\t", quoting=csv.QUOTE_NONE))
    except csv.Error as err:  # a field longer than csv's limit (128 KiB)
        raise DataError(f"{answers_path} is not a readable answers file: {err}") from None
    if not rows:
        raise DataError(f"{answers_path} is empty; its first line is the header image<TAB>question<TAB>answer")
    header = [name.strip().lower() for name in rows[0]]
    missing = [column for column in ("image", "question", "answer") if column not in header]
    if missing:
        raise DataError(f"{answers_path}: the header line has no column {', '.join(missing)} (it has "
                        f"{', '.join(header)}); expected image<TAB>question<TAB>answer[<TAB>split][<TAB>template]")
    return answers_path, header, rows


def _checked_records(answers_path: Path, header: list[str], rows: list[list[str]], root: Path) -> list[dict]:
    """The answers file's question rows as records ``{column: field}``, each checked (field count, no empty
    field, words in the question, a one-word answer, a known split, an image inside ``root``)."""
    column_index = {name: i for i, name in enumerate(header)}
    if len(rows) < 2:
        raise DataError(f"{answers_path} has a header but no questions")
    records = []
    for line_no, row in enumerate(rows[1:], start=2):
        where = f"{answers_path}, line {line_no}"
        if len(row) != len(header):
            raise DataError(f"{where}: {len(row)} tab-separated fields, but the header has {len(header)}")
        record = {name: row[i].strip() for name, i in column_index.items()}
        for column in ("image", "question", "answer"):
            if not record[column]:
                raise DataError(f"{where}: the {column} is empty")
        if not tokenize_question(record["question"]):
            raise DataError(f"{where}: the question {record['question']!r} has no words")
        if len(record["answer"].split()) != 1:
            raise DataError(f"{where}: the answer {record['answer']!r} is not one word")
        if "split" in record and record["split"] not in ("train", "test"):
            raise DataError(f"{where}: split must be train or test, got {record['split']!r}")
        _check_inside(root, record["image"], where)
        records.append(record)
    return records


def _read_question_images(directory: Path, records: list[dict]) -> tuple[dict[str, Tensor], int]:
    """Each image the records name, read once (``{name: (3, H, W)}``), and their one side: RGB, square, one size."""
    from .image_files import read_image

    images: dict[str, Tensor] = {}
    for record in records:
        name = record["image"]
        if name not in images:
            x = read_image(directory / name)
            if x.shape[0] != 3:
                raise DataError(f"{directory / name}: question images are RGB; this one has {x.shape[0]} channel(s)")
            images[name] = x
    shapes = {tuple(x.shape) for x in images.values()}
    if len(shapes) > 1:
        raise DataError(f"the images of {directory} have different sizes {sorted(shapes)}; give them one size")
    (_, height, width), = shapes
    if height != width:
        raise DataError(f"the images of {directory} are {height}×{width}; the model takes square images")
    return images, height


def _split_records(records: list[dict], images: dict[str, Tensor], has_split: bool, seed: int,
                   test_fraction: float) -> tuple[list[dict], list[dict]]:
    """The records' train and test sides: a record's side is its split, or (without a split column) its image's
    side, ``test_fraction`` of the images drawn from ``seed``."""
    if has_split:
        test_names = {record["image"] for record in records if record["split"] == "test"}
    else:
        names = sorted(images)
        rng = random.Random(seed)
        test_names = set(rng.sample(names, max(1, round(test_fraction * len(names)))))
    train, test = [], []  # one pass (a row's side is its split, or its image's side without a split column)
    for record in records:
        (train if record["image"] not in test_names or record.get("split") == "train" else test).append(record)
    return train, test


@functools.lru_cache(maxsize=4)
def read_question_dir(directory: str, seed: int = 0, test_fraction: float = 0.2) -> QuestionDir:
    """Read a ``--data DIR`` directory (the format is in the module docstring).

    Raises:
        DataError: no directory, no or a malformed ``answers.tsv`` (a missing column, a short line, an empty
            field, a bad split), a missing or unreadable image, images of different sizes or not RGB.
    """
    root_dir = Path(directory)
    answers_path, header, rows = _read_answer_rows(root_dir)
    records = _checked_records(answers_path, header, rows, root_dir.resolve())
    images, side = _read_question_images(root_dir, records)
    train, test = _split_records(records, images, "split" in header, seed, test_fraction)
    if not train or not test:
        raise DataError(f"{answers_path} needs questions in both splits: it has {len(train)} train and "
                        f"{len(test)} test")
    words = [PAD, *sorted({word for record in records for word in tokenize_question(record["question"])} - {PAD})]
    answers = sorted({record["answer"] for record in records})
    answer_id = {answer: i for i, answer in enumerate(answers)}

    def qa(side_records):
        return QASet(torch.stack([images[record["image"]] for record in side_records]),
                     [record["question"] for record in side_records],
                     torch.tensor([answer_id[record["answer"]] for record in side_records]),
                     [record.get("template") or "question" for record in side_records], [[] for _ in side_records])

    return QuestionDir(qa(train), qa(test), words, answers, side)


# -- the spec ---------------------------------------------------------------------------------------------------
GENERATED = "generated"
GENERATED_PIXEL_MEAN = (0.91, 0.89, 0.84)
GENERATED_PIXEL_STD = (0.14, 0.14, 0.14)


@register_data
@dataclasses.dataclass
class AnimalQuestions(DataSpec):
    """Questions about pictures: the generated animal scenes (``source="generated"``; held-out kinds and
    counts chosen by ``seed``, ``test_size`` held-out test questions, ``unseen_size`` questions asking held-out
    counts, ``val_size`` for monitoring, up to
    ``clutter`` pieces of clutter per picture) or a user's directory (``source`` its path; ``test_fraction``
    of its images are the test set when it names no split). ``words`` and ``answers`` — the question
    vocabulary and the answer classes — come from the data when training starts.

    Args:
        source: ``generated`` (the animal scenes) or the path of a directory of pictures and questions.
        seed: draws the scenes and which kinds and counts are held out.
        test_size: held-out test questions (generated data).
        unseen_size: test questions asking counts never asked in training (generated data).
        val_size: questions for monitoring during training.
        clutter: the most pieces of clutter drawn in a picture (generated data).
        test_fraction: the share of a directory's images that test, when it names no split.
    """

    kind: ClassVar[str] = "animal-questions"
    derived: ClassVar[tuple[str, ...]] = ("words", "answers")
    source: str = GENERATED
    seed: int = 0
    test_size: int = 2000
    unseen_size: int = 250
    val_size: int = 400
    clutter: int = 6
    test_fraction: float = 0.2
    words: list[str] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)

    def __post_init__(self):
        if self.test_size < 1 or self.val_size < 1 or self.unseen_size < 0 or self.clutter < 0:
            raise ConfigError("test_size and val_size must be >= 1, unseen_size and clutter >= 0")
        if not 0 < self.test_fraction < 1:
            raise ConfigError(f"test_fraction must be in (0, 1), got {self.test_fraction}")

    @property
    def generated(self) -> bool:
        return self.source in (None, "", GENERATED)

    def user(self) -> QuestionDir:
        return read_question_dir(str(self.source), self.seed, self.test_fraction)

    def filled(self) -> AnimalQuestions:
        """This spec with ``words`` and ``answers`` read from the data."""
        if self.generated:
            return self.replace(words=question_words(), answers=list(ANSWERS))
        user_dir = self.user()
        return self.replace(words=user_dir.words, answers=user_dir.answers)

    def pixel_stats(self) -> tuple[list[float], list[float]]:
        """Per-channel mean and standard deviation of the training pictures (the generator's, measured once on
        640 pictures and rounded; a directory's, computed from its training images)."""
        if self.generated:
            return list(GENERATED_PIXEL_MEAN), list(GENERATED_PIXEL_STD)
        x = self.user().train.images
        return ([round(float(v), 4) for v in x.mean((0, 2, 3))],
                [round(max(float(v), 1e-3), 4) for v in x.std((0, 2, 3))])

    @property
    def image_size(self) -> int:
        return IMAGE_SIZE if self.generated else self.user().image_size

    def val(self) -> QASet:
        """Validation questions (drawn like the test set, from another key): monitoring only."""
        if not self.generated:
            return self.user().test
        return _generated_set(self.seed, "val", self.val_size, self.clutter)

    def held_out(self) -> QASet:
        """The test questions: generated, ``test_size`` questions drawn as training's are (templates, answers
        and numbers of animals in the same proportions; no count question asks a held-out count — those are
        :meth:`unseen_counts`), each picture holding a held-out kind in one slot drawn uniformly; or the
        directory's test split."""
        if not self.generated:
            return self.user().test
        return _generated_set(self.seed, "test", self.test_size, self.clutter)

    def unseen_counts(self) -> QASet:
        """Count questions that ask only held-out (question, count) pairs (``unseen_size`` of them, template
        ``unseen_count``), about test-side pictures; empty for a user's directory."""
        if not self.generated:
            return QASet(torch.zeros(0, 3, self.image_size, self.image_size), [], torch.zeros(0, dtype=torch.long),
                         [])
        return _generated_set(self.seed, "unseen", self.unseen_size, self.clutter, "unseen_count")

    def batch_items(self, index: int, batch_size: int) -> list[Item]:
        """Training batch ``index`` of generated items (a pure function of ``(seed, index)``)."""
        return sample_items(batch_size, f"train-{index}", seed=self.seed, held_out=False, num_clutter=self.clutter)


@functools.lru_cache(maxsize=8)
def _generated_set(seed: int, split: str, n: int, clutter: int, template: str | None = None,
                   held_out: bool = True) -> QASet:
    items = sample_items(n, split, seed=seed, held_out=held_out, num_clutter=clutter, template=template)
    return _qaset(items, ANSWERS, IMAGE_SIZE, seed=zlib.crc32(f"{seed}-{split}".encode()))


class QABatches:
    """The trainer's batch source: ``batch(i) → ((images (B, 3, H, W), questions (B, T)), answers (B,))``.

    Generated data: batch ``i`` is drawn fresh from ``(seed, i)`` (no picture is seen twice). A user's
    directory: shuffled epochs of its training questions, epoch ``e`` permuted by ``(seed, e)``.
    """

    def __init__(self, spec: AnimalQuestions, batch_size: int, max_len: int):
        self.spec, self.batch_size, self.max_len = spec, batch_size, max_len
        self.words, self.answers = spec.words, spec.answers
        self._index = {answer: i for i, answer in enumerate(self.answers)}
        self.train = None if spec.generated else spec.user().train
        self.max_index = -1  # the furthest batch drawn so far (batches trained = max_index + 1)
        if self.train is not None and not 1 <= batch_size <= len(self.train):
            raise DataError(f"batch_size must be in 1..{len(self.train)} (the training questions), got {batch_size}")

    def batch(self, index: int):
        self.max_index = max(self.max_index, index)
        if self.train is None:
            items = self.spec.batch_items(index, self.batch_size)
            images = torch.from_numpy(np.stack([render(item.scene, seed=zlib.crc32(f"{index}-{i}".encode()))
                                                for i, item in enumerate(items)]))
            questions = [item.question for item in items]
            answers = torch.tensor([self._index[item.answer] for item in items])
        else:
            per_epoch = len(self.train) // self.batch_size
            epoch, pos = divmod(index, per_epoch)
            generator = torch.Generator().manual_seed((self.spec.seed * 1_000_003 + epoch) % 2**63)
            order = torch.randperm(len(self.train), generator=generator)
            idx = order[pos * self.batch_size:(pos + 1) * self.batch_size]
            images, answers = self.train.images[idx], self.train.answers[idx]
            questions = [self.train.questions[i] for i in idx.tolist()]
        return (images, encode_questions(questions, self.words, self.max_len)), answers
