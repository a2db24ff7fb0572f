"""The Python API page, ``docs/python-api.md``, written from ``tokennet.__all__`` so it cannot drift.

``python -m tokennet.api_reference > docs/python-api.md`` writes it; ``python -m tokennet.api_reference --check``
exits 1 when ``docs/python-api.md`` differs (``tests/test_python_api_doc.py`` does the same, and runs the page's
Python examples).

Each name ``tokennet`` exports is put in a group by the package that defines it (tokens, attention, positions,
models, training, decoding, interop, serving; the rest last) and printed with its signature and the first line of
its docstring. Each group then names what its packages export one level down (their ``__all__``), and the page
ends with the README's worked examples ("As a library"), each a block that runs on its own in a few seconds.
Signatures are formatted here (annotations as written, defaults by ``repr`` without memory addresses or the home
directory), so the text is the same on every machine.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import tokennet

__all__ = ["Group", "GROUPS", "group_of", "render", "check", "main", "REGENERATE", "DEFAULT_PATH"]

REGENERATE = "PYTHONPATH=src python -m tokennet.api_reference > docs/python-api.md"
DEFAULT_PATH = Path("docs") / "python-api.md"
SIGNATURE_WIDTH = 100


@dataclass(frozen=True)
class Group:
    """A section of the page: the top-level names defined in ``packages``, then what those packages export."""

    title: str
    intro: str
    packages: tuple[str, ...]


GROUPS = (
    Group("tokens", "Modality → tokens: text tokenizers (characters, byte-level BPE), image patches, audio, "
          "graphs.", ("tokennet.tokens",)),
    Group("attention", "The attention formula, its masks (True = may attend), scores, kernels and the one "
          "multi-head layer for self- and cross-attention.", ("tokennet.attention",)),
    Group("positions", "Positional encodings, one module each: sinusoidal, learned, 2-D Fourier, spherical "
          "harmonics, Laplacian, RoPE, ALiBi.", ("tokennet.position",)),
    Group("models", "Models by name from a registry of families and presets, saved models, and run directories "
          "(`tokennet.load`).", ("tokennet.models", "tokennet.run")),
    Group("training", "The trainer, its optimizers and schedules, crash-safe checkpoints, distributed "
          "training.", ("tokennet.train",)),
    Group("decoding", "Sampling over a KV cache, beam search, speculative decoding.",
          ("tokennet.sampling", "tokennet.decode", "tokennet.speculative")),
    Group("interop", "Foreign checkpoints in (Hugging Face, GGUF) and starting weights for fine-tuning.",
          ("tokennet.interop",)),
    Group("serving", "The continuous-batching engine behind `tokennet serve` and `Run.generate` on a list.",
          ("tokennet.serve",)),
)
OTHER = Group("errors and version", "The base of every expected error, and the package's version.", ())

EXAMPLES = '''\
## Worked examples

From the README's "As a library". Each block runs on its own (`tests/test_python_api_doc.py` runs them).

Attention is a function of queries, keys, values and a boolean mask; the weights come back when asked for:

```python
import torch
from tokennet.attention import attention, causal, MultiHeadAttention

q = k = v = torch.randn(1, 8, 128, 64)                            # (B, H, N, E)
out = attention(q, k, v, causal(128))                             # fused kernel ("sdpa")
out, A = attention(q, k, v, causal(128), return_weights=True)     # the formula, A = softmax(QKᵀ/√E)
assert torch.allclose(A.sum(-1), torch.ones(1, 8, 128))           # every row of A sums to 1
assert A[0, 0, 0, 1:].abs().max() == 0                            # the first token sees only itself

mha = MultiHeadAttention(dim=64, num_heads=4)                     # one class for self- and cross-attention
y = mha(torch.randn(2, 10, 64), is_causal=True)                   # (B, N, D) -> (B, N, D)
assert y.shape == (2, 10, 64)
```

A model by name, decoded over a KV cache, and its attention maps as returned data:

```python
import torch
from tokennet.models import create_model
from tokennet.sampling import generate

gpt = create_model("gpt-mini", vocab_size=65)
ids = generate(gpt, torch.zeros(1, 1, dtype=torch.long), 50, temperature=0)  # KV-cached decoding
maps = gpt.attention_maps(ids[:, :16])["self"]                   # every layer's A, (B, H, T, T)
assert ids.shape == (1, 51) and maps[0].shape[-2:] == (16, 16)
```

A run directory loaded as a `Run` (here a bare saved model and its tokenizer; `tokennet train` writes the same
files and more), whose verbs are its task's:

```python
import tempfile
import tokennet
from tokennet.models import create_model, save_pretrained
from tokennet.run import save_tokenizer
from tokennet.tokens import train_tokenizer

tokenizer = train_tokenizer("char", "the quick brown fox jumps over the lazy dog")
with tempfile.TemporaryDirectory() as run_dir:
    save_pretrained(create_model("gpt-mini", vocab_size=tokenizer.vocab_size, num_layers=2), run_dir)
    save_tokenizer(run_dir, tokenizer)
    run = tokennet.load(run_dir)                                  # model, tokenizer, settings, metrics, task
    text = run.generate("the ", 20, temperature=0)                # an untrained model: 20 characters of noise
    texts = run.generate(["the ", "a quick", "lazy"], 10, temperature=0)  # batched by the serving engine
    shown = run.generate("the ", 20, temperature=0, include_prompt=True)   # what `tokennet generate` prints
assert "generate" in run.verbs and isinstance(text, str) and len(texts) == 3   # run.verbs: what its task does
assert shown == "the " + text
```

What `tokennet generate RUN` prints is what a verb returns, for the same run, options and seed (the command adds
the formatting: tabs, newlines, file names):

| task | `tokennet generate` prints | the verb |
|---|---|---|
| language model | `--prompt P`: the prompt, its continuation, a newline (`--chat`: the reply alone) | `run.generate(P, n, include_prompt=True)`; without `include_prompt` (the default) the continuation alone |
| translation | the translation of `--prompt` | `run.translate(text)` |
| captioning | a caption per `--image` | `run.caption(paths)` |
| image, sphere classification | `PATH`, class, probability per file | `run.classify(paths)`: `(class, probability)` per file |
| audio classification | `FILE`, class, class name, probability per file | `run.classify(paths)`; the names: `run.task.label_names(run)` |
| graph prediction | a classifier: graph, class, probability; a regression: graph, its values | `run.classify(graphs)`; `run.predict(graphs)` returns more: the raw outputs (a classifier's logits, a regression's values) |
| visual question answering | the answer per `--image` | `run.answer(paths, question)` |
| multimodal | each input answered by its task, as above | the same verbs on the multimodal run: `run.generate`, `run.classify(inputs)` (the head by the inputs' kind), `run.predict(graphs)` (the graph head's raw outputs) |
'''


def group_of(obj: object) -> Group:
    """The group of the package that defines ``obj`` (a module: the module itself); OTHER for the rest."""
    module = obj.__name__ if inspect.ismodule(obj) else getattr(obj, "__module__", None) or ""
    for group in GROUPS:
        if any(module == package or module.startswith(package + ".") for package in group.packages):
            return group
    return OTHER


# -- one name: its signature and summary ----------------------------------------------------------------------
class _Raw:
    """Text that ``inspect`` prints as it is (an annotation kept as written, a default's cleaned repr)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _clean(text: str) -> str:
    """``repr`` text without what differs between processes and machines."""
    text = re.sub(r" at 0x[0-9a-fA-F]+", "", text)
    return text.replace(str(Path.home()), "~")


def _plain(annotation: object) -> object:
    if annotation is inspect.Parameter.empty:
        return annotation
    return _Raw(annotation if isinstance(annotation, str) else inspect.formatannotation(annotation))


def _default(param: inspect.Parameter) -> object:
    return param.default if param.default is param.empty else _Raw(_clean(repr(param.default)))


def signature(obj: object) -> str:
    """``(params) -> returns`` with annotations unquoted; one parameter a line when longer than the page."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"
    params = [param.replace(annotation=_plain(param.annotation), default=_default(param))
              for param in sig.parameters.values()]
    sig = sig.replace(parameters=params, return_annotation=_plain(sig.return_annotation))
    text = str(sig)
    if len(text) <= SIGNATURE_WIDTH or not params:
        return text
    inner = str(sig.replace(return_annotation=inspect.Signature.empty))[1:-1]
    tail = text[len(inner) + 2:]  # " -> returns", or nothing
    return "(\n" + "".join(f"    {part},\n" for part in _split_params(inner)) + ")" + tail


def _split_params(inner: str) -> list[str]:
    """Split ``a: int, b: dict[str, int] = {}, *, c=(1, 2)`` at the commas outside brackets and quotes."""
    parts, depth, quote, start = [], 0, "", 0
    for index, char in enumerate(inner):
        if quote:
            quote = "" if char == quote and inner[index - 1] != "\\" else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(inner[start:index].strip())
            start = index + 1
    return parts + [inner[start:].strip()]


def summary(obj: object) -> str:
    """The first line of the object's own docstring ("" for a constant: its type's docstring is not its own)."""
    if not (inspect.ismodule(obj) or inspect.isclass(obj) or callable(obj)):
        return ""
    doc = (inspect.getdoc(obj) or "").strip()
    first = doc.splitlines()[0].strip() if doc else ""
    first = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", first)  # Sphinx roles (:class:`Run`) as code
    return first.replace("``", "`")


def _kind(obj: object) -> str:
    if inspect.ismodule(obj):
        return "module"
    if inspect.isclass(obj):
        return "class"
    return "function" if callable(obj) else f"constant ({type(obj).__name__})"


def _entry(name: str, obj: object) -> list[str]:
    lines = [f"### `tokennet.{name}`", "", f"*{_kind(obj)}*" + (f" — {summary(obj)}" if summary(obj) else ""), ""]
    if inspect.ismodule(obj):
        lines += [f"The package `{obj.__name__}` itself: what it exports is listed under this group.", ""]
    elif inspect.isclass(obj) and signature(obj) == "(...)":  # a signature inspect cannot read (an exception's)
        bases = ", ".join(base.__name__ for base in obj.__bases__)
        lines += ["```text", f"class {name}({bases})", "```", ""]
    elif inspect.isclass(obj) or callable(obj):
        lines += ["```text", f"{name}{signature(obj)}", "```", ""]
    else:
        lines += ["```text", f"{name} = {_clean(repr(obj))}", "```", ""]
    return lines


# -- the page -------------------------------------------------------------------------------------------------
def _one_level_down(group: Group, shown: set[str]) -> list[str]:
    lines = []
    for package in group.packages:
        exported = [name for name in getattr(importlib.import_module(package), "__all__", []) if name not in shown]
        if exported:
            lines += [f"More in `{package}` (its `__all__`): " + ", ".join(f"`{name}`" for name in exported) + ".",
                      ""]
    return lines


def _group_section(group: Group, names: list[str]) -> list[str]:
    lines = [f"## {group.title}", "", group.intro, ""]
    if group.packages and not names:
        lines += ["Nothing at the top level of `tokennet`: import it from its package.", ""]
    for name in names:
        lines += _entry(name, getattr(tokennet, name))
    shown = {name for name in names if not inspect.ismodule(getattr(tokennet, name))}
    return lines + _one_level_down(group, shown)


def render() -> str:
    """The whole page as Markdown: the exports of ``tokennet`` by group, then the worked examples."""
    by_group: dict[str, list[str]] = {}
    for name in tokennet.__all__:
        by_group.setdefault(group_of(getattr(tokennet, name)).title, []).append(name)
    lines = [
        "# Python API",
        "",
        f"<!-- Generated from tokennet.__all__ by src/tokennet/api_reference.py; do not edit by hand. "
        f"Regenerate: {REGENERATE} -->",
        "",
        "What `import tokennet` gives (`tokennet.__all__`, imported lazily on first use), grouped by the package "
        "that defines each name, with its signature and the first line of its docstring; under each group, what "
        "its packages export one level down. `help(tokennet.NAME)` has the whole docstring. The command line is "
        "in [cli.md](cli.md).",
        "",
    ]
    for group in GROUPS + (OTHER,):
        if group.packages or by_group.get(group.title):
            lines += _group_section(group, by_group.get(group.title, []))
    return "\n".join(lines) + "\n" + EXAMPLES


def check(path: Path) -> bool:
    """Whether ``path`` holds exactly the page generated now."""
    return path.is_file() and path.read_text(encoding="utf-8") == render()


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(prog="python -m tokennet.api_reference", description=__doc__.split("\n")[0])
    cli.add_argument("--check", nargs="?", const=str(DEFAULT_PATH), metavar="PATH",
                     help=f"exit 1 if PATH (default {DEFAULT_PATH}) differs from the generated page")
    args = cli.parse_args(argv)
    if args.check is None:
        sys.stdout.write(render())
        return 0
    if not check(Path(args.check)):
        print(f"{args.check} is out of date; regenerate it: {REGENERATE}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
