"""The audio classification task: an audio file (or waveform) in, a class and its probability out."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..errors import DataError
from ..tokens.audio import load_audio
from .base import HELP, Input, as_paths, register_task
from .classification import ImageClassification

if TYPE_CHECKING:
    from ..run import Run

__all__ = ["AudioClassification"]


@register_task
class AudioClassification(ImageClassification):
    """An AST: ``run.classify(wav paths or waveforms (B, samples))`` → ``(class index, probability)`` per clip.

    Files are read as mono and resampled to the model's rate; a clip longer than the model's maximum
    (``clip_samples``) is an error, not cropped; shorter clips are zero-padded at the end. ``classify`` is
    the image task's (softmax over the logits of :meth:`inputs_of`); only reading the inputs differs.
    """

    name = "audio classification"
    kind = "audio-classifier"
    families = ("ast",)
    inputs = (Input("audio", HELP["audio"]),)

    def label_names(self, run: Run) -> list[str] | None:
        """The class names the run was trained with (its data's ``labels``), if any."""
        labels = getattr(run.data, "labels", None)
        return list(labels) if labels else None

    def respond(self, run: Run, values: dict[str, Any]) -> Iterator[str]:
        """``FILE<TAB>class index<TAB>class name<TAB>probability`` per ``--audio`` file."""
        names = self.label_names(run)
        paths = values["audio"]
        for path, (label, prob) in zip(paths, self.classify(run, paths), strict=True):
            yield f"{path}\t{label}\t{names[label] if names else label}\t{prob:.4f}\n"

    def draw(self, run: Run, out_dir: Path, **options) -> list[Path]:
        """``rollout.png``: a clip's spectrogram with the pooled query's attention rollout over its patches."""
        from ..viz.audio import audio_viz

        return audio_viz(run, out_dir, **options)

    def panel(self, run: Run, log) -> list[tuple[str, str]]:
        from ..viz.report.classification import audio_test_set, classifier_panel

        return classifier_panel(run, log, test_set=audio_test_set)

    def examples(self, run: Run, directory: Path) -> dict[str, Any]:
        from scipy.io import wavfile

        c = run.model.config
        wave = run.data.held_out().x_test[0].numpy()
        path = Path(directory) / "held_out_0.wav"
        wavfile.write(path, c.sample_rate, wave)
        return {"audio": [str(path)]}

    def bad_inputs(self, run: Run, directory: Path) -> list[tuple[dict[str, Any], str]]:
        d = Path(directory)
        (d / "empty.wav").write_bytes(b"")
        (d / "notaudio.wav").write_text("this is text, not audio\n" * 20)
        return [({"audio": [str(d / "missing.wav")]}, "does not exist"), ({"audio": [str(d / "empty.wav")]}, "empty"),
                ({"audio": [str(d / "notaudio.wav")]}, "notaudio.wav")]

    def inputs_of(self, run: Run, inputs) -> torch.Tensor:
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
