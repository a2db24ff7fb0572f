"""Explorers of runs whose tokens are patches: an image classifier (ViT), an audio classifier (AST, patches of its
spectrogram) and visual question answering (the question's words, then the picture's patches)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ...errors import DataError, RunError
from ..vit import grid_geometry
from .views import Exploration, Explorer, check_index, grid_tokens, grid_view, read_upload, text_tokens, top_k

if TYPE_CHECKING:
    from ...run import Run

__all__ = ["ImageExplorer", "AudioExplorer", "QuestionExplorer"]


def _prefix_names(config) -> list[str]:
    """The ViT's tokens before the patches: ``<cls>`` (class-token pooling), then ``<dist>`` (DeiT)."""
    return (["<cls>"] if config.pool == "cls" else []) + (["<dist>"] if config.distill else [])


class ImageExplorer(Explorer):
    """A ViT: a picture (or a 1-D signal) cut into patches; the output is the class probabilities."""

    accepts = ("image",)

    def __init__(self, run: Run):
        super().__init__(run)
        if run.family == "swin":
            raise RunError(f"{run.path} is a Swin run: its attention lives in shifted windows, which the explore "
                           "page does not draw; `tokennet viz` draws them")
        # An imported ViT has no data of its own: the page takes uploaded pictures only.
        self.held = run.data.held_out() if run.data is not None else None
        self.classes = list(self.held.classes) if self.held is not None else None

    def examples(self, limit: int) -> list[str]:
        labels = self.held.y_test[:limit].tolist() if self.held is not None else []
        return [f"test #{i}: {self.classes[int(y)]}" for i, y in enumerate(labels)]

    def example(self, index: int) -> Exploration:
        if self.held is None:
            raise DataError(f"{self.run.path.name} has no held-out pictures (an imported model): upload one")
        index = check_index(index, len(self.held.y_test))
        label = self.classes[int(self.held.y_test[index])]
        return self.explore(self.held.x_test[index], f"test #{index}: label {label}")

    def custom(self, fields: dict[str, Any]) -> Exploration:
        x = read_upload(fields, "image", lambda path: self.run.task.inputs_of(self.run, [path])[0])
        return self.explore(x, "your picture")

    def explore(self, x: torch.Tensor, title: str) -> Exploration:
        config = self.run.model.config
        expected = (config.in_channels, *config.image_hw) if not config.is_1d else (config.in_channels,
                                                                                    config.image_hw[1])
        if tuple(x.shape) != tuple(expected):
            raise DataError(f"the model takes inputs of shape {expected} (channels, height, width), got "
                            f"{tuple(x.shape)}; resize it first")
        geom = grid_geometry(config, (1, x.shape[-1]) if config.is_1d else tuple(x.shape[-2:]))
        picture = x[:, None, :].expand(-1, 8, -1) if config.is_1d else x  # a 1-D signal drawn as a band
        inputs = x[None].to(self.run.device)

        def predict() -> dict[str, Any]:
            with torch.no_grad():
                probs = self.run.model(inputs).logits.float().softmax(-1)[0].cpu()
            top = top_k(probs, self.classes)
            return {"text": f"{top[0][0]} ({top[0][1]:.2f})", "top": top}

        return Exploration(inputs, grid_tokens(_prefix_names(config), geom),
                           {"picture": grid_view(picture, geom, caption="the picture cut into patches")},
                           title, predict)


