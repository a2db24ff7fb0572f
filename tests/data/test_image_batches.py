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
