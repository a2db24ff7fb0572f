"""Tasks are types, not strings: what a model family can do at inference, and one registry for it.

A *task adapter* knows how to use a model of some family: decode text from it, translate with it,
caption or classify with it. :func:`task_for` maps a model family to its adapter; ``tokennet.load``
attaches it to the :class:`~tokennet.run.Run`, whose verbs (``run.generate``, ``run.translate``,
``run.caption``, ``run.classify``) call it, and ``tokennet viz`` picks its pictures by the task's
``kind``. A new family is one model module plus one :func:`register_task` line below; nothing in the
CLI or ``viz`` branches on family names.

The protocols say what a model must offer for each task (structural typing: any module with these
methods fits):

- :class:`CausalLM` — ``forward(idx)`` → next-token logits, ``make_caches()`` for the KV cache;
- :class:`ConditionalDecoder` — ``init_decode(inputs)`` and ``decode_step(tokens, state)``;
- :class:`Classifier` — ``forward(x)`` → class logits ``(B, K)``;
- :class:`Embedder` — ``embed(ids, mask)`` → one vector per input (imported encoders).

Every model also returns its attention as data: ``attention_maps(inputs) -> {kind: [(B, H, Nq, Nk)]}``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from torch import Tensor

from ..errors import RunError

if TYPE_CHECKING:
    from ..run import Run

__all__ = ["Task", "as_paths", "register_task", "task_for", "list_tasks", "CausalLM", "ConditionalDecoder",
           "Classifier",
           "Embedder"]


@runtime_checkable
class CausalLM(Protocol):
    def forward(self, idx: Tensor, targets: Tensor | None = None, *, caches=None) -> Any: ...
    def make_caches(self, max_len: int | None = None) -> list: ...


@runtime_checkable
class ConditionalDecoder(Protocol):
    def init_decode(self, inputs: Tensor, *, use_cache: bool = True) -> Any: ...
    def decode_step(self, tokens: Tensor, state: Any) -> Tensor: ...


@runtime_checkable
class Classifier(Protocol):
    def forward(self, x: Tensor, targets: Tensor | None = None) -> Any: ...
    def forward_head(self, h: Tensor) -> Tensor: ...


@runtime_checkable
class Embedder(Protocol):
    def embed(self, ids: Tensor, mask: Tensor | None = None) -> Tensor: ...


class Task:
    """Base task adapter: every verb says it is not supported, naming the verbs that are.

    Subclasses set ``name`` (for messages), ``kind`` (what ``viz`` draws) and ``verbs``, and override
    the verbs they support. Verbs take the :class:`~tokennet.run.Run` first.
    """

    name = "model"
    kind = "model"
    verbs: tuple[str, ...] = ()
    protocol: type | None = None

    def _unsupported(self, run: Run, verb: str):
        have = ", ".join(self.verbs) or "none"
        raise RunError(f"{run.path} is a {self.name} run: it cannot {verb} (it supports: {have})")

    def check(self, model) -> None:
        """Raise ``RunError`` unless the model offers what this task needs (its protocol)."""
        if self.protocol is not None and not isinstance(model, self.protocol):
            raise RunError(f"{type(model).__name__} does not implement {self.protocol.__name__}, "
                           f"which a {self.name} task needs")

    def generate(self, run: Run, prompt: str, max_new_tokens: int, **kw) -> str:
        self._unsupported(run, "generate text")

    def translate(self, run: Run, text: str, **kw) -> str:
        self._unsupported(run, "translate")

    def caption(self, run: Run, images, **kw) -> list[str]:
        self._unsupported(run, "caption images")

    def classify(self, run: Run, inputs, **kw) -> list[tuple[int, float]]:
        self._unsupported(run, "classify")

    def embed(self, run: Run, texts, **kw) -> Tensor:
        self._unsupported(run, "embed text")


def as_paths(inputs) -> list:
    """File inputs of a verb as a list: one path, or any iterable of paths."""
    from pathlib import Path

    return [inputs] if isinstance(inputs, (str, Path)) else list(inputs)


_TASKS: dict[str, Task] = {}


def register_task(family: str, task: Task) -> None:
    """Register the task adapter of a model family."""
    _TASKS[family] = task


def task_for(family: str) -> Task:
    """The task adapter of a model family (a generic one, with no verbs, for an unregistered family)."""
    return _TASKS.get(family, Task())


def list_tasks() -> dict[str, str]:
    """Model family → task name."""
    return {f: t.name for f, t in sorted(_TASKS.items())}


# The registrations: one line per model family.
from .audio import AudioClassification  # noqa: E402
from .captioning import Captioning  # noqa: E402
from .classification import ImageClassification  # noqa: E402
from .embedding import TextEmbedding  # noqa: E402
from .graph import GraphPrediction  # noqa: E402
from .language import LanguageModel  # noqa: E402
from .sphere import SphereClassification  # noqa: E402
from .translation import Translation  # noqa: E402

register_task("gpt", LanguageModel())
register_task("seq2seq", Translation())
register_task("bahdanau", Translation())
register_task("captioner", Captioning())
register_task("captioner-prefix", Captioning())
register_task("vit", ImageClassification())
register_task("text-encoder", TextEmbedding())
register_task("ast", AudioClassification())
register_task("graph", GraphPrediction())
register_task("sphere", SphereClassification())
