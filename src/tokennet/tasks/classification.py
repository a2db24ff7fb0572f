"""The classification task: an image (or 1-D signal) in, a class and its probability out."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..data.image_files import read_image
from ..errors import DataError
from . import Classifier, Task, as_paths

if TYPE_CHECKING:
    from ..run import Run

__all__ = ["ImageClassification"]


class ImageClassification(Task):
    """A ViT: ``run.classify(images or paths)`` → ``(class index, probability)`` per input."""

    name = "image classification"
    kind = "image-classifier"
    verbs = ("classify",)
    protocol = Classifier

    def inputs(self, run: Run, inputs) -> torch.Tensor:
        """A tensor batch as given, or image files read with the model's channels (2-D models only)."""
        if torch.is_tensor(inputs):
            return inputs
        c = run.model.config
        if c.is_1d:
            raise DataError("this model classifies 1-D signals: pass a (B, C, L) tensor, not image files")
        paths = as_paths(inputs)
        if not paths:
            raise DataError("no image given")
        images = [read_image(p, channels=c.in_channels) for p in paths]
        shapes = {tuple(x.shape) for x in images}
        if len(shapes) > 1:
            raise DataError(f"the images have different sizes {sorted(shapes)}; classify them one size at a time")
        return torch.stack(images)

    @torch.no_grad()
    def classify(self, run: Run, inputs) -> list[tuple[int, float]]:
        x = self.inputs(run, inputs).to(run.device)
        p = run.model(x).logits.float().softmax(-1)  # (B, K)
        prob, idx = p.max(-1)
        return [(int(i), float(q)) for i, q in zip(idx, prob, strict=True)]
