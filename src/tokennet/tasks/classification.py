"""The classification task: an image (or 1-D signal) in, a class and its probability out."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..data.image_files import read_image, write_image
from ..errors import DataError
from ..viz.explore.pictures import ImageExplorer
from . import Classifier
from .base import HELP, Input, Task, as_paths, image_file_bad_inputs, register_task, verb
from .example_files import Example, class_label, varied

if TYPE_CHECKING:
    from ..run import Run

__all__ = ["ImageClassification"]


def read_signal(path: str | Path, channels: int, length: int) -> torch.Tensor:
    """A 1-D signal from a ``.npy`` file: ``(L,)`` or ``(C, L)`` floats, of the model's length and channels."""
    file = Path(path)
    if not file.is_file():
        raise DataError(f"signal file {file} does not exist")
    if file.suffix.lower() != ".npy":
        raise DataError(f"{file}: a 1-D model reads signals from .npy files (an array (L,) or (C, L))")
    try:
        signal = np.load(file, allow_pickle=False)
    except (ValueError, OSError) as err:
        raise DataError(f"{file} is not a readable .npy array ({err})") from None
    signal = signal[None] if signal.ndim == 1 else signal
    if signal.ndim != 2 or signal.dtype.kind not in "fiu" or tuple(signal.shape) != (channels, length):
        raise DataError(f"{file}: the model takes signals of shape ({channels}, {length}), got {tuple(signal.shape)}")
    if not np.isfinite(signal).all():
        raise DataError(f"{file}: the signal has NaN or infinite values")
    return torch.from_numpy(signal.astype(np.float32))


@register_task
class ImageClassification(Task):
    """A ViT or Swin: ``run.classify(images or paths)`` → ``(class index, probability)`` per input."""

    name = "image classification"
    columns = ("file", "class", "probability")  # respond: one line per --image
    kind = "image-classifier"
    families = ("vit", "swin")
    viz_uses = ("index", "patch", "layer", "head", "data", "image")
    protocol = Classifier
    inputs = (Input("image", HELP["image"]),)
    explorer = ImageExplorer

    def respond(self, run: Run, values: dict[str, Any]) -> Iterator[str]:
        """``PATH<TAB>class index<TAB>probability`` per ``--image``."""
        paths = values["image"]
        for path, (label, prob) in zip(paths, self.classify(run, paths), strict=True):
            yield f"{path}\t{label}\t{prob:.4f}\n"

    def draw(self, run: Run, out_dir: Path, **options) -> list[Path]:
        """ViT: patch attention per layer and head, the <cls> rollout, the position similarity of a test image (and
        a DeiT's distillation token beside its class token). Swin: its windows on the image and, per block,
        where one token looks."""
        if run.model.config.family == "swin":
            from ..viz.swin import swin_viz

            return swin_viz(run, out_dir, **options)
        from ..viz.vit import vit_viz

        return vit_viz(run, out_dir, **options)

    def panel(self, run: Run, log) -> list[tuple[str, str]]:
        from ..viz.report.classification import classifier_panel

        return classifier_panel(run, log)

    def examples(self, run: Run, directory: Path, count: int = 1) -> list[Example]:
        """``image-K.png`` per held-out image (``signal-K.npy`` for a 1-D model), labelled with its class; the
        classes in turn (:func:`~tokennet.tasks.example_files.varied`)."""
        data = run.data.held_out()
        return [self._write_input(run, data.x_test[item], Path(directory), k,
                                  class_label(int(data.y_test[item]), data.classes))
                for k, item in enumerate(varied(data.y_test, count, run.path))]

    def _write_input(self, run: Run, x: torch.Tensor, directory: Path, k: int, label: str) -> Example:
        if getattr(run.model.config, "is_1d", False):  # (C, L): a signal file
            path = directory / f"signal-{k}.npy"
            np.save(path, x.numpy())
        else:
            path = write_image(x, directory / f"image-{k}.png")
        return Example({"image": [str(path)]}, label, (path,))

    def bad_inputs(self, run: Run, directory: Path) -> list[tuple[dict[str, Any], str]]:
        return image_file_bad_inputs(directory)

    def inputs_of(self, run: Run, inputs) -> torch.Tensor:
        """A tensor batch as given, or files: images read with the model's channels, or ``.npy`` signals for a
        1-D model."""
        if torch.is_tensor(inputs):
            return inputs
        config = run.model.config
        paths = as_paths(inputs)
        if not paths:
            raise DataError("no image given")
        if config.is_1d:
            return torch.stack([read_signal(path, config.in_channels, config.image_hw[1]) for path in paths])
        images = [read_image(path, channels=config.in_channels) for path in paths]
        shapes = {tuple(x.shape) for x in images}
        if len(shapes) > 1:
            raise DataError(f"the images have different sizes {sorted(shapes)}; classify them one size at a time")
        return torch.stack(images)

    @verb
    @torch.no_grad()
    def classify(self, run: Run, inputs) -> list[tuple[int, float]]:
        """``(class index, probability)`` of each input: a tensor batch, or files (see :meth:`inputs_of`)."""
        x = self.inputs_of(run, inputs).to(run.device)
        probs = run.model(x).logits.float().softmax(-1)  # (B, K)
        prob, idx = probs.max(-1)
        return [(int(i), float(top_prob)) for i, top_prob in zip(idx, prob, strict=True)]
