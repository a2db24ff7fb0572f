"""The sphere task: a signal on the sphere (or an image, projected onto it) in, a class out."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..data.image_files import read_image
from ..errors import DataError, RunError
from ..viz.explore.sphere import SphereExplorer
from .base import as_paths, register_task
from .classification import ImageClassification
from .example_files import Example, class_label, varied

if TYPE_CHECKING:
    from ..run import Run

__all__ = ["SphereClassification"]


@register_task
class SphereClassification(ImageClassification):
    """A sphere transformer: ``run.classify(x)`` → ``(class index, probability)`` per input, where ``x`` is
    a signal ``(B, C, M)`` on the model's sample grid (``run.model.samples``), images ``(B, C, H, W)``
    (projected onto the northern hemisphere, unrotated, as the run's data projects them), or image files."""

    name = "sphere classification"
    kind = "sphere"
    families = ("sphere",)
    viz_uses = ("index", "patch", "layer", "head")
    explorer = SphereExplorer

    def draw(self, run: Run, out_dir: Path, **options) -> list[Path]:
        """``patch_attention.png``: one patch's attention over the sphere, per layer, for a test image."""
        from ..viz.sphere import sphere_viz

        return sphere_viz(run, out_dir, **options)

    def panel(self, run: Run, log) -> list[tuple[str, str]]:
        from ..viz.report.spheres import sphere_panel

        return sphere_panel(run, log)

    def examples(self, run: Run, directory: Path, count: int = 1) -> list[Example]:
        """``image-K.png`` per held-out test image (flat: ``generate`` projects it as the run's data did)."""
        _, _, (x, y) = run.data.split()
        return [self._write_input(run, x[item], Path(directory), k, class_label(int(y[item]), None))
                for k, item in enumerate(varied(y, count, run.path))]

    def inputs_of(self, run: Run, inputs) -> torch.Tensor:
        config = run.model.config
        if not torch.is_tensor(inputs):
            paths = as_paths(inputs)
            if not paths:
                raise DataError("no image given")
            images = [read_image(path, channels=config.in_channels) for path in paths]
            if len({tuple(x.shape) for x in images}) > 1:
                raise DataError("the images have different sizes; classify them one size at a time")
            inputs = torch.stack(images)
        if inputs.dim() == 4:  # images: project them as the run's data does
            if not torch.isfinite(inputs).all():
                raise DataError("the images have NaN or infinite values")
            if run.data is None:
                raise RunError(f"{run.path} has no run.json to say how its images were projected; pass signals "
                               "(B, C, M) on the model's sample grid")
            inputs = run.data.project(inputs, run.model.samples.cpu())
        return inputs
