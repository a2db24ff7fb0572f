"""The audio classification task: an audio file (or waveform) in, a class and its probability out."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..errors import DataError
from ..tokens.clips import classify_clip, load_clip
from ..viz.explore.pictures import AudioExplorer
from .base import HELP, Input, as_paths, register_task
from .classification import ImageClassification
from .example_files import Example, class_label, varied

if TYPE_CHECKING:
    from ..run import Run

__all__ = ["AudioClassification"]

log = logging.getLogger(__name__)


@register_task
class AudioClassification(ImageClassification):
    """An AST: ``run.classify(wav paths or waveforms (B, samples))`` → ``(class index, probability)`` per clip.

    Files of any length are read as :mod:`tokennet.tokens.clips` says: mono, resampled to the model's rate,
    leading and trailing silence trimmed (40 dB below the loudest 10-ms frame), then one window of
    ``clip_samples`` (zero-padded) or, for a longer clip, overlapping windows whose log-probabilities are
    combined (the most confident window's); a clip of silence only is a one-line error, and one longer than
    10 minutes is read up to there with a note. Waveform tensors ``(B, samples)`` are the model's inputs as
    given.
    """

    name = "audio classification"
    columns = ("file", "class", "name", "probability")  # respond: one line per --audio file
    kind = "audio-classifier"
    families = ("ast",)
    viz_uses = ("index", "data", "audio")
    inputs = (Input("audio", HELP["audio"]),)
    explorer = AudioExplorer

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
        from ..viz.report.html import esc, number, table

        out = classifier_panel(run, log, test_set=audio_test_set)
        m = run.metrics
        names = [k.removeprefix("test_accuracy_") for k in m if k.startswith("test_accuracy_")]
        base = any(f"baseline_accuracy_{n}" in m for n in names)
        rows = [[esc(n.replace("_", " ")), number(m[f"test_accuracy_{n}"], f"test_accuracy_{n}")]
                + ([number(m[f"baseline_accuracy_{n}"], f"baseline_accuracy_{n}")
                    if f"baseline_accuracy_{n}" in m else ""] if base else []) for n in names]
        if rows:
            out.insert(1, ("Speech it never trained on (test accuracy)",
                           '<p class="sub">other synth: Flite and Festival voices; clean: the held-out voices '
                           "without noise; NOISE SNR: the same clips with that noise at that SNR of the active "
                           "speech.</p>" + table(["set", "test accuracy", *(["MFCC + SVM"] if base else [])], rows,
                                                 num_cols=(1, 2) if base else (1,))))
        return out

    def examples(self, run: Run, directory: Path, count: int = 1) -> list[Example]:
        """``clip-K.wav`` per held-out clip (float samples at the model's rate), labelled with its class; the classes
        in turn."""
        from scipy.io import wavfile

        data = run.data.held_out()
        out = []
        for k, item in enumerate(varied(data.y_test, count, run.path)):
            path = Path(directory) / f"clip-{k}.wav"
            wavfile.write(path, run.model.config.sample_rate, data.x_test[item].numpy())
            out.append(Example({"audio": [str(path)]}, class_label(int(data.y_test[item]), data.labels), (path,)))
        return out

    def bad_inputs(self, run: Run, directory: Path) -> list[tuple[dict[str, Any], str]]:
        root = Path(directory)
        (root / "empty.wav").write_bytes(b"")
        (root / "notaudio.wav").write_text("this is text, not audio\n" * 20)
        return [({"audio": [str(root / "missing.wav")]}, "does not exist"),
                ({"audio": [str(root / "empty.wav")]}, "empty"),
                ({"audio": [str(root / "notaudio.wav")]}, "notaudio.wav")]

    def classify(self, run: Run, inputs) -> list[tuple[int, float]]:
        """``(class index, probability)`` per clip: a waveform batch as the model's inputs, or files of any
        length (trimmed, windowed, the windows combined; see the class docstring)."""
        if torch.is_tensor(inputs):
            return super().classify(run, inputs)
        out = []
        for clip in self.clips_of(run, inputs):
            log_probs, _ = classify_clip(run.model, torch.from_numpy(clip.windows))
            k = int(log_probs.argmax())
            out.append((k, float(log_probs[k].exp())))
        return out

    def clips_of(self, run: Run, inputs) -> list:
        """Audio files read as :class:`~tokennet.tokens.clips.ClipWindows` at the model's rate and window
        (every file is checked before any is classified; notes, such as the 10-minute cap, go to the log)."""
        config = run.model.config
        paths = as_paths(inputs)
        if not paths:
            raise DataError("no audio file given")
        clips = [load_clip(path, config.sample_rate, config.clip_samples) for path in paths]
        for clip in clips:
            for note in clip.notes:
                log.warning("%s", note)
        return clips

    def inputs_of(self, run: Run, inputs) -> torch.Tensor:
        """A waveform batch ``(B, samples)`` as given, or audio files as one window each (a longer clip's
        most energetic window, :func:`~tokennet.tokens.clips.fit_window`), zero-padded to ``clip_samples``."""
        if torch.is_tensor(inputs):
            return inputs
        from ..tokens.clips import load_fitted

        config = run.model.config
        paths = as_paths(inputs)
        if not paths:
            raise DataError("no audio file given")
        out = torch.zeros(len(paths), config.clip_samples)
        for i, path in enumerate(paths):
            x = torch.from_numpy(load_fitted(path, config.sample_rate, config.clip_samples))
            out[i, :len(x)] = x
        return out
