"""Batch augmentation: translation, flips, erasing, affine warps, mixup — reproducible from a generator."""

import pytest
import torch

from tokennet.data.augment import Augment, mixup, random_affine, random_erase, random_flip, random_translate


def g(seed=0):
    return torch.Generator().manual_seed(seed)


def test_translate_moves_content_by_at_most_the_shift():
    x = torch.zeros(64, 1, 8, 8)
    x[:, 0, 4, 4] = 1.0
    y = random_translate(x, 2, g())
    assert y.shape == x.shape and (y.sum((1, 2, 3)) == 1).all()  # nothing falls off at ±2
    pos = y[:, 0].flatten(1).argmax(1)
    rows, cols = pos // 8, pos % 8
    assert rows.min() == 2 and rows.max() == 6 and cols.min() == 2 and cols.max() == 6
    torch.testing.assert_close(random_translate(x, 2, g(1)), random_translate(x, 2, g(1)))
    s = torch.zeros(16, 1, 10)
    s[:, 0, 5] = 1.0
    shifted = random_translate(s, 3, g()).argmax(-1)
    assert shifted.min() >= 2 and shifted.max() <= 8


def test_flip_erase_affine():
    x = torch.rand(32, 1, 8, 8)
    f = random_flip(x, g())
    flipped = (f == x.flip(-1)).flatten(1).all(1)
    assert 0 < flipped.sum() < 32 and ((f == x).flatten(1).all(1) | flipped).all()
    e = random_erase(torch.ones(200, 1, 8, 8), g(), p=0.5)
    erased = (e == 0).flatten(1).any(1)
    assert 60 < erased.sum() < 140 and e[~erased].eq(1).all()
    torch.testing.assert_close(random_affine(x, g(), degrees=0, scale=0), x)
    assert not torch.allclose(random_affine(x, g(), degrees=15, scale=0.1), x)
    aug = Augment(translate=1, flip=True, erase=0.25, rotate=10, scale=0.1)
    torch.testing.assert_close(aug(x, g(3)), aug(x, g(3)))
    with pytest.raises(ValueError, match="translate"):
        Augment(translate=-1)


def test_mixup_mixes_inputs_and_labels_alike():
    x = torch.rand(8, 1, 4, 4)
    y = torch.arange(8) % 3
    xm, ym = mixup(x, y, 3, 0.4, g())
    assert ym.shape == (8, 3)
    torch.testing.assert_close(ym.sum(1), torch.ones(8))
    lam = ym.max(1).values.min()
    assert 0.5 <= lam <= 1
