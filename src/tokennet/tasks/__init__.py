"""Tasks are types, not strings: what a model family does at inference, declared in one module per task.

A *task adapter* (:class:`Task`, see :mod:`tokennet.tasks.base`) knows how to use a model of some
families: its verbs (``run.generate``, ``run.translate``, ``run.caption``, ``run.classify``, ...), the
inputs and options ``tokennet generate`` takes for it, its pictures (``tokennet viz``) and its report
panel. ``tokennet.load`` attaches the task of the run's model family to the
:class:`~tokennet.run.Run`, whose verbs call it; the CLI, ``viz`` and the report dispatch through it and
never branch on a family or task name. A new task is one module here with one ``@register_task`` class
(every module of this package is imported, so nothing else is edited); a plugin's task is the same
class in its own file (:mod:`tokennet.plugins`).

The protocols say what a model must offer for each task (structural typing: any module with these
methods fits):

- :class:`CausalLM` — ``forward(idx)`` → next-token logits, ``make_caches()`` for the KV cache;
- :class:`ConditionalDecoder` — ``init_decode(inputs)`` and ``decode_step(tokens, state)``;
- :class:`Classifier` — ``forward(x)`` → class logits ``(B, K)``;
- :class:`Embedder` — ``embed(ids, mask)`` → one vector per input (imported encoders).

Every model also returns its attention as data: ``attention_maps(inputs) -> {kind: [(B, H, Nq, Nk)]}``.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Protocol, runtime_checkable

from torch import Tensor

from ..plugins import list_tasks as _list_tasks
from ..plugins import task_for as _task_for
from .base import OPTIONS, Input, Option, Task, all_verbs, as_paths, register_task, verb
from .example_files import Example, take

__all__ = ["Task", "Input", "Option", "OPTIONS", "verb", "as_paths", "register_task", "task_for", "list_tasks",
           "all_verbs", "Example", "take", "CausalLM", "ConditionalDecoder", "Classifier", "Embedder"]


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


def task_for(family: str) -> Task:
    """The task adapter of a model family (the generic one, with no verbs, for a family no task serves)."""
    return _task_for(family) or Task()


def list_tasks() -> dict[str, str]:
    """Model family → task name."""
    return {family: task.name for family, task in _list_tasks().items()}


# Every module of this package declares one task and registers it with @register_task: import them all.
for _m in pkgutil.iter_modules(__path__):
    if _m.name != "base" and not _m.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_m.name}")
