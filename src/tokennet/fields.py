"""Typed settings: the type of every setting comes from a dataclass annotation, and text is parsed against it.

Every setting ``tokennet train --set key=value`` accepts is a field of a dataclass — a model config, the
:class:`~tokennet.train.TrainConfig`, a data spec or a recipe's options — and its annotation says what
the text must be: ``int``, ``float``, ``bool``, ``str``, ``X | None`` (``none`` or an X), ``int |
list[int]`` (``28`` or ``24,48``). A value that does not parse is one :class:`~tokennet.errors.RecipeError`
naming the setting and the type, whatever the default is (a field defaulting to None still has a type).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
import types
import typing
from typing import Any

from .errors import RecipeError

__all__ = ["field_types", "field_docs", "coerce", "type_name"]

_NONE = ("none", "null")


def field_types(cls) -> dict[str, Any]:
    """``name → annotation`` (resolved) of a dataclass's init fields."""
    hints = typing.get_type_hints(cls)
    return {field.name: hints.get(field.name, Any) for field in dataclasses.fields(cls) if field.init}


_SECTION = re.compile(r"^(Args|Attributes):\s*$")
_ENTRY = re.compile(r"^    (\w+(?:, \w+)*)(?: \([^)]*\))?: (.+)$")  # "    name: text", "    lr, min_lr: text"


def field_docs(cls) -> dict[str, str]:
    """``name → description`` of a dataclass's fields, from the ``Args:`` or ``Attributes:`` sections of the
    docstrings of the class and its bases (Google style; ``lr, min_lr: ...`` describes both). A subclass's words
    win over its base's, except that an entry naming several fields (``dim, num_layers: the encoder``) leaves a
    base's own entry of a field as it was."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        doc = inspect.getdoc(klass) if "__doc__" in vars(klass) and klass.__doc__ else ""
        inherited = set(out)
        names: list[str] = []
        in_section = False
        for line in doc.splitlines():
            if _SECTION.match(line):
                in_section, names = True, []
            elif in_section and line.strip() and not line.startswith(" "):
                in_section, names = False, []
            elif in_section and names and line.startswith("        "):
                out.update({name: out[name] + " " + line.strip() for name in names})
            elif in_section and (entry := _ENTRY.match(line)):
                names = [name.strip() for name in entry.group(1).split(",")]
                if len(names) > 1:
                    names = [name for name in names if name not in inherited]
                out.update(dict.fromkeys(names, entry.group(2).strip()))
    return {name: _own_part(name, text, out) for name, text in out.items()}


def _own_part(name: str, text: str, docs: dict[str, str]) -> str:
    """``dim, num_layers, num_heads: width D, depth L, heads H``: each name its own part, where the text is a list of
    short parts (a few words each, split at the commas), as many as the names that share it; else the whole text."""
    sharing = [other for other, same in docs.items() if same == text]
    parts = [part.strip() for part in text.rstrip(".").split(",")]
    listed = len(sharing) > 1 and len(parts) == len(sharing) and all(len(part.split()) <= 3 for part in parts)
    return parts[sharing.index(name)] if listed else text


def _args(annotation) -> tuple:
    """The members of a union (``X | None`` → ``(X, NoneType)``), or the annotation alone."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return typing.get_args(annotation)
    return (annotation,)


def type_name(annotation) -> str:
    """How a message names a type: ``int``, ``float or none``, ``true/false``, ``int or a list of int``."""
    return _names(_args(annotation))


def _names(members: tuple) -> str:
    names = []
    for member in members:
        if member is type(None):
            continue
        if member is bool:
            names.append("true/false")
        elif typing.get_origin(member) in (list, tuple):
            inner = typing.get_args(member)[0] if typing.get_args(member) else Any
            names.append(f"a comma-separated list of {getattr(inner, '__name__', inner)}")
        else:
            names.append(getattr(member, "__name__", str(member)))
    if type(None) in members:
        names.append("none")
    return " or ".join(names)


def _parse_one(text: str, a) -> Any:
    low = text.strip().lower()
    if a is bool:
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ValueError
    if a is int:
        return int(text)
    if a is float:
        v = float(text)
        if math.isnan(v):  # a NaN setting passes every range check (nan > 0 is False, nan < 1 is False ...)
            raise ValueError
        return v
    if a is str:
        return text
    if typing.get_origin(a) in (list, tuple):
        inner = (typing.get_args(a) or (str,))[0]
        parts = [part for part in text.replace(" ", "").split(",") if part]
        if not parts:
            raise ValueError
        return [_parse_one(part, inner) for part in parts]
    raise ValueError


def coerce(key: str, text: str, annotation, default: Any = None) -> Any:
    """Parse ``text`` as the setting ``key`` of type ``annotation``; a ``RecipeError`` when it does not parse.

    ``none``/``null`` is None only where the type admits None (a string setting keeps "none" as a value,
    e.g. ``position=none``). With no usable annotation (``Any``), the default's type decides, and a
    setting whose default is None takes an int, a float, or the text.
    """
    members = _args(annotation)
    if annotation is Any or not members:
        members = (type(default),) if default is not None else (int, float, str, type(None))
    low = text.strip().lower()
    if low in _NONE and type(None) in members:
        return None
    # In a union, try the narrow types first: "3" is an int before it is a float or a string.
    order = sorted((m for m in members if m is not type(None)),
                   key=lambda m: {bool: 0, int: 1, float: 2}.get(m, 3 if typing.get_origin(m) else 4))
    for m in order:
        try:
            return _parse_one(text, m)
        except (ValueError, TypeError):
            continue
    raise RecipeError(f"setting {key}={text}: expected {_names(members)}")
