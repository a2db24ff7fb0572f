"""What a task is: verbs, declared inputs and options, pictures and a report panel — in one class, registered once.

A task adapter knows how to use a model of some families at inference. It declares, where it is defined:

- its **verbs**: methods marked :func:`verb`; :class:`~tokennet.run.Run` offers each as ``run.<verb>(...)``
  (``run.generate``, ``run.classify``, ``run.answer``, ...), so a task with a new verb edits nothing else;
- its **inputs** (:class:`Input`) and generation **options** (:class:`Option`): what ``tokennet generate RUN``
  takes (``--image``, ``--audio``, ``--prompt``, ``--input`` for the first file input; ``--temperature``,
  ``--beam-size``, ...). The CLI builds its flags from every registered task's declarations, sends a run's
  values to :meth:`Task.respond` and refuses, in one line, a flag the run's task does not take;
- its **pictures** (:meth:`Task.draw`, what ``tokennet viz`` writes) and **report panel** (:meth:`Task.panel`);
- held-out inputs written as files (:meth:`Task.examples`, what ``tokennet examples`` writes) and bad inputs that
  must fail in one line (:meth:`Task.bad_inputs`), which the registry tests use for every task.

``register_task(TaskClass)`` (a class decorator) registers one instance for each of ``TaskClass.families``.
Held-out data always comes from the run's data spec (``run.data``), never from loose settings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import DataError, RunError
from ..fileio import atomic_directory
from ..plugins import all_verbs
from ..plugins import register_task as _register
from .example_files import (
    DEFAULT_COUNT,
    INDEX_FILE,
    Example,
    check_request,
    index_text,
    missing_parents,
    relocate,
    removed_on_failure,
)

if TYPE_CHECKING:
    from ..run import Run

__all__ = ["Task", "verb", "Input", "Option", "register_task", "all_verbs", "as_paths", "OPTIONS", "HELP",
           "image_file_bad_inputs", "check_values", "Example"]


def verb(fn: Callable) -> Callable:
    """Mark a task method as a verb: ``run.<name>(*args)`` calls ``task.<name>(run, *args)``."""
    fn.__tokennet_verb__ = True
    return fn


@dataclasses.dataclass(frozen=True)
class Input:
    """One input of a task's ``tokennet generate``: a file flag (``--image PATH ...``) or a text flag (``--prompt``).

    Args:
        name: the flag (``--name``) and the key in :meth:`Task.respond`'s values.
        help: the flag's help text (every task declaring the flag shares one help: the first one registered).
        file: file paths (``nargs="+"``, several at once) rather than one text.
        required: ``tokennet generate`` refuses to run without it.
        default: the value when it is not given (text inputs).
    """

    name: str
    help: str
    file: bool = True
    required: bool = True
    default: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclasses.dataclass(frozen=True)
class Option:
    """A generation option of ``tokennet generate`` (``--temperature 0.5``); ``flag=True``: a switch."""

    name: str
    help: str
    type: type = str
    default: Any = None
    choices: tuple | None = None
    flag: bool = False
    metavar: str | None = None

    @property
    def cli(self) -> str:
        return "--" + self.name.replace("_", "-")


def _quantize_choices() -> tuple[str, ...]:
    from ..layers.quantize import QUANTIZE_MODES

    return ("auto", *QUANTIZE_MODES)


# The options several tasks share, declared once.
OPTIONS = {
    "max_new_tokens": Option("max_new_tokens", "tokens to generate (>= 1; default 200)", int, 200),
    "temperature": Option("temperature", "0 = greedy; higher = more random (default 0.8)", float, 0.8),
    "top_k": Option("top_k", "sample among the k most likely tokens", int),
    "top_p": Option("top_p", "nucleus sampling threshold in (0, 1]", float),
    "seed": Option("seed", "sampling seed (default 0)", int, 0),
    "no_cache": Option("no_cache", "recompute the whole window every step (no KV cache)", flag=True),
    "no_compile": Option("no_compile", "language models: decode eagerly, never with the decoding step compiled by "
                         "torch.compile. By default the step is compiled only where the answer is long enough to "
                         "repay it (timed on the first tokens; the decision and its reason are logged once; the "
                         "first compilation on a machine takes tens of seconds, later ones load Inductor's disk "
                         "cache). TOKENNET_COMPILE=0 or 1 sets the default", flag=True),
    "compile": Option("compile", "language models: decode with the compiled step however short the answer (see "
                      "--no-compile)", flag=True),
    "quantize": Option("quantize", "language models: decode with low-precision weights (a copy made when generation "
                       "starts; the run is unchanged): bf16, int8 (per output channel), int4 (blocks of 32, GGUF's "
                       "Q4_1; a GGUF run keeps its own blocks) or none (float32). Default auto: int4 for a GGUF run "
                       "of Q8_0/Q4_0/Q4_1 blocks on a CPU with AVX-512 VNNI, else none. Details: "
                       "docs/tutorials/checkpoints-and-serving.md",
                       str, "auto", choices=_quantize_choices()),
    "chat": Option("chat", "language models with a chat template (imported chat models such as SmolLM2-Instruct): "
                   "send --prompt as a user message through the template and print only the reply", flag=True),
    "beam_size": Option("beam_size", "translation and captioning runs: beam width, 1 = greedy (default: the run's "
                        "beam_size)", int),
}


# The help of the inputs several tasks share (a flag has one help text, whichever task declares it).
HELP = {
    "prompt": "language models: the text to continue (default: a newline); translation runs: the text to "
              "translate; question-answering runs: the question",
    "image": "image files (PNG, JPEG, ... or .npy) of the model's size (nothing is resized): captioning runs caption "
             "them, classifier runs print PATH, class index and probability per line",
    "audio": "audio classification runs: classify these audio files (WAV; OGG/FLAC with the soundfile package), read "
             "as mono and resampled to the model's rate; prints FILE, class index, class name and probability per line",
}


def as_paths(inputs) -> list:
    """File inputs of a verb as a list: one path, or any iterable of paths."""
    return [inputs] if isinstance(inputs, (str, Path)) else list(inputs)


class _VerbNames:
    """``Task.verbs``: the names of the task's verbs, in declaration order (on the class and on instances)."""

    def __get__(self, obj, cls) -> tuple[str, ...]:
        return tuple(cls.verb_methods())