class AudioExplorer(Explorer):
    """An AST: a clip's log-mel spectrogram cut into patches (mel bin 0 at the top, time left to right)."""

    accepts = ("audio",)

    def __init__(self, run: Run):
        super().__init__(run)
        if run.data is None:
            raise RunError(f"{run.path} has no data spec (run.json): the page needs its held-out clips")
        self.held = run.data.held_out()
        self.names = run.task.label_names(run) or [str(i) for i in range(run.model.config.num_classes)]

    def examples(self, limit: int) -> list[str]:
        voices = self.held.test_voices or [""] * len(self.held.y_test)
        return [f"test #{i}: {self.held.labels[int(y)]}" + (f" ({voices[i]})" if voices[i] else "")
                for i, y in enumerate(self.held.y_test[:limit].tolist())]

    def example(self, index: int) -> Exploration:
        index = check_index(index, len(self.held.y_test))
        label = self.held.labels[int(self.held.y_test[index])]
        return self.explore(self.held.x_test[index], f"test #{index}: label {label}")

    def custom(self, fields: dict[str, Any]) -> Exploration:
        wave = read_upload(fields, "audio", lambda path: self.run.task.inputs_of(self.run, [path])[0])
        return self.explore(wave, "your clip")

    def explore(self, wave: torch.Tensor, title: str) -> Exploration:
        model, config = self.run.model, self.run.model.config
        with torch.no_grad():
            spectrogram = model.spectrogram_image(wave[None].to(self.run.device))[:, None]  # (1, 1, mels, frames)
        geom = grid_geometry(config)
        prefix = ["<cls>"] * config.num_prefix

        def predict() -> dict[str, Any]:
            with torch.no_grad():
                probs = model(spectrogram).logits.float().softmax(-1)[0].cpu()
            top = top_k(probs, self.names)
            return {"text": f"{top[0][0]} ({top[0][1]:.2f})", "top": top}

        view = grid_view(spectrogram[0].cpu(), geom, caption=f"log-mel spectrogram ({config.n_mels} mels × "
                                                             f"{config.num_frames} frames) cut into patches")
        return Exploration(spectrogram, grid_tokens(prefix, geom, "spectrogram"), {"spectrogram": view}, title,
                           predict)


class QuestionExplorer(Explorer):
    """Visual question answering: the summary token, the question's word slots, then the picture's patches; the
    output is the answer's probabilities."""

    accepts = ("image", "question")

    def __init__(self, run: Run):
        super().__init__(run)
        if run.family == "vqa-cnn":
            raise RunError(f"{run.path} is a CNN baseline: it has no attention to explore (`tokennet viz` draws "
                           "each unit's vote for the answer instead)")
        if run.data is None or not getattr(run.data, "words", None):
            raise RunError(f"{run.path} has no question vocabulary (no data spec in run.json): the page needs the "
                           "questions it was trained on")
        self.spec = run.data
        self.held = self.spec.held_out()  # the test scenes, rendered (most of the page's start for a vqa run)

    def examples(self, limit: int) -> list[str]:
        return [f"#{i}: {self.held.questions[i]} → {self.spec.answers[int(self.held.answers[i])]}"
                for i in range(min(limit, len(self.held)))]

    def example(self, index: int, question: str | None = None) -> Exploration:
        index = check_index(index, len(self.held))
        expected = self.spec.answers[int(self.held.answers[index])]
        asked = question or self.held.questions[index]
        title = f"#{index}: {asked}" + ("" if question else f" (expected {expected})")
        return self.explore(self.held.images[index], asked, title)

    def custom(self, fields: dict[str, Any]) -> Exploration:
        question = fields.get("question")
        if not isinstance(question, str) or not question.strip():
            raise DataError("type a question about the picture")
        if "upload" not in fields:
            return self.example(fields.get("example", 0), question)
        image = read_upload(fields, "image", lambda path: self.run.task.images(self.run, [path])[0])
        return self.explore(image, question, f"your picture: {question}")

    def explore(self, image: torch.Tensor, question: str, title: str) -> Exploration:
        from ...data.vqa import encode_questions

        config = self.run.model.config
        ids = encode_questions([question], self.spec.words, config.max_question_len)  # (1, T)
        inputs = (image[None].to(self.run.device), ids.to(self.run.device))
        side = config.image_size
        geom = {"grid": config.grid, "patch": (config.patch_size,) * 2, "stride": (config.patch_size,) * 2,
                "offset": (0, 0), "image_hw": (side, side)}
        words = [self.spec.words[int(i)] if int(i) < len(self.spec.words) else str(int(i)) for i in ids[0]]
        head = ["<summary>"] + (["<sink>"] if config.num_text - config.max_question_len > 1 else [])
        tokens = [{"label": name, "view": None, "cell": None} for name in head]
        tokens += text_tokens(words, "question")
        tokens += grid_tokens([], geom)

        def predict() -> dict[str, Any]:
            with torch.no_grad():
                probs = self.run.model(inputs).logits.float().softmax(-1)[0].cpu()
            top = top_k(probs, list(self.spec.answers))
            return {"text": f"{top[0][0]} ({top[0][1]:.2f})", "top": top}

        views = {"question": {"kind": "text", "caption": "the question's word slots"},
                 "picture": grid_view(image, geom, caption="the picture cut into patches")}
        return Exploration(inputs, tokens, views, title, predict)
