"""The explorer of a multimodal run: one trunk, several tasks. Each task's part of the model is explored as that
task's own run (its explorer, its held-out examples, its tokens); the page lists every part's examples, each
marked with its task, and sends a user's text, picture, clip or graph to the part that takes it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...errors import DataError, RunError
from .views import Exploration, Explorer, check_index

if TYPE_CHECKING:
    from ...run import Run

__all__ = ["MultimodalExplorer"]

# what a user gives → the parts that take it, in order of preference
TAKEN_BY = {"text": ("text",), "graph": ("graph",), "audio": ("audio",), "image": ("image", "sphere")}


class MultimodalExplorer(Explorer):
    """Every part of a multimodal run, each through its own task's explorer (``parts(run, name)``: the part as a
    run of its own, :func:`tokennet.tasks.multimodal.part_run`)."""

    def __init__(self, run: Run, parts: Callable[[Run, str], Run]):
        super().__init__(run)
        self.explorers: dict[str, Explorer] = {}
        for name in run.model.tasks:
            part = parts(run, name)
            if part.task.explorer is not None:
                self.explorers[name] = part.task.explorer(part)
        if not self.explorers:
            raise RunError(f"{run.path}: none of its tasks ({', '.join(run.model.tasks)}) has anything to explore")
        self.accepts = tuple(dict.fromkeys(given for explorer in self.explorers.values() for given in explorer.accepts))
        self.listed: list[tuple[str, int]] = []

    def examples(self, limit: int) -> list[str]:
        per_part = max(1, limit // len(self.explorers))
        lines, self.listed = [], []
        for name, explorer in self.explorers.items():
            for index, line in enumerate(explorer.examples(per_part)):
                lines.append(f"[{name}] {line}")
                self.listed.append((name, index))
        return lines

    def example(self, index: int) -> Exploration:
        if not self.listed:
            self.examples(50)
        name, local = self.listed[check_index(index, len(self.listed))]
        return self._marked(name, self.explorers[name].example(local))

    def custom(self, fields: dict[str, Any]) -> Exploration:
        given = fields.get("upload_kind") or next((key for key in ("text", "graph") if key in fields), None)
        name = next((part for part in TAKEN_BY.get(given, ()) if part in self.explorers), None)
        if name is None:
            raise DataError(f"this run's tasks ({', '.join(self.explorers)}) take no {given or 'such'} input")
        return self._marked(name, self.explorers[name].custom(fields))

    def _marked(self, name: str, exploration: Exploration) -> Exploration:
        exploration.title = f"[{name}] {exploration.title}"
        exploration.run = self.explorers[name].run  # its part of the model computes it
        return exploration
