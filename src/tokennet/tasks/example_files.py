"""Held-out inputs written as files a person can use: what ``tokennet examples RUN --out DIR`` writes.

A task says how to write its inputs (:meth:`~tokennet.tasks.base.Task.examples`: pictures as PNG, clips as WAV,
graphs as the JSON ``generate --graphs`` reads, prompts as text); this module is the rest, the same for every task:
the checks of ``--count`` and ``--out`` (refused before anything is written), the directory built beside ``DIR``
and put in its place whole (:func:`~tokennet.fileio.atomic_directory`, so a failure leaves nothing), and the index
``DIR/examples.json``::

    {"run": "runs/vit", "task": "image classification",
     "examples": [{"files": ["image-0.png"], "generate": {"--image": ["image-0.png"]}, "label": "3"}, ...]}

Paths in the index are relative to ``DIR``; ``generate`` holds the flags of ``tokennet generate`` for the example
and ``label`` the answer the held-out data gives (what a correct ``generate`` prints).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import DataError

__all__ = ["Example", "UpTo", "DEFAULT_COUNT", "MAX_EXAMPLES", "INDEX_FILE", "check_request", "relocate", "index_text",
           "examples_command", "generate_command", "class_label", "take", "varied", "missing_parents",
           "removed_on_failure"]

MAX_EXAMPLES = 1000  # --count's upper bound: a few to try, never the whole test set by accident
INDEX_FILE = "examples.json"


@dataclasses.dataclass(frozen=True)
class Example:
    """One held-out input, written as files, with the answer its data gives.

    Args:
        values: ``tokennet generate``'s values for it, by input name: ``{"image": [path]}``, ``{"prompt": text}``.
        label: the held-out answer, as a correct ``generate`` prints it (a class index and its name, a caption,
            a translation, the text that follows a prompt).
        files: every file written for it (its inputs, and companions such as a scene's questions).
    """

    values: dict[str, Any]
    label: str
    files: tuple[Path, ...] = ()


class UpTo(int):
    """A count that is a most, not a demand: the default of ``tokennet examples`` (3, or fewer where the held-out
    data holds fewer), where a ``--count`` the user gives is exact."""


DEFAULT_COUNT = UpTo(3)


def take(count: int, available: int, run_path) -> range:
    """The first ``count`` of ``available`` held-out items; a clear refusal when there are fewer (all of them when
    ``count`` is :class:`UpTo`)."""
    if isinstance(count, UpTo):
        return range(min(count, available))
    if count > available:
        raise DataError(f"{run_path} holds {available} held-out example{'s' * (available != 1)}: ask for --count "
                        f"{available} or fewer")
    return range(count)


def varied(labels, count: int, run_path) -> list[int]:
    """``count`` held-out items, one class after another (in the order the classes first appear, then round again),
    so that a few examples show a few classes rather than the first items' one or two."""
    by_class: dict[int, list[int]] = {}
    for item, label in enumerate(int(label) for label in labels):
        by_class.setdefault(label, []).append(item)
    order = [items[turn] for turn in range(max(map(len, by_class.values()), default=0))
             for items in by_class.values() if turn < len(items)]
    return [order[k] for k in take(count, len(order), run_path)]


def class_label(index: int, names) -> str:
    """``"3"``, or ``"7 (seven)"`` where the class has a name other than its index."""
    name = names[index] if names is not None and index < len(names) else None
    return str(index) if name in (None, str(index)) else f"{index} ({name})"


def check_request(out_dir: str | Path, count: int) -> None:
    """Refuse, before anything is written, a bad ``--count`` or an ``--out`` that is a file or some other
    directory (only an empty one, or one ``tokennet examples`` wrote, is replaced)."""
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_EXAMPLES:
        raise DataError(f"--count must be a whole number from 1 to {MAX_EXAMPLES}, got {count!r}")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise DataError(f"--out {out} is a file: give a directory to write the examples into")
    if out.is_dir() and any(out.iterdir()) and not (out / INDEX_FILE).is_file():
        raise DataError(f"--out {out} is a directory that tokennet examples did not write (no {INDEX_FILE}): "
                        "choose a new or empty directory")


def missing_parents(out_dir: Path) -> list[Path]:
    """The folders above ``out_dir`` that do not exist yet (the deepest first): writing it will make them."""
    return [parent for parent in Path(out_dir).absolute().parents if not parent.exists()]


@contextlib.contextmanager
def removed_on_failure(made: list[Path]) -> Iterator[None]:
    """Remove the folders ``made`` (the deepest first) when the block raises: a refused request leaves nothing."""
    try:
        yield
    except BaseException:
        for folder in made:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only while empty: never anything someone else put there meanwhile
        raise


def relocate(example: Example, built: Path, final: Path) -> Example:
    """The example with its paths under ``built`` (the directory being written) moved to ``final``."""

    def moved(value):
        if isinstance(value, (list, tuple)):
            return [moved(item) for item in value]
        if isinstance(value, (str, Path)) and Path(value).is_relative_to(built):
            return str(final / Path(value).relative_to(built))
        return value

    return Example({name: moved(value) for name, value in example.values.items()}, example.label,
                   tuple(Path(moved(path)) for path in example.files))


def _flags(values: dict[str, Any], inputs, root: Path) -> dict[str, Any]:
    """``generate``'s flags for ``values``, file paths relative to ``root``."""
    out = {}
    for declared in inputs:
        value = values.get(declared.name)
        if value in (None, [], ""):
            continue
        out[declared.flag] = [str(Path(path).relative_to(root)) for path in value] if declared.file else value
    return out


def index_text(run, examples: list[Example], root: Path) -> str:
    """``examples.json`` of ``examples`` written under ``root`` (see the module docstring)."""
    entries = [{"files": [str(path.relative_to(root)) for path in example.files],
                "generate": _flags(example.values, run.task.inputs, root), "label": example.label}
               for example in examples]
    return json.dumps({"run": str(run.path), "task": run.task.name, "examples": entries}, indent=1,
                      ensure_ascii=False) + "\n"


def examples_command(run_dir: str | Path) -> str:
    """The command that writes a run's held-out examples, as error messages and the docs give it."""
    return f"tokennet examples {run_dir} --out examples-{Path(run_dir).name}"


def generate_command(run_dir: str | Path, example: Example, inputs) -> str:
    """``tokennet generate RUN_DIR ...`` with the example's inputs (a text with a line break read from its file)."""
    words = ["tokennet", "generate", shlex.quote(str(run_dir))]
    for declared in inputs:
        value = example.values.get(declared.name)
        if value in (None, [], ""):
            continue
        if declared.file:
            words += [declared.flag, *(shlex.quote(str(path)) for path in value)]
        elif "\n" in value and example.files:
            words += [declared.flag, f'"$(cat {shlex.quote(str(example.files[0]))})"']
        else:
            words += [declared.flag, shlex.quote(value)]
    return " ".join(words)
