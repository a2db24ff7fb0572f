"""`ImageBatches` (epochs, batch i a pure function of i) and `evaluate_classifier`."""

import pytest
import torch

from tokennet.data.augment import Augment
from tokennet.data.image_batches import ImageBatches, evaluate_classifier
from tokennet.data.text import DataError


def test_batches_are_epochs_and_pure_functions_of_the_index():
    x = torch.arange(10, dtype=torch.float32)[:, None, None].expand(10, 1, 3).clone()  # item i holds i
    y = torch.arange(10)
    src = ImageBatches(x, y, 3, seed=5)
    assert src.steps_per_epoch == 3
    epoch0 = torch.cat([src.batch(i)[1] for i in range(3)])
    assert len(set(epoch0.tolist())) == 9  # 9 distinct items, one dropped
    epoch1 = torch.cat([src.batch(i)[1] for i in range(3, 6)])
    assert not torch.equal(epoch0, epoch1)
    other = ImageBatches(x, y, 3, seed=5, augment=None)
    for i in (7, 0, 4):  # any order: batch i never depends on what was drawn before
        torch.testing.assert_close(other.batch(i), src.batch(i))
    aug = ImageBatches(x, y, 3, seed=5, augment=Augment(translate=1))
    torch.testing.assert_close(aug.batch(4), ImageBatches(x, y, 3, seed=5, augment=Augment(translate=1)).batch(4))
    mixed = ImageBatches(x, y, 3, seed=5, mixup=0.2, num_classes=10).batch(2)[1]
    assert mixed.shape == (3, 10)
    with pytest.raises(DataError, match="batch_size must be in 1..10"):
        ImageBatches(x, y, 11)


def test_evaluate_classifier():
    class Oracle(torch.nn.Module):  # predicts the class stored in the first pixel, confidently
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, x, targets=None):
            from tokennet.models import Output

            return Output(torch.nn.functional.one_hot(x[:, 0, 0].long(), 4).float() * 20)

    x = torch.tensor([0, 1, 2, 3, 1], dtype=torch.float32)[:, None, None]
    y = torch.tensor([0, 1, 2, 0, 1])
    m = evaluate_classifier(Oracle(), x, y, batch_size=2)
    assert m["test_accuracy"] == pytest.approx(0.8)
    assert m["test_loss"] == pytest.approx(20 / 5, abs=1e-3)


def test_repeated_augmentation_holds_each_image_m_times_with_its_own_augmentation():
    x = torch.rand(40, 1, 6, 6)
    y = torch.arange(40)
    src = ImageBatches(x, y, 12, seed=1, augment=Augment(translate=1), repeats=3)
    assert src.distinct == 4 and src.steps_per_epoch == 10  # one pass over the distinct images
    xb, yb = src.batch(0)
    assert yb.view(4, 3).eq(yb.view(4, 3)[:, :1]).all() and len(yb.unique()) == 4
    assert not torch.equal(xb[0], xb[1])  # the same image, two augmentations
    epoch = torch.cat([src.batch(i)[1] for i in range(10)])
    assert sorted(epoch.unique().tolist()) == list(range(40))
    torch.testing.assert_close(src.batch(7), ImageBatches(x, y, 12, seed=1, augment=Augment(translate=1),
                                                          repeats=3).batch(7))
    with pytest.raises(ValueError, match="repeats"):
        ImageBatches(x, y, 12, repeats=13)


def test_mixup_and_cutmix_take_turns_per_batch():
    x = torch.rand(64, 1, 8, 8)
    y = torch.arange(64) % 4
    src = ImageBatches(x, y, 16, seed=0, mixup=0.8, cutmix=1.0, num_classes=4)
    kinds = set()
    for i in range(12):
        xb, _ = src.batch(i)
        # cutmix leaves pixels that are exactly an original image's outside its box; mixup blends every pixel
        idx = src._permutation(0)[(i % src.steps_per_epoch) * 16:(i % src.steps_per_epoch + 1) * 16]
        kinds.add("cutmix" if bool((xb == x[idx]).flatten(1).any(1).all()) else "mixup")
    assert kinds == {"cutmix", "mixup"}


def test_a_teacher_labels_the_batch_exactly_as_the_student_sees_it():
    x = torch.rand(30, 1, 6, 6)
    y = torch.arange(30) % 3
    seen = []

    def teacher(images):
        seen.append(images.clone())
        return (images.mean((1, 2, 3)) * 1000).long() % 3

    src = ImageBatches(x, y, 10, seed=2, augment=Augment(translate=1), mixup=0.5, num_classes=3, teacher=teacher)
    xb, (yb, tb) = src.batch(4)
    assert torch.equal(seen[-1], xb) and yb.shape == (10, 3) and tb.shape == (10,)
    xb2, (yb2, tb2) = src.batch(4)  # a pure function of the index, teacher included
    assert torch.equal(xb, xb2) and torch.equal(yb, yb2) and torch.equal(tb, tb2)