class Task:
    """Base task adapter (no verbs). Subclasses set the class attributes and override what they support."""

    name = "model"  # for messages: "a language model run" (with its article: ``a_name``)
    columns: tuple[str, ...] = ()  # the tab-separated fields of each line `respond` prints (empty: free text)
    kind = "model"  # what `tokennet viz` and the report call the task (stable, used in old registries)
    families: tuple[str, ...] = ()  # the model families this task serves
    protocol: type | None = None  # what a model must offer (structural typing; see tokennet.tasks)
    inputs: tuple[Input, ...] = ()
    options: tuple[Option, ...] = ()
    viz_options: tuple[Option, ...] = ()  # `tokennet viz` flags beyond the common ones (index, patch, layer, ...)
    viz_uses: tuple[str, ...] | None = None  # the common `tokennet viz` flags its pictures read (None: every one)
    explorer: Callable | None = None  # `tokennet explore`: run → a viz.explore Explorer (its class); None: refused

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    verbs = _VerbNames()

    @classmethod
    def verb_methods(cls) -> dict[str, Callable]:
        """``name → method`` of every verb (methods marked :func:`verb`, inherited ones included)."""
        out = {}
        for klass in reversed(cls.__mro__):
            for name, method in vars(klass).items():
                if callable(method) and getattr(method, "__tokennet_verb__", False):
                    out[name] = method
        return out

    @property
    def a_name(self) -> str:
        """The task's name with its article, for messages: "a language model", "an image classification"."""
        return f"{'an' if self.name[:1].lower() in 'aeiou' else 'a'} {self.name}"

    def viz_takes(self, run: Run) -> set[str]:
        """The ``tokennet viz`` options this run's pictures read: ``viz_uses`` (None: all of :data:`VIZ_COMMON`)
        and the task's own ``viz_options``. ``tokennet viz`` refuses any other it is given, in one line."""
        common = VIZ_COMMON if self.viz_uses is None else self.viz_uses
        return set(common) | {option.name for option in self.viz_options}

    def declares(self, what: str) -> bool:
        """Whether this task overrides the base's ``what`` (``"draw"``, ``"panel"``, ``"respond"``, ...)."""
        return getattr(type(self), what) is not getattr(Task, what)

    def check(self, model) -> None:
        """Raise ``RunError`` unless the model offers what this task needs (its protocol)."""
        if self.protocol is not None and not isinstance(model, self.protocol):
            raise RunError(f"{type(model).__name__} does not implement {self.protocol.__name__}, "
                           f"which {self.a_name} task needs")

    # -- the command line ---------------------------------------------------------------------------
    def respond(self, run: Run, values: dict[str, Any]) -> Iterator[str]:
        """``tokennet generate``: the text to print for ``values`` (every declared input and option, defaults
        filled in). Yields pieces (a language model streams its tokens)."""
        raise RunError(f"{run.path} is {self.a_name} run: it has nothing to generate")

    # -- pictures and the report ----------------------------------------------------------------------
    def draw(self, run: Run, out_dir: Path, **options) -> list[Path]:
        """``tokennet viz``: write the task's pictures into ``out_dir``; return the files."""
        raise RunError(f"no pictures for {self.a_name} run")

    def panel(self, run: Run, log) -> list[tuple[str, str]]:
        """The report's task sections: ``[(heading, html), ...]`` (see :mod:`tokennet.viz.report`)."""
        return []

    # -- evaluation without a recipe (imported checkpoints) ------------------------------------------------
    def evaluate(self, run: Run, data: str | None) -> dict[str, Any]:
        raise RunError(f"{run.path}: tokennet eval has no evaluation for an imported {self.name}")

    def table_columns(self, run: Run) -> tuple[str, ...]:
        """The fields of each tab-separated line :meth:`respond` prints for ``run`` (``generate --help`` lists them,
        ``generate --json`` names them); empty where it prints free text. Default: :attr:`columns`."""
        return self.columns

    # -- held-out inputs, for people, tests and documentation ----------------------------------------------------
    def examples(self, run: Run, directory: Path, count: int = 1) -> list[Example]:
        """The first ``count`` held-out inputs of the run's data, written into ``directory`` as files a person can
        use (PNG, WAV, the JSON ``--graphs`` reads, text), each with its ``tokennet generate`` values and label.
        A task that overrides this has ``tokennet examples``; :func:`~tokennet.tasks.example_files.take` refuses
        a ``count`` beyond the held-out data."""
        raise RunError(f"{self.a_name} run has no held-out examples to write")

    def write_examples(self, run: Run, out_dir: str | Path, count: int | None = None) -> list[Example]:
        """``tokennet examples``: :meth:`examples` written into ``out_dir`` with its index ``examples.json``, all
        or nothing (see :mod:`tokennet.tasks.example_files`); returns the examples with their final paths.
        ``count``: exactly that many (refused where the held-out data has fewer); None: up to 3."""
        count = DEFAULT_COUNT if count is None else count
        check_request(out_dir, count)
        if not self.declares("examples"):
            raise RunError(f"{run.path} is {self.a_name} run: it has no held-out examples to write")
        if run.data is None:
            raise RunError(f"{run.path} has no held-out data of its own (an imported checkpoint or a bare model): "
                           "no examples to write")
        out = Path(out_dir)
        with removed_on_failure(missing_parents(out)), atomic_directory(out) as built:
            examples = [relocate(example, built, out) for example in self.examples(run, built, count)]
            if not examples:
                raise DataError(f"{run.path} holds no held-out examples to write")
            (built / INDEX_FILE).write_text(index_text(run, examples, out), encoding="utf-8")
        return examples

    def bad_inputs(self, run: Run, directory: Path) -> list[tuple[dict[str, Any], str]]:
        """Inputs that must fail in one line: ``(values, a fragment of the message)`` pairs."""
        return []


