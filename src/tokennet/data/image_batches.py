"""Batches of a labelled image (or signal) set: shuffled, augmented training batches and the test pass.

:class:`ImageBatches` seeds each batch's augmentation by the batch index, so batch ``i`` is the same
in every run with the same seed (exact resume); :func:`evaluate_classifier` walks the test set in
order, in batches.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import ConfigError, DataError
from .augment import mixup

__all__ = ["ImageBatches", "evaluate_classifier"]


class ImageBatches:
    """Shuffled epochs of augmented ``(images, labels)`` batches; ``batch(i)`` is a pure function of ``i``.

    Batch ``i`` belongs to epoch ``i // steps_per_epoch`` and takes its slice of that epoch's permutation
    (seeded by the epoch); its augmentation is seeded by ``i``. The last partial batch of an epoch is
    dropped, so every batch has ``batch_size`` items.

    Args:
        x: inputs ``(N, ...)``.
        y: labels ``(N,)``.
        batch_size: items per batch (at most N).
        seed: the data seed.
        augment: ``augment(batch, generator) -> batch``, e.g. an :class:`Augment`.
    """

    def __init__(self, x: Tensor, y: Tensor, batch_size: int, *, seed: int = 0, augment=None, mixup: float = 0.0,
                 num_classes: int | None = None):
        if len(x) != len(y):
            raise DataError(f"{len(x)} inputs but {len(y)} labels")
        if not 1 <= batch_size <= len(x):
            raise DataError(f"batch_size must be in 1..{len(x)} (the training set size), got {batch_size}")
        if mixup < 0:
            raise ConfigError(f"mixup must be >= 0 (the Beta(α, α) parameter; 0 = off), got {mixup}")
        self.x, self.y, self.batch_size, self.seed, self.augment = x, y, batch_size, seed, augment
        self.mixup = mixup
        self.num_classes = int(y.max()) + 1 if num_classes is None else num_classes
        self.steps_per_epoch = len(x) // batch_size
        self._epoch, self._perm = -1, None
        self.max_index = -1  # the furthest batch drawn so far (batches trained = max_index + 1)

    def _permutation(self, epoch: int) -> Tensor:
        if epoch != self._epoch:
            g = torch.Generator().manual_seed((self.seed * 1_000_003 + epoch) % 2**63)
            self._epoch, self._perm = epoch, torch.randperm(len(self.x), generator=g)
        return self._perm

    def batch(self, index: int) -> tuple[Tensor, Tensor]:
        if index < 0:
            raise ValueError(f"batch index must be >= 0, got {index}")
        self.max_index = max(self.max_index, index)
        epoch, pos = divmod(index, self.steps_per_epoch)
        idx = self._permutation(epoch)[pos * self.batch_size:(pos + 1) * self.batch_size]
        x, y = self.x[idx], self.y[idx]
        if self.augment is None and self.mixup == 0:
            return x, y
        g = torch.Generator().manual_seed((self.seed * 999_983 + index + 7_777_777) % 2**63)
        if self.augment is not None:
            x = self.augment(x, g)
        if self.mixup > 0:
            x, y = mixup(x, y, self.num_classes, self.mixup, g)
        return x, y


def evaluate_classifier(model, x: Tensor, y: Tensor, *, batch_size: int = 500) -> dict[str, float]:
    """Accuracy and mean (unsmoothed) cross-entropy of ``model(x).logits`` over a labelled set, in batches."""
    dev = next(model.parameters()).device
    correct, loss = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(x), batch_size):
            xb, yb = x[i:i + batch_size].to(dev), y[i:i + batch_size].to(dev)
            logits = model(xb).logits.float()
            correct += int((logits.argmax(-1) == yb).sum())
            loss += float(torch.nn.functional.cross_entropy(logits, yb, reduction="sum"))
    n = max(1, len(x))
    return {"test_accuracy": correct / n, "test_loss": loss / n}
