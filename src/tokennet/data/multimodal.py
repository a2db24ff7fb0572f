"""The data of a multimodal run: which tasks it trains on, and each task's own data spec and settings.

A multimodal run (recipe ``multimodal``) trains one trunk on several single tasks at once. Its data is theirs,
unchanged: each task keeps its own spec (:class:`~tokennet.data.text.TextCorpus`,
:class:`~tokennet.data.vision_data.ImageDataset`, :class:`~tokennet.data.spoken_digits.SpokenWords`,
:class:`~tokennet.data.sphere.SphereProjection`, :class:`~tokennet.data.graphs.MarkedDistance`), saved here with
the recipe and settings its part was built with, so evaluation, pictures and verbs read each task's held-out data
through that task's own spec (:meth:`MultimodalData.part`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..errors import DataError, unknown_name
from .spec import DataSpec, register_data, spec_from_dict

__all__ = ["MultimodalData", "TASKS", "parse_tasks"]

TASKS = ("text", "image", "audio", "sphere", "graph")


def parse_tasks(text: str) -> list[str]:
    """``"text,image,graph"`` → the task names, in the order given; an empty list or an unknown or repeated name is a
    one-line :class:`~tokennet.errors.DataError` naming the tasks there are."""
    names = [t.strip() for t in str(text).split(",") if t.strip()]
    if not names:
        raise DataError(f"tasks is empty: name at least one of {', '.join(TASKS)} (e.g. tasks=text,image,graph)")
    unknown = [t for t in names if t not in TASKS]
    if unknown:
        raise DataError(f"tasks: {unknown_name('task', unknown[0], TASKS)}")
    if len(set(names)) != len(names):
        raise DataError(f"tasks names a task twice: {text}")
    return names


@register_data
@dataclass
class MultimodalData(DataSpec):
    """Several tasks' data: ``tasks`` (comma-separated, from :data:`TASKS`) and, filled when the run is built,
    ``parts``: task → ``{"recipe": the single-task recipe, "spec": its data spec as a dict, "settings": its
    settings}``.

    Args:
        tasks: the tasks trained together, comma-separated (text, image, audio, sphere, graph).
    """

    kind: ClassVar[str] = "multimodal"
    derived: ClassVar[tuple[str, ...]] = ("parts",)
    tasks: str = ",".join(TASKS)
    parts: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        parse_tasks(self.tasks)

    def names(self) -> list[str]:
        return parse_tasks(self.tasks)

    def part(self, name: str) -> DataSpec:
        """Task ``name``'s own data spec."""
        if name not in self.parts:
            raise DataError(f"this run was trained on {', '.join(self.names())}; it has no {name!r} data")
        return spec_from_dict(self.parts[name]["spec"])