def register_task(cls: type[Task]) -> type[Task]:
    """Register a task class for each of its ``families`` (a class decorator); returns the class."""
    if not cls.families:
        raise ValueError(f"{cls.__name__} serves no model family (set families = (...))")
    task = cls()
    for family in cls.families:
        _register(family, task)
    return cls


_register(None, Task())  # the generic task (no verbs) of a family no task serves

# The `tokennet viz` options every task may read (a task names those its pictures use in ``viz_uses``).
VIZ_COMMON = ("index", "patch", "layer", "head", "data", "text", "image", "audio")


def image_file_bad_inputs(directory: Path, name: str = "image") -> list[tuple[dict[str, Any], str]]:
    """Bad image files every image input must refuse in one line: missing, empty, not an image."""
    directory = Path(directory)
    empty, text = directory / "empty.png", directory / "not-an-image.png"
    empty.write_bytes(b"")
    text.write_text("this is text, not an image\n" * 10)
    return [({name: [str(directory / "missing.png")]}, "missing.png"), ({name: [str(empty)]}, "empty.png"),
            ({name: [str(text)]}, "not-an-image.png")]


def check_values(task: Task, values: dict[str, Any]) -> None:
    """Refuse missing required inputs, in one line naming the flag."""
    for i in task.inputs:
        if i.required and values.get(i.name) in (None, [], ""):
            raise DataError(f"{task.a_name} run takes {i.flag}: pass {i.flag} ({i.help})")
