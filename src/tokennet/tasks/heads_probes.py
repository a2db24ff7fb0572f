"""What :func:`~tokennet.tasks.heads.head_jobs` measures on each kind of run: one probe per task.

A probe holds a run's first ``limit`` held-out examples and answers, with whatever heads are ablated at the moment:

- ``score()``: the metric per group (``"all"`` included);
- ``distances()``: each head's mean attention distance, ``{layer: [one per head]}``;
- ``attends()``: where the query the answer is read from attends, per head (``{}`` where there is none).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from ..data.text import TextCorpus
from ..data.vqa import encode_questions
from ..errors import RunError
from .vqa_heads import head_statistics, predict, summary_targets

if TYPE_CHECKING:
    from ..run import Run

__all__ = ["QuestionProbe", "TextProbe", "character_class"]


class QuestionProbe:
    """A question-answering run: exact match (%) per question template on its first ``limit`` test questions."""

    metric, unit, higher_is_better, distance_unit = "exact match", "%", True, "px"

    def __init__(self, run: Run, limit: int):
        if run.data is None or not getattr(run.data, "words", None):
            raise RunError(f"{run.path.name} has no question vocabulary (no data spec in run.json)")
        held = run.data.held_out()
        self.qa = held.subset(list(range(min(limit, len(held)))))
        self.model, self.words = run.model, run.data.words
        self.examples, self.example_name = len(self.qa), "questions"
        self.questions = encode_questions(self.qa.questions, self.words, self.model.config.max_question_len)
        self.groups = {template: torch.tensor([t == template for t in self.qa.templates])
                       for template in sorted(set(self.qa.templates))}
        self.groups["all"] = torch.ones(len(self.qa), dtype=torch.bool)
        self.hits = torch.zeros(0, dtype=torch.bool)  # the last score's per-question hits

    def score(self) -> dict[str, float]:
        """Exact match (%) per template and over all, as :func:`~tokennet.tasks.vqa.exact_match` computes it."""
        self.hits = predict(self.model, self.qa.images, self.questions) == self.qa.answers  # (n,)
        return {group: round(100.0 * float(self.hits[chosen].float().mean()), 3)
                for group, chosen in self.groups.items()}

    def standard_error(self, reference: torch.Tensor) -> dict[str, float]:
        """Per group, the standard error (points) of the last score's difference from ``reference``'s hits: the
        same questions asked twice, so only those whose answer turned right or wrong count,
        ``√(lost + gained) / n``."""
        changed = self.hits != reference
        return {group: round(100.0 * float(changed[chosen].sum()) ** 0.5 / int(chosen.sum()), 3)
                for group, chosen in self.groups.items()}

    def distances(self) -> dict[int, list[float]]:
        return head_statistics(self.model, self.qa, self.words, limit=len(self.qa)).get("distance", {})

    def attends(self) -> dict[str, Any]:
        return summary_targets(self.model, self.qa, self.words)


def character_class(text: str) -> str:
    """``letter``, ``space`` (any white space, newlines too) or ``other`` (punctuation, digits), by the first
    character of a token's text."""
    if not text:
        return "other"
    return "letter" if text[0].isalpha() else "space" if text[0].isspace() else "other"


class TextProbe:
    """A language model: the next-token loss (nats) on its first ``limit`` held-out windows, overall and by the
    class of the character predicted (:func:`character_class`)."""

    metric, unit, higher_is_better, distance_unit = "loss", "nats", False, "tokens"
    BATCH = 16

    def __init__(self, run: Run, limit: int):
        if not isinstance(run.data, TextCorpus) or run.tokenizer is None:
            raise RunError(f"{run.path.name} has no held-out text of its own (a chat file, or an imported "
                           "checkpoint): tokennet heads measures a language model on its validation split")
        self.model = run.model
        T = min(int(run.settings.get("block_size", self.model.config.block_size)), self.model.config.block_size)
        ids = run.data.held_out(run.tokenizer, T)
        n = min(limit, (len(ids) - 1) // T)
        if n < 1:
            raise RunError(f"{run.path.name}'s held-out text is shorter than one window of {T} tokens")
        self.x = ids[:n * T].view(n, T)  # (n, T)
        self.y = ids[1:n * T + 1].view(n, T)  # (n, T): the next token at each place
        tokens = self.y.unique()  # sorted: a token's place here is its row of the lookup below
        kinds = [character_class(run.tokenizer.decode([token])) for token in tokens.tolist()]
        names = sorted(set(kinds))
        kind_of = torch.tensor([names.index(kind) for kind in kinds])[torch.searchsorted(tokens, self.y)]  # (n, T)
        self.classes = {kind: kind_of == number for number, kind in enumerate(names)}
        self.examples, self.example_name = n, f"windows of {T} tokens"

    def _batches(self):
        dev = next(self.model.parameters()).device
        for start in range(0, len(self.x), self.BATCH):
            yield start, self.x[start:start + self.BATCH].to(dev)

    @torch.no_grad()
    def score(self) -> dict[str, float]:
        losses = torch.cat([F.cross_entropy(self.model(x).logits.float().transpose(1, 2),
                                            self.y[start:start + len(x)].to(x.device), reduction="none").cpu()
                            for start, x in self._batches()])  # (n, T)
        out = {kind: round(float(losses[chosen].mean()), 4) for kind, chosen in self.classes.items() if chosen.any()}
        return {**out, "all": round(float(losses.mean()), 4)}

    @torch.no_grad()
    def distances(self) -> dict[int, list[float]]:
        """``Σ_j A_ij (i − j)``: how many tokens back a query looks, averaged over the queries and windows."""
        T = self.x.shape[1]
        back = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).clamp_min(0).float()  # (T, T): i − j
        totals: dict[int, torch.Tensor] = {}
        for _, x in self._batches():
            for layer, amap in enumerate(self.model.attention_maps(x)["self"]):  # (b, H, T, T)
                summed = (amap.float().cpu() * back).sum(-1).sum((0, 2))  # (H,)
                totals[layer] = totals.get(layer, 0) + summed
        return {layer: [round(float(value) / (len(self.x) * T), 3) for value in total]
                for layer, total in totals.items()}

    def attends(self) -> dict[str, Any]:
        return {}
