"""Explorers of encoder–decoder runs, whose attention has three kinds: the encoder's self-attention over the source
(a sentence, or a picture's patches), the decoder's causal self-attention over what it wrote, and the
cross-attention from each written token to the source — the alignments of Bahdanau et al. 2015 (Fig. 3) and Show,
Attend and Tell's word-by-word attention over the picture (Xu et al. 2015, Fig. 2).

The source's tokens come first, then the decoder's (``<bos>`` and the greedy output): ``"cross"`` rows are the
decoder's tokens and its columns the source's (``Exploration.offsets``). A decoder-only captioner has one
self-attention over ``[patches; caption]`` under the prefix mask: the same tokens, one kind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ...data.shapes import caption, images_of
from ...decode import greedy_search, strip_special
from ...errors import DataError, RunError
from .text import typed_text
from .views import Exploration, Explorer, check_index, grid_tokens, grid_view, read_upload, text_tokens, top_k

if TYPE_CHECKING:
    from ...run import Run

__all__ = ["TranslationExplorer", "CaptionExplorer"]


class _DecoderExplorer(Explorer):
    """What both share: greedy decoding, the decoder's tokens, and their offsets among the source's."""

    def __init__(self, run: Run):
        super().__init__(run)
        if run.tokenizer is None:
            raise RunError(f"{run.path} has no tokenizer.json: the page needs one to show what the model writes")
        self.tok = run.tokenizer

    def piece(self, token_id: int) -> str:
        return self.tok.decode([int(token_id)])

    def decoded(self, source: torch.Tensor) -> list[int]:
        """The greedy output for a source batch of one, without ``<bos>``, ``<eos>`` and padding."""
        config = self.run.model.config
        with torch.no_grad():
            return strip_special(greedy_search(self.run.model, source), config.eos_id, config.pad_id)[0]

    def sequence(self, source: torch.Tensor, source_tokens: list[dict[str, Any]], views: dict, title: str,
                 *, one_stack: bool = False) -> Exploration:
        """The exploration of ``source`` (a batch of one) and its greedy output, the decoder reading ``<bos> y``."""
        config = self.run.model.config
        out_ids = self.decoded(source)
        tgt_in = torch.tensor([[config.bos_id, *out_ids]], device=self.run.device)  # (1, T)
        S = len(source_tokens)
        written = [{"label": "<bos>", "view": "output", "cell": 0}]
        written += [{**token, "cell": k + 1} for k, token in enumerate(text_tokens([self.piece(i) for i in out_ids],
                                                                                 "output"))]

        def predict() -> dict[str, Any]:
            ids = self.decoded(source)
            with torch.no_grad():
                probs = self.run.model((source, tgt_in)).logits[0, 0].float().softmax(-1).cpu()
            return {"text": self.tok.decode(ids) or "(nothing)", "top": top_k(probs, None, label=self.piece)}

        def per_token() -> list:
            with torch.no_grad():
                probs = self.run.model((source, tgt_in)).logits[0].float().softmax(-1).cpu()  # (T, V)
            return [None] * S + [top_k(row, None, label=self.piece) for row in probs]

        views = {**views, "output": {"kind": "text", "caption": "what the decoder reads: <bos>, then its greedy "
                                                                 "output (each token predicts the next)"}}
        offsets = {} if one_stack else {"decoder": (S, S), "cross": (S, 0)}
        return Exploration((source, tgt_in), source_tokens + written, views, title, predict, per_token, offsets)


class TranslationExplorer(_DecoderExplorer):
    """A translation run (a Transformer or Bahdanau's GRU with additive attention): a sentence in, its
    translation out."""

    accepts = ("text",)

    def __init__(self, run: Run):
        super().__init__(run)
        if run.family == "bahdanau" and not run.model.config.attention:
            raise RunError(f"{run.path}: this GRU encoder–decoder has no attention (attention=false): nothing for "
                           "tokennet explore to draw")
        self.pairs = run.data.held_out() if run.data is not None else []

    def examples(self, limit: int) -> list[str]:
        return [f"{pair[0]} → {pair[1]}" for pair in self.pairs[:limit]]

    def example(self, index: int) -> Exploration:
        index = check_index(index, len(self.pairs))
        source, target = self.pairs[index][:2]
        return self.explore(source, f"#{index}: {source!r} (reference {target!r})")

    def custom(self, fields: dict[str, Any]) -> Exploration:
        text = typed_text(fields).strip()
        return self.explore(text, repr(text))

    def explore(self, text: str, title: str) -> Exploration:
        ids = self.tok.encode(text)
        limit = self.run.model.config.max_source_len
        if len(ids) > limit:
            raise DataError(f"the text is {len(ids)} tokens, longer than the model's maximum of {limit}")
        labels = [self.piece(i) if i != self.tok.unk_id else "<unk>" for i in ids]
        views = {"source": {"kind": "text", "caption": f"the source: {len(ids)} tokens"}}
        source = torch.tensor([ids], device=self.run.device)
        return self.sequence(source, text_tokens(labels, "source"), views, title)


class CaptionExplorer(_DecoderExplorer):
    """A captioner: a picture in, its caption out; each written word's cross-attention is drawn over the picture."""

    accepts = ("image",)

    def __init__(self, run: Run):
        super().__init__(run)
        self.scenes = run.data.held_out() if run.data is not None else []

    def examples(self, limit: int) -> list[str]:
        return [f"#{i}: {caption(scene)}" for i, scene in enumerate(self.scenes[:limit])]

    def example(self, index: int) -> Exploration:
        index = check_index(index, len(self.scenes))
        image = images_of([self.scenes[index]], self.run.model.config.image_size)[0]
        return self.explore(image, f"#{index} (reference {caption(self.scenes[index])!r})")

    def custom(self, fields: dict[str, Any]) -> Exploration:
        image = read_upload(fields, "image", lambda path: self.run.task.images(self.run, [path])[0])
        return self.explore(image, "your picture")

    def explore(self, image: torch.Tensor, title: str) -> Exploration:
        config = self.run.model.config
        side, patch = config.image_size, config.patch_size
        geom = {"grid": (side // patch,) * 2, "patch": (patch, patch), "stride": (patch, patch), "offset": (0, 0),
                "image_hw": (side, side)}
        views = {"picture": grid_view(image, geom, caption="the picture cut into patches")}
        return self.sequence(image[None].to(self.run.device), grid_tokens([], geom), views, title,
                             one_stack=self.run.family == "captioner-prefix")
