"""The sphere task: a signal on the sphere (or an image, projected onto it) in, a class out."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..data.image_files import read_image
from ..data.sphere import project_images
from ..errors import DataError
from . import as_paths
from .classification import ImageClassification

if TYPE_CHECKING:
    from ..run import Run

__all__ = ["SphereClassification"]


class SphereClassification(ImageClassification):
    """A sphere transformer: ``run.classify(x)`` → ``(class index, probability)`` per input, where ``x`` is
    a signal ``(B, C, M)`` on the model's sample grid (``run.model.samples``), images ``(B, C, H, W)``
    (projected onto the northern hemisphere, unrotated, as in training), or image files."""

    name = "sphere classification"
    kind = "sphere"

    def inputs(self, run: Run, inputs) -> torch.Tensor:
        c = run.model.config
        if not torch.is_tensor(inputs):
            paths = as_paths(inputs)
            if not paths:
                raise DataError("no image given")
            images = [read_image(p, channels=c.in_channels) for p in paths]
            if len({tuple(x.shape) for x in images}) > 1:
                raise DataError("the images have different sizes; classify them one size at a time")
            inputs = torch.stack(images)
        if inputs.dim() == 4:  # images: project them as the recipe does
            if not torch.isfinite(inputs).all():
                raise DataError("the images have NaN or infinite values")
            extent = float(run.settings.get("extent", 1.0)) if run.settings else 1.0
            inputs = project_images(inputs, run.model.samples.cpu(), None, extent)
        return inputs
