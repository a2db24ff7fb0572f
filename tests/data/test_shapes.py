"""The embedded captioning generator: captions describe the picture, held-out combinations stay out."""

import random

import numpy as np
import pytest
import torch

from tokennet.data.shapes import (
    CELL,
    COLORS,
    IMAGE_SIZE,
    Obj,
    Scene,
    ShapeCaptions,
    caption,
    caption_corpus,
    held_out_scenes,
    is_held_out,
    random_scene,
    render,
    sample_scenes,
)
from tokennet.tokens.text import train_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


def _obj(size, color, shape, row, col):
    side = 12 if size == "large" else 6
    return Obj(size, color, shape, row, col, col * CELL + CELL / 2, row * CELL + CELL / 2, side)


def test_caption_grammar():
    a = _obj("small", "red", "circle", 0, 1)
    b = _obj("large", "blue", "square", 1, 1)
    c = _obj("small", "green", "triangle", 1, 2)
    assert caption(Scene((a,))) == "a small red circle"
    assert caption(Scene((a, b))) == "a small red circle above a large blue square"
    assert caption(Scene((a, b, c))) == "a small red circle above a large blue square left of a small green triangle"


def test_render_puts_each_shape_in_its_colour_at_its_place():
    s = random_scene(random.Random(0), 3)
    img = render(s)
    assert img.shape == (3, IMAGE_SIZE, IMAGE_SIZE) and img.dtype == np.float32
    assert 0 <= img.min() and img.max() <= 1
    for o in s.objects:
        px = img[:, int(o.cy + o.side / 4), int(o.cx)]  # inside every shape (below the centre for triangles)
        np.testing.assert_allclose(px, COLORS[o.color], atol=1e-6)
        assert o.row * CELL <= o.cy - o.side / 2 and o.cy + o.side / 2 <= (o.row + 1) * CELL  # stays in its cell


def test_scenes_are_in_reading_order_in_distinct_cells():
    rng = random.Random(1)
    for _ in range(200):
        s = random_scene(rng)
        cells = [(o.row, o.col) for o in s.objects]
        assert cells == sorted(cells) and len(set(cells)) == len(cells)
        assert 1 <= len(cells) <= 3


def test_held_out_combinations_never_appear_in_training():
    train = sample_scenes(300, "t", held_out=False, split_seed=0)
    test = held_out_scenes(0, 300)
    train_combos = {s.combination for s in train}
    assert all(is_held_out(s, 0) for s in test)
    assert not train_combos & {s.combination for s in test}
    # every word still occurs in training
    words = {w for s in train for w in caption(s).split()}
    assert words >= {w for s in test for w in caption(s).split()}


def test_batches_are_deterministic_and_match_the_tokenizer():
    tok = train_tokenizer("bpe", caption_corpus(), vocab_size=320)
    src = ShapeCaptions(tok, 4, seed=0)
    (im1, t1), y1 = src.batch(3)
    (im2, t2), y2 = src.batch(3)
    assert torch.equal(im1, im2) and torch.equal(t1, t2) and torch.equal(y1, y2)
    assert im1.shape == (4, 3, IMAGE_SIZE, IMAGE_SIZE)
    # one token per word: a 3-object caption is 15 tokens + <eos>
    assert tok.encode("a small red circle above a large blue square left of a small green triangle").__len__() == 15


def test_bad_arguments():
    with pytest.raises(ValueError):
        random_scene(random.Random(0), 0)
    with pytest.raises(ValueError):
        sample_scenes(1, 0, held_out=True, fraction=1.5)
