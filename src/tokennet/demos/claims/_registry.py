"""The claims' registry: one function per checkable statement of the lecture, registered with :func:`claim`.

A claim is a function ``fn(seed) -> Result`` whose docstring's first paragraph is the lecture's own wording;
the command, the tests and the page all call the same function.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Claim", "Result", "claim", "claims", "png", "plt"]


@dataclass
class Result:
    """What a claim's experiment found.

    Args:
        run: what was run, one line.
        measured: the measured figure, one line.
        holds: whether the claim holds on that measurement (``None``: not measured here).
        figure: a PNG, or ``None``.
        data: the numbers behind ``measured`` (written to ``claims.json``).
        source: where a figure read from a file came from (``None``: measured by this run).
        table: a table of its own (a header row, then rows of text), shown under the claim.
    """

    run: str
    measured: str
    holds: bool | None
    figure: bytes | None = None
    data: dict[str, Any] = field(default_factory=dict)
    source: str | None = None
    table: list[list[str]] | None = None


@dataclass(frozen=True)
class Claim:
    """A registered claim: its short ``name`` (for ``--only``), its number in issue 33, the lecture's words."""

    name: str
    number: str
    quote: str
    fn: Callable[[int], Result]

    def __call__(self, seed: int = 0) -> Result:
        return self.fn(seed)


_CLAIMS: dict[str, Claim] = {}


def claim(name: str, number: str) -> Callable[[Callable[[int], Result]], Callable[[int], Result]]:
    """Register ``fn(seed) -> Result`` as claim ``name``; its docstring's first paragraph is the quote."""

    def register(fn: Callable[[int], Result]) -> Callable[[int], Result]:
        doc = (fn.__doc__ or "").strip()
        quote = " ".join(doc.split("\n\n")[0].split())
        if not quote:
            raise ValueError(f"claim {name!r}: the docstring must quote the lecture")
        _CLAIMS[name] = Claim(name, number, quote, fn)
        return fn

    return register


def claims() -> list[Claim]:
    """Every registered claim, in the issue's order (its number, then the name)."""

    def key(c: Claim):
        digits = "".join(char for char in c.number if char.isdigit())
        return (int(digits or 0), c.number, c.name)

    return sorted(_CLAIMS.values(), key=key)


def plt():
    """matplotlib's pyplot on the Agg backend (no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


def png(fig, dpi: int = 90) -> bytes:
    """A matplotlib figure as PNG bytes; the figure is closed."""
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    finally:
        plt().close(fig)
    return buf.getvalue()
