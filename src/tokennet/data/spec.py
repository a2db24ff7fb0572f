"""What a run's data *is*, as a type: a small dataclass per dataset, saved with the run.

A data spec names a dataset (``kind``) and every parameter that decides which examples a run trains
and is tested on — the source (``--data``), split fractions and sizes, seeds, preprocessing such as a
sample rate or a projection's extent. Each dataset module declares its own spec, registered by kind::

    @register_data
    @dataclass
    class ShapeScenes(DataSpec):
        kind: ClassVar[str] = "shapes"
        seed: int = 0
        held_out_fraction: float = 0.2
        ...
        def held_out(self) -> list[Scene]: ...

Training stores ``spec.to_dict()`` in ``run.json`` (``"data_spec"``); :attr:`tokennet.run.Run.data`
rebuilds it with :func:`spec_from_dict`, and evaluation, pictures, the report and the task verbs read the
held-out data through its methods — never by re-deriving it from loose settings with their own fallbacks.

The spec's fields are settings: a recipe's data options are its spec's fields, so ``--set
val_fraction=0.2`` sets the spec's field, typed by its annotation (:mod:`tokennet.fields`).

Runs written before specs existed have no ``"data_spec"``: a spec class lists the recipes whose old runs
used it (``legacy_recipes``) and rebuilds itself from their ``--data`` and settings
(:meth:`DataSpec.from_legacy`), with the defaults those runs were trained with.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from ..errors import DataError
from ..fields import field_types

__all__ = ["DataSpec", "register_data", "spec_from_dict", "spec_class", "list_data", "legacy_spec"]

_SPECS: dict[str, type[DataSpec]] = {}
# The dataset modules that declare tokennet's own specs (imported on first look-up, not with the package:
# some read large files or need optional packages only when used).
_BUILTIN = ("text", "vision_data", "dates", "shapes", "spoken_digits", "graphs", "qm9", "sphere", "chats",
            "multimodal")


def _builtins() -> None:
    import importlib

    for m in _BUILTIN:
        importlib.import_module(f"{__package__}.{m}")


@dataclasses.dataclass
class DataSpec:
    """Base of every data spec. Subclasses are dataclasses that set ``kind`` and keep JSON-able fields."""

    kind: ClassVar[str] = ""
    legacy_recipes: ClassVar[tuple[str, ...]] = ()  # recipes whose runs saved before data specs used this spec
    derived: ClassVar[tuple[str, ...]] = ()  # fields the data itself fills in (class names, ...): not settings

    # -- (de)serialization ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DataSpec:
        names = set(field_types(cls))
        unknown = sorted(set(d) - names - {"kind"})
        if unknown:
            raise DataError(f"unknown {cls.kind!r} data field(s) {unknown}; valid: {sorted(names)}")
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def setting_names(cls) -> set[str]:
        """The fields that are settings (all but ``source``, which ``--data`` gives, and the ``derived`` ones)."""
        return set(field_types(cls)) - {"source"} - set(cls.derived)

    @classmethod
    def from_settings(cls, source: str | None, settings: dict[str, Any]) -> DataSpec:
        """The spec of a run: ``source`` (``--data``) and the fields named in ``settings`` (the rest: defaults)."""
        kwargs = {k: settings[k] for k in cls.setting_names() if k in settings}
        if "source" in field_types(cls) and source is not None:
            kwargs["source"] = source
        return cls(**kwargs)

    @classmethod
    def from_legacy(cls, data: str | None, settings: dict[str, Any]) -> DataSpec:
        """A run saved before data specs: rebuilt from its ``--data`` and settings (see the module docstring)."""
        return cls.from_settings(data, settings)

    def replace(self, **changes) -> DataSpec:
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        """One line for reports: the kind and the fields that are not defaults."""
        parts = [f"{spec_field.name}={getattr(self, spec_field.name)!r}" for spec_field in dataclasses.fields(self)
                 if spec_field.default is dataclasses.MISSING or getattr(self, spec_field.name) != spec_field.default]
        return f"{self.kind}" + (f" ({', '.join(parts)})" if parts else "")


def register_data(cls: type[DataSpec]) -> type[DataSpec]:
    """Register a spec class by its ``kind`` (a class decorator)."""
    if not cls.kind:
        raise ValueError(f"{cls.__name__} must set a kind")
    _SPECS[cls.kind] = cls
    return cls


def list_data() -> list[str]:
    _builtins()
    return sorted(_SPECS)


def spec_class(kind: str) -> type[DataSpec]:
    if kind not in _SPECS:
        _builtins()
    if kind not in _SPECS:
        raise DataError(f"unknown data kind {kind!r}; known: {', '.join(list_data())}")
    return _SPECS[kind]


def spec_from_dict(d: dict[str, Any]) -> DataSpec:
    """Rebuild a spec from its ``run.json`` form (which names its kind)."""
    if not isinstance(d, dict) or "kind" not in d:
        raise DataError(f"a data spec must be an object with a 'kind', got {d!r}")
    return spec_class(d["kind"]).from_dict(d)


def legacy_spec(recipe: str | None, data: str | None, settings: dict[str, Any]) -> DataSpec | None:
    """The spec of a run saved before data specs (by its recipe), or None when no spec claims the recipe.

    A recipe may have trained on two kinds of data (``graph``: generated graphs or QM9): each spec's
    :meth:`DataSpec.from_legacy` returns None when the run's data is not its kind.
    """
    _builtins()
    for cls in _SPECS.values():
        if recipe in cls.legacy_recipes:
            spec = cls.from_legacy(data, settings)
            if spec is not None:
                return spec
    return None
