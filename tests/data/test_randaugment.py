"""RandAugment on a batch and CutMix: each operation against its definition, reproducible from a generator."""

import pytest
import torch

from tokennet.data.augment import Augment, cutmix
from tokennet.data.randaugment import OPS, rand_augment


def g(seed=0):
    return torch.Generator().manual_seed(seed)


def _images(b=8, c=1, seed=0):
    return torch.rand(b, c, 12, 12, generator=g(seed))


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_operation_keeps_shape_and_range_and_is_the_identity_at_magnitude_zero(name):
    x = _images(c=3)
    y = OPS[name](x, torch.full((8,), 0.7))
    assert y.shape == x.shape and float(y.min()) >= 0 and float(y.max()) <= 1 + 1e-6
    if name in ("identity", "rotate", "shear_x", "shear_y", "translate_x", "translate_y", "contrast", "brightness",
                "sharpness", "color"):
        torch.testing.assert_close(OPS[name](x, torch.zeros(8)), x, atol=1e-5, rtol=0)


def test_colour_operations_follow_their_definitions():
    x = _images()
    v = torch.full((8,), 0.5)
    torch.testing.assert_close(OPS["solarize"](x, v), torch.where(x >= 0.5, 1 - x, x))
    torch.testing.assert_close(OPS["brightness"](x, v), (x * 1.45).clamp(0, 1))
    ac = OPS["auto_contrast"](x * 0.5 + 0.2, v)
    torch.testing.assert_close(ac.amin((2, 3)), torch.zeros(8, 1))
    torch.testing.assert_close(ac.amax((2, 3)), torch.ones(8, 1))
    # equalize: each pixel goes to the share of the image's pixels at a lower level (past the lowest level)
    img = (x[0, 0] ** 3 * 255).round() / 255
    levels = (img * 255).round().flatten()
    low = (levels == levels.min()).sum()
    want = ((levels[:, None] >= levels[None]).sum(1) - low).float() / (len(levels) - low)
    torch.testing.assert_close(OPS["equalize"](img[None, None], v[:1]).flatten(), want)
    assert len(OPS["posterize"](x, torch.ones(8)).unique()) <= 16  # 4 bits at magnitude 10
    torch.testing.assert_close(OPS["color"](x, v), x)  # a grey image has no colour to change


def test_geometric_operations_move_content():
    x = torch.zeros(2, 1, 12, 12)
    x[:, 0, 6, 2] = 1.0
    moved = OPS["translate_x"](x, torch.tensor([0.25, -0.25]))  # ±11% of 12 pixels: about 1.35 columns
    cols = moved[:, 0].sum(0).argmax(-1)
    assert cols.tolist() != [2, 2] and bool((moved[:, 0].sum((1, 2)) > 0.5).all())
    assert not torch.allclose(OPS["rotate"](x, torch.ones(2)), x)


def test_rand_augment_is_reproducible_and_applies_n_operations():
    x = _images()
    a, b = rand_augment(x, g(3), n=2, magnitude=9), rand_augment(x, g(3), n=2, magnitude=9)
    torch.testing.assert_close(a, b)
    assert not torch.allclose(a, x)
    torch.testing.assert_close(rand_augment(x, g(3), n=2, ops=("identity",)), x)
    assert not torch.allclose(rand_augment(x, g(4), n=2), a)
    aug = Augment(randaugment=2, magnitude=9)
    assert aug.active
    torch.testing.assert_close(aug(x, g(5)), aug(x, g(5)))
    signals = torch.rand(4, 1, 20)
    torch.testing.assert_close(aug(signals, g(5)), signals)  # 1-D signals: RandAugment does not apply
    with pytest.raises(ValueError, match="magnitude"):
        Augment(randaugment=2, magnitude=11)


def test_cutmix_pastes_a_box_and_mixes_labels_by_its_area():
    x = torch.arange(6, dtype=torch.float32).view(6, 1, 1, 1).expand(6, 1, 10, 10).clone()  # image i is all i
    y = torch.arange(6)
    xm, ym = cutmix(x, y, 6, 1.0, g(0))
    torch.testing.assert_close(ym.sum(1), torch.ones(6))
    pasted = xm != x  # (6, 1, 10, 10): the box, the same in every image whose partner is another image
    box = pasted.flatten(1).any(1)
    assert bool(box.any())
    for i in range(6):
        if box[i]:
            j = int(xm[i][pasted[i]][0])  # the partner whose pixels fill the box
            share = float(pasted[i].float().mean())
            assert float(ym[i, j]) == pytest.approx(share) and float(ym[i, i]) == pytest.approx(1 - share)
            assert bool((xm[i][pasted[i]] == j).all())
    sig, lab = cutmix(torch.rand(4, 1, 30), torch.arange(4) % 2, 2, 0.5, g(1))
    assert sig.shape == (4, 1, 30) and lab.shape == (4, 2)
