"""Batches of a labelled image (or signal) set: shuffled, augmented training batches and the test pass.

:class:`ImageBatches` seeds each batch's augmentation by the batch index, so batch ``i`` is the same
in every run with the same seed (exact resume); :func:`evaluate_classifier` walks the test set in
order, in batches.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ..errors import ConfigError, DataError
from .augment import cutmix, mixup

__all__ = ["ImageBatches", "evaluate_classifier"]


class ImageBatches:
    """Shuffled epochs of augmented ``(images, labels)`` batches; ``batch(i)`` is a pure function of ``i``.

    Batch ``i`` belongs to epoch ``i // steps_per_epoch`` and takes its slice of that epoch's permutation
    (seeded by the epoch); its augmentation is seeded by ``i``. The last partial batch of an epoch is
    dropped, so every batch has ``batch_size`` items.

    With ``repeats = m`` (repeated augmentation, Hoffer et al. 2020, https://arxiv.org/abs/1901.09335, as
    DeiT trains), a batch holds ``⌈batch_size / m⌉`` distinct images, each ``m`` times with its own
    augmentation: an epoch (one pass over the distinct images) then takes ``m`` times as many steps.

    With a ``teacher`` (DeiT's hard-label distillation), the targets are ``(labels, teacher labels)``: the
    teacher's class for each batch image exactly as the student sees it (augmented, mixed). The teacher is
    a fixed model in eval mode, so the batch stays a pure function of ``i``.

    Args:
        x: inputs ``(N, ...)``.
        y: labels ``(N,)``.
        batch_size: items per batch (at most N).
        seed: the data seed.
        augment: ``augment(batch, generator) -> batch``, e.g. an :class:`Augment`.
        mixup: mixup's Beta(α, α) parameter (0 = off).
        cutmix: cutmix's Beta(α, α) parameter (0 = off); with mixup as well, each batch uses one of the two,
            at even odds (DeiT's switch).
        num_classes: K, for the mixed labels (default: the largest label + 1).
        repeats: repeated augmentation's m (1 = off).
        teacher: ``teacher(images) -> class ids (B,)``.
    """

    def __init__(self, x: Tensor, y: Tensor, batch_size: int, *, seed: int = 0, augment=None, mixup: float = 0.0,
                 cutmix: float = 0.0, num_classes: int | None = None, repeats: int = 1,
                 teacher: Callable[[Tensor], Tensor] | None = None):
        if len(x) != len(y):
            raise DataError(f"{len(x)} inputs but {len(y)} labels")
        if not 1 <= batch_size <= len(x):
            raise DataError(f"batch_size must be in 1..{len(x)} (the training set size), got {batch_size}")
        if mixup < 0 or cutmix < 0:
            raise ConfigError(f"mixup and cutmix must be >= 0 (the Beta(α, α) parameter; 0 = off), got {mixup}, "
                              f"{cutmix}")
        if not 1 <= repeats <= batch_size:
            raise ConfigError(f"repeats must be in 1..batch_size={batch_size} (1 = no repeated augmentation), "
                              f"got {repeats}")
        self.x, self.y, self.batch_size, self.seed, self.augment = x, y, batch_size, seed, augment
        self.mixup, self.cutmix, self.repeats, self.teacher = mixup, cutmix, repeats, teacher
        self.num_classes = int(y.max()) + 1 if num_classes is None else num_classes
        self.distinct = -(-batch_size // repeats)  # distinct images per batch
        self.steps_per_epoch = len(x) // self.distinct
        self._epoch, self._perm = -1, None
        self.max_index = -1  # the furthest batch drawn so far (batches trained = max_index + 1)

    def _permutation(self, epoch: int) -> Tensor:
        if epoch != self._epoch:
            generator = torch.Generator().manual_seed((self.seed * 1_000_003 + epoch) % 2**63)
            self._epoch, self._perm = epoch, torch.randperm(len(self.x), generator=generator)
        return self._perm

    def batch(self, index: int) -> tuple[Tensor, Tensor]:
        if index < 0:
            raise ValueError(f"batch index must be >= 0, got {index}")
        self.max_index = max(self.max_index, index)
        epoch, pos = divmod(index, self.steps_per_epoch)
        idx = self._permutation(epoch)[pos * self.distinct:(pos + 1) * self.distinct]
        if self.repeats > 1:
            idx = idx.repeat_interleave(self.repeats)[:self.batch_size]  # (B,): each image m times in a row
        x, y = self.x[idx], self.y[idx]
        if self.augment is not None or self.mixup > 0 or self.cutmix > 0:
            generator = torch.Generator().manual_seed((self.seed * 999_983 + index + 7_777_777) % 2**63)
            if self.augment is not None:
                x = self.augment(x, generator)
            use_cutmix = self.cutmix > 0 and (self.mixup == 0 or bool(torch.rand(1, generator=generator) < 0.5))
            if use_cutmix:
                x, y = cutmix(x, y, self.num_classes, self.cutmix, generator)
            elif self.mixup > 0:
                x, y = mixup(x, y, self.num_classes, self.mixup, generator)
        if self.teacher is not None:
            with torch.no_grad():
                return x, (y, self.teacher(x))
        return x, y


def evaluate_classifier(model, x: Tensor, y: Tensor, *, batch_size: int = 500, flips: bool = False
                        ) -> dict[str, float]:
    """Accuracy and mean (unsmoothed) cross-entropy of ``model(x).logits`` over a labelled set, in batches.

    ``flips``: test-time augmentation by mirroring: each image's class probabilities are the mean of its own and
    its left–right mirror's, ``p(c | x) = (softmax f(x) + softmax f(flip x)) / 2``, and the loss is that mean's
    cross-entropy (for a model trained with flips, to which an image and its mirror are the same class)."""
    dev = next(model.parameters()).device
    correct, loss = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(x), batch_size):
            x_batch, y_batch = x[i:i + batch_size].to(dev), y[i:i + batch_size].to(dev)
            log_probs = torch.log_softmax(model(x_batch).logits.float(), -1)
            if flips:
                mirrored = torch.log_softmax(model(x_batch.flip(-1)).logits.float(), -1)
                log_probs = torch.logsumexp(torch.stack([log_probs, mirrored]), 0) - math.log(2.0)
            correct += int((log_probs.argmax(-1) == y_batch).sum())
            loss += float(torch.nn.functional.nll_loss(log_probs, y_batch, reduction="sum"))
    n = max(1, len(x))
    return {"test_accuracy": correct / n, "test_loss": loss / n}
