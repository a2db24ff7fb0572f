"""Explorers of runs whose tokens are text: a language model (characters or BPE pieces; the continuation it
generates, each new token's attention, and the next-token distribution at every position) and a text encoder
(an imported BERT / MiniLM: bidirectional attention, the sentence embedding as its output)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ...errors import DataError, RunError
from .views import MAX_TEXT_CHARS, Exploration, Explorer, check_index, text_tokens, top_k

if TYPE_CHECKING:
    from ...run import Run

__all__ = ["LanguageExplorer", "TextEncoderExplorer", "typed_text"]

SENTENCES = ("The attention of each token looks back at the tokens before it.",
             "A picture is worth sixteen by sixteen words.",
             "Tokens are rows; attention mixes the rows.")
EXAMPLE_TOKENS = 64  # the length of a held-out example
CONTINUATION = 16  # tokens the page generates after the input (fewer where the context is full)


def typed_text(fields: dict[str, Any]) -> str:
    text = fields.get("text")
    if not isinstance(text, str) or not text.strip():
        raise DataError("type a text to read (it is empty)")
    if len(text) > MAX_TEXT_CHARS:
        raise DataError(f"the text is {len(text)} characters; the page reads at most {MAX_TEXT_CHARS}")
    return text


class _TextExplorer(Explorer):
    accepts = ("text",)
    context = 0  # the model's context in tokens

    def __init__(self, run: Run):
        super().__init__(run)
        if run.tokenizer is None:
            raise RunError(f"{run.path} has no tokenizer.json: the page needs one to show text as tokens")
        self.tok = run.tokenizer
        self.texts = list(SENTENCES)

    def piece(self, token_id: int) -> str:
        return self.tok.decode([int(token_id)], skip_special=False)

    def examples(self, limit: int) -> list[str]:
        return [repr(text)[1:-1] for text in self.texts[:limit]]

    def example(self, index: int) -> Exploration:
        index = check_index(index, len(self.texts))
        ids = self.tok.encode(self.texts[index])
        cut = "" if len(ids) <= self.context else f" (its first {self.context} tokens, the model's context)"
        return self.explore(ids[:self.context], f"example #{index}{cut}")

    def custom(self, fields: dict[str, Any]) -> Exploration:
        ids = self.tok.encode(typed_text(fields))
        if len(ids) > self.context:
            raise DataError(f"the text is {len(ids)} tokens, past the model's context of {self.context}; shorten it")
        return self.explore(ids, "your text")


class LanguageExplorer(_TextExplorer):
    """A causal language model: the input, then a greedy continuation; row ``i`` of the attention is token ``i``
    looking back, and each position's next-token distribution is the model's guess of token ``i + 1``."""

    def __init__(self, run: Run):
        super().__init__(run)
        self.context = run.model.config.block_size
        if run.data is not None and hasattr(run.data, "held_out"):
            val = run.data.held_out(self.tok, self.context)
            length = min(EXAMPLE_TOKENS, self.context // 2, max(1, len(val)))
            starts = range(0, max(1, len(val) - length), max(1, (len(val) - length) // 8 or 1))
            self.texts = [self.tok.decode(val[start:start + length].tolist()) for start in list(starts)[:8]]

    def continuation(self, ids: list[int], count: int) -> tuple[list[int], torch.Tensor]:
        """``count`` greedy tokens after ``ids``, over a KV cache (the input read once, then one token a step), and
        the next-token probabilities after ``ids`` ``(V,)``."""
        model = self.run.model
        out: list[int] = []
        with torch.no_grad():
            caches = model.make_caches(len(ids) + max(count, 1))
            logits = model(torch.tensor([ids], device=self.run.device), caches=caches).logits[:, -1]  # (1, V)
            first = logits[0].float().softmax(-1).cpu()
            for _ in range(count):
                out.append(int(logits.argmax(-1)))
                if len(out) < count:
                    logits = model(torch.tensor([[out[-1]]], device=self.run.device), caches=caches).logits[:, -1]
        return out, first

    def explore(self, ids: list[int], title: str) -> Exploration:
        if not ids:
            raise DataError("the text has no tokens")
        count = max(0, min(CONTINUATION, self.context - len(ids)))
        generated, _ = self.continuation(ids, count)
        full = torch.tensor([ids + generated], device=self.run.device)  # (1, T)
        tokens = text_tokens([self.piece(i) for i in ids + generated])
        for token in tokens[len(ids):]:
            token["generated"] = True

        def predict() -> dict[str, Any]:
            written, probs = self.continuation(ids, count)
            text = self.tok.decode(written) if count else "(the context is full)"
            return {"text": text, "top": top_k(probs, None, 5, label=self.piece)}

        def per_token() -> list[list[list[Any]]]:
            with torch.no_grad():
                probs = self.run.model(full).logits[0].float().softmax(-1).cpu()  # (T, V)
            return [top_k(row, None, 5, label=self.piece) for row in probs]

        view = {"kind": "text", "caption": f"{len(ids)} tokens, then {count} the model generated (greedy)"}
        return Exploration(full, tokens, {"text": view}, title, predict, per_token)


class TextEncoderExplorer(_TextExplorer):
    """A text encoder (an imported BERT / MiniLM): every token attends to every other; its output is the
    sentence embedding, so an ablated head is measured by how far the embedding turns (cosine)."""

    def __init__(self, run: Run):
        super().__init__(run)
        self.context = run.model.config.max_len

    def explore(self, ids: list[int], title: str) -> Exploration:
        if not ids:
            raise DataError("the text has no tokens")
        idx = torch.tensor([ids], device=self.run.device)  # (1, N)
        mask = torch.ones_like(idx, dtype=torch.bool)

        def predict() -> dict[str, Any]:
            with torch.no_grad():
                vector = self.run.model.embed(idx, mask)[0].float().cpu()  # (D,)
            shown = ", ".join(f"{v:+.3f}" for v in vector[:4].tolist())
            return {"text": f"an embedding of {vector.numel()} numbers: [{shown}, …]",
                    "top": [[f"dimension {i}", round(float(v), 5)] for i, v in enumerate(vector[:5].tolist())],
                    "vector": vector.tolist()}

        view = {"kind": "text", "caption": f"{len(ids)} tokens, the encoder's own [CLS] … [SEP] included"}
        return Exploration(idx, text_tokens([self.piece(i) for i in ids]), {"text": view}, title, predict)
