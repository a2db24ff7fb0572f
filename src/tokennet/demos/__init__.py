"""Small demonstrations from the lecture, runnable with ``tokennet demo NAME``: one module each, registered there.

A demo is a function ``run(out_dir, *, seed) -> metrics`` that writes its figures into ``out_dir``;
:func:`register_demo` names it for the CLI. Every module of this package is imported (so a new demo edits
nothing else), and a plugin can register its own.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import TokennetError

__all__ = ["Demo", "register_demo", "get_demo", "list_demos"]


@dataclass(frozen=True)
class Demo:
    """A demonstration: ``run(out_dir, seed=...) -> metrics``, the files it writes, one line for ``--help``.

    A demo made of parts (``tokennet demo claims``) names them with ``parts()``, and its ``run`` takes
    ``only=NAME``; ``summary(metrics)`` is the text the CLI prints instead of the metrics' JSON.
    """

    name: str
    run: Callable[..., dict[str, Any]]
    description: str
    files: tuple[str, ...] = ()
    parts: Callable[[], list[str]] | None = None
    summary: Callable[[dict[str, Any]], str] | None = None


_DEMOS: dict[str, Demo] = {}


def register_demo(demo: Demo) -> Demo:
    _DEMOS[demo.name] = demo
    return demo


def list_demos() -> list[Demo]:
    return [_DEMOS[k] for k in sorted(_DEMOS)]


def get_demo(name: str) -> Demo:
    if name not in _DEMOS:
        raise TokennetError(f"unknown demo {name!r}; available: {', '.join(sorted(_DEMOS))}")
    return _DEMOS[name]


for _m in pkgutil.iter_modules(__path__):
    if not _m.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_m.name}")
