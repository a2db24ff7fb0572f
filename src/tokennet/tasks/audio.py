"""The audio classification task: an audio file (or waveform) in, a class and its probability out."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..errors import DataError
from ..tokens.audio import load_audio
from . import as_paths
from .classification import ImageClassification

if TYPE_CHECKING:
    from ..run import Run

__all__ = ["AudioClassification"]


class AudioClassification(ImageClassification):
    """An AST: ``run.classify(wav paths or waveforms (B, samples))`` → ``(class index, probability)`` per clip.

    Files are read as mono and resampled to the model's rate; a clip longer than the model's maximum
    (``clip_samples``) is an error, not cropped; shorter clips are zero-padded at the end. ``classify`` is
    the image task's (softmax over the logits of :meth:`inputs`); only reading the inputs differs.
    """

    name = "audio classification"
    kind = "audio-classifier"

    def label_names(self, run: Run) -> list[str] | None:
        """The class names the run was trained with (``class_names`` in its settings), if any."""
        names = (run.settings or {}).get("class_names")
        return names.split(",") if names else None

    def inputs(self, run: Run, inputs) -> torch.Tensor:
        """A waveform batch ``(B, samples)`` as given, or audio files read at the model's sample rate."""
        if torch.is_tensor(inputs):
            return inputs
        c = run.model.config
        paths = as_paths(inputs)
        if not paths:
            raise DataError("no audio file given")
        clips = [torch.from_numpy(load_audio(p, c.sample_rate, max_samples=c.clip_samples)) for p in paths]
        out = torch.zeros(len(clips), c.clip_samples)
        for i, x in enumerate(clips):
            out[i, :len(x)] = x
        return out
