"""The captioning task: images in, a sentence out (encoder–decoder or decoder-only captioner)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..data.image_files import read_images
from ..decode import beam_search, greedy_search, strip_special
from ..errors import DataError
from ..viz.explore.sequences import CaptionExplorer
from . import ConditionalDecoder
from .base import HELP, OPTIONS, Input, Task, as_paths, image_file_bad_inputs, register_task, verb
from .example_files import Example, take

if TYPE_CHECKING:
    from ..run import Run

__all__ = ["Captioning", "caption_images", "load_caption_images"]


@torch.no_grad()
def caption_images(model, tok, images: torch.Tensor, *, beam_size: int = 1, batch_size: int = 256) -> list[str]:
    """Generate a caption for each image ``(B, 3, H, W)`` (greedy, or beam search when beam_size > 1)."""
    dev = next(model.parameters()).device
    out: list[str] = []
    for i in range(0, len(images), batch_size):
        x = images[i : i + batch_size].to(dev)
        ids = greedy_search(model, x) if beam_size == 1 else beam_search(model, x, beam_size=beam_size)
        out.extend(tok.decode(seq) for seq in strip_special(ids, model.config.eos_id, model.config.pad_id))
    return out


def load_caption_images(paths, image_size: int, in_channels: int = 3) -> torch.Tensor:
    """Read image files for a captioning model: ``(B, C, H, W)`` in [0, 1].

    Grey images are repeated to 3 channels, an alpha channel is dropped (see
    :func:`~tokennet.data.image_files.read_image`); the size must be the model's ``image_size`` —
    nothing is resized, a different size is a ``DataError`` that says what is expected.
    """
    return read_images(paths, image_size, in_channels)


@register_task
class Captioning(Task):
    """A captioner: ``run.caption(images or paths, beam_size=None)`` → one caption per image."""

    name = "captioning"
    kind = "captioning"
    families = ("captioner", "captioner-prefix")
    viz_uses = ("index", "layer", "head", "image")
    explorer = CaptionExplorer
    protocol = ConditionalDecoder
    inputs = (Input("image", HELP["image"]),)
    options = (OPTIONS["beam_size"],)

    def respond(self, run: Run, values: dict[str, Any]) -> Iterator[str]:
        """One caption per ``--image`` (``PATH<TAB>caption`` when there are several)."""
        paths = values["image"]
        for path, cap in zip(paths, self.caption(run, paths, beam_size=values["beam_size"]), strict=True):
            yield (cap if len(paths) == 1 else f"{path}\t{cap}") + "\n"

    def draw(self, run: Run, out_dir: Path, **options) -> list[Path]:
        """``caption_attention.png``: each generated word's attention over a held-out image (or ``--image``)."""
        from ..viz.alignment import caption_viz

        return caption_viz(run, out_dir, **options)

    def panel(self, run: Run, log) -> list[tuple[str, str]]:
        from ..viz.report.sequences import captioning_panel

        return captioning_panel(run, log)

    def examples(self, run: Run, directory: Path, count: int = 1) -> list[Example]:
        """``image-K.png`` per held-out scene, labelled with its caption."""
        from ..data.image_files import write_image
        from ..data.shapes import caption, images_of

        scenes = run.data.held_out()
        scenes = [scenes[k] for k in take(count, len(scenes), run.path)]
        out = []
        for k, (scene, image) in enumerate(zip(scenes, images_of(scenes, run.model.config.image_size), strict=True)):
            path = write_image(image, Path(directory) / f"image-{k}.png")
            out.append(Example({"image": [str(path)]}, caption(scene), (path,)))
        return out

    def bad_inputs(self, run: Run, directory: Path) -> list[tuple[dict[str, Any], str]]:
        import numpy as np

        wrong = Path(directory) / "wrong_size.npy"
        np.save(wrong, np.zeros((3, 7, 7), np.float32))
        return [*image_file_bad_inputs(directory), ({"image": [str(wrong)]}, "resize it first")]

    def images(self, run: Run, images) -> torch.Tensor:
        """A ``(B, C, H, W)`` tensor as given, or image files read at the model's size."""
        if torch.is_tensor(images):
            return images
        paths = as_paths(images)
        config = run.model.config
        return load_caption_images(paths, config.image_size, config.in_channels)

    @verb
    def caption(self, run: Run, images, *, beam_size: int | None = None) -> list[str]:
        k = beam_size if beam_size is not None else run.settings.get("beam_size", 1)
        if k < 1:
            raise DataError(f"beam_size must be >= 1, got {k}")
        return caption_images(run.model, run.tokenizer, self.images(run, images), beam_size=k)
