"""Pictures of an audio classifier (AST): the log-mel spectrogram with the <cls> (or mean-pooled) token's
attention rollout over its patches — which time–frequency regions decided."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import DataError, RunError
from .attention_maps import attention_rollout, plot_rollout
from .vit import grid_geometry

__all__ = ["audio_viz"]


def audio_viz(run, out_dir: Path, *, index: int | None = None, data: str | None = None,
              audio: str | Path | None = None, **_) -> list[Path]:
    """Write ``rollout.png``: the clip's spectrogram (mel bin 0 at the top, time left to right), the pooled
    query's last-layer attention and its attention rollout (Abnar & Zuidema 2020) over the patches.

    Args:
        run: a loaded :class:`~tokennet.run.Run` of an AST.
        out_dir: where the PNG goes.
        index: the test clip to draw (default 0), when no ``audio`` file is given.
        data: the data of the test clip (default: the run's).
        audio: draw this audio file instead, read as ``tokennet generate`` reads it (resampled to the model's
            rate, silence trimmed; of a longer clip, the window that decided the answer is drawn).
    """
    model = run.model
    config = model.config
    dev = next(model.parameters()).device
    names = run.task.label_names(run) or [str(i) for i in range(config.num_classes)]
    if audio is not None:
        from ..tokens.clips import classify_clip, load_clip

        clip = load_clip(audio, config.sample_rate, config.clip_samples)
        _, window = classify_clip(model, torch.from_numpy(clip.windows))
        wave = torch.from_numpy(clip.windows[window])
        label, source = "?", Path(audio).name
        if len(clip) > 1:
            source += f" ({clip.seconds:.2f} s trimmed; window {window + 1} of {len(clip)}, from "
            source += f"{clip.starts[window] / config.sample_rate:.2f} s)"
    else:
        if run.data is None:
            raise RunError(f"{run.path} has no run.json to say which data it was trained on; pass --audio FILE")
        dataset = (run.data if data is None else run.data.replace(source=data)).held_out()
        index = 0 if index is None else index
        if not 0 <= index < len(dataset.y_test):
            raise DataError(f"index {index} out of range: 0..{len(dataset.y_test) - 1}")
        wave, label = dataset.x_test[index], dataset.labels[int(dataset.y_test[index])]
        voice = f", voice {dataset.test_voices[index]}" if dataset.test_voices else ""
        source = f"test #{index}{voice}"
    with torch.no_grad():
        spec = model.spectrogram_image(wave[None].to(dev))[:, None]  # (1, 1, mels, frames)
        prob = model(spec).logits.float().softmax(-1)[0]
        maps = [att[0].float().cpu() for att in model.attention_maps(spec)["self"]]  # per layer (H, P + N, P + N)
    P = config.num_prefix
    roll = attention_rollout([m[None] for m in maps])[0]  # (P + N, P + N)
    if P:
        query, last, rel = "<cls>", maps[-1][:, 0, P:].mean(0), roll[0, P:]
    else:  # mean pooling: the output is the mean of the patch tokens, so average their rows
        query, last, rel = "mean-pooled output", maps[-1].mean((0, 1)), roll.mean(0)
    geom = grid_geometry(config)
    k = int(prob.argmax())
    what = f"{source}: label {label}, predicted {names[k]} ({float(prob[k]):.2f})"
    return [plot_rollout(spec[0].cpu(), last, rel, geom, out_dir / "rollout.png", query=query,
                         title=f"log-mel spectrogram ({config.n_mels} mels × {config.num_frames} frames), attention "
                               f"rollout — {what}")]

