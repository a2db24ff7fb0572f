"""The tutorials do what they say: every ```bash block of docs/tutorials/*.md and README.md runs, with small budgets.

Each page runs top to bottom in a fresh directory (with ``examples/`` and ``bench/`` linked in), as a reader who
copies its blocks in order would, through ``tokennet.cli.main`` in this process. What changes is the size, never the
meaning:

- ``tokennet train``: ``--max-iters 2`` (4 with ``--resume``) instead of any step count or time budget; the
  recipe's own ``smoke`` settings (``Recipe.smoke``, what tests/recipes/test_every_recipe.py trains with) where the
  block does not choose them, and the smoke sizes (``SHRINK``, ``SHRINK_GIVEN``) even where it does; no evaluation
  during training. A recipe whose default data takes minutes to make (``SMOKE_DATA``: the spoken digits) trains on
  its smoke data, and so does a ``--data DIR`` of the reader's own that does not exist.
- ``tokennet generate``: ``--max-new-tokens`` 8 where the block gives it; ``tokennet eval``: ``--stride`` 8 (the small
  models' context is 16 tokens).
- A file a block names that does not exist is made: an input of a run (``--image``, ``--audio``, ``--graphs``,
  ``--sphere``, ``--input``) from the run's held-out example (``Task.examples``); a ``.txt`` file from a small
  corpus; a ``.jsonl`` file as a few chat records.

A block that needs what a test machine lacks is marked just above its fence with ``<!-- test: skip (REASON) -->``,
REASON one of ``REASONS``; there are at most ``MAX_SKIPS`` of them. Skipped or not, every ``tokennet`` command of
every block must parse (the fast test): its command and flags exist, and a ``train`` command's ``--set`` keys and
values are valid for its recipe (``--show-settings``).
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from support import setting_value

from tokennet.cli import build_parser, main
from tokennet.lifecycle import list_recipes
from tokennet.plugins import load_file

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs" / "tutorials").glob("*.md")) + [ROOT / "README.md"]

FENCE = re.compile(r"^```(\w*)\s*$")
SKIP = re.compile(r"<!--\s*test:\s*skip\s*\((.+?)\)\s*-->")
REASONS = {
    "needs a GPU",
    "needs several machines",
    "needs the network",  # a download (pip, a checkpoint)
    "needs a system package",  # Debian's Fashion-MNIST: bash scripts/install.sh system
    "a server that runs until stopped",
    "minutes of CPU",  # covered elsewhere by a faster test, which the marker's page names
}
MAX_SKIPS = 16
SHRINK = ("dim", "num_layers", "num_heads", "block_size", "batch_size", "vocab_size", "test_size", "val_size",
          "eval_iters", "sample_tokens", "read_layers")
INIT_SHRINK = ("batch_size", "block_size", "eval_iters", "sample_tokens")  # --init: no architecture settings
STEPS = {"eval_interval": 0, "warmup_iters": 1, "progress": False}
SHRINK_GIVEN = {"ablation_steps": 2}  # where a block sets them
SMOKE_DATA = {"audio"}
INPUT_FLAGS = {"--image": "image", "--audio": "audio", "--graphs": "graphs", "--sphere": "sphere", "--input": None}

pytestmark = pytest.mark.usefixtures("one_thread")


@dataclass
class Block:
    page: Path
    line: int
    text: str
    skip: str | None

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The page's ```bash blocks, each with the reason of the skip marker on the line above its fence, if any."""
    out, lines = [], page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        if fence.group(1) == "bash":
            above = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            marker = SKIP.search(above)
            out.append(Block(page, i + 1, "\n".join(lines[i + 1:end]), marker.group(1) if marker else None))
        i = end + 1
    return out


def commands(block: Block) -> list[list[str]]:
    """The block's commands as argument lists: continuation lines joined, comments dropped, ``&&`` split."""
    text = re.sub(r"\\\n", " ", block.text)
    out = []
    for line in text.splitlines():
        words = [w for w in shlex.split(line, comments=True) if w != "&"]  # a server in the background
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            out.append(words[:cut])
            words = words[cut + 1:]
    return out


def tokennet_args(words: list[str]) -> list[str] | None:
    """The arguments after ``tokennet`` (or ``torchrun ... -m tokennet``), or None for another program."""
    if words[:1] == ["tokennet"]:
        return words[1:]
    if words[:1] == ["torchrun"] and "tokennet" in words:
        return words[words.index("tokennet") + 1:]
    return None


ALL = [b for p in PAGES for b in blocks(p)]


def test_the_pages_have_blocks_and_few_skips():
    names = {p.name for p in PAGES}
    assert {"text.md", "images.md", "audio.md", "graphs.md", "sphere.md", "vqa.md", "multimodal.md", "plugins.md",
            "checkpoints-and-serving.md", "scale-out.md"} <= names, names
    skipped = [b for b in ALL if b.skip]
    assert len(skipped) <= MAX_SKIPS, "more skipped blocks than MAX_SKIPS:\n" + "\n".join(map(str, skipped))
    bad = [f"{b}: {b.skip!r}" for b in skipped if b.skip not in REASONS]
    assert not bad, f"skip reasons must be one of {sorted(REASONS)}:\n" + "\n".join(bad)
    for page in PAGES:
        if page.name != "README.md":
            assert blocks(page), f"{page.name} has no ```bash block"


# ------------------------------------------------------------------------------------------------ every block parses


def _parses(args: list[str]) -> str | None:
    """None if ``tokennet ARGS`` parses (and a train command's settings are valid), else why not."""
    if args[:1] == ["lm-eval"]:  # lm-eval parses its own arguments
        return None
    args = [str(ROOT / a) if prev == "--plugin" else a for prev, a in zip(["", *args], args)]
    for prev, a in zip(["", *args], args):
        if prev == "--plugin":
            load_file(a)
    try:
        parsed = build_parser().parse_args(args)
    except SystemExit:
        return "does not parse"
    if parsed.command == "train" and not parsed.show_settings:
        with contextlib.redirect_stdout(None):
            if main(["-q", *args, "--show-settings"]) != 0:
                return "settings refused"
    return None


def test_every_command_parses(capsys):
    bad = []
    for block in ALL:
        for words in commands(block):
            args = tokennet_args(words)
            if args is None or any("$" in a for a in args):
                continue
            why = _parses(args)
            if why:
                bad.append(f"{block}: tokennet {shlex.join(args)}: {why}: {capsys.readouterr().err.strip()}")
    assert not bad, "\n".join(bad)


def test_unskipped_blocks_run_only_tokennet():
    bad = [f"{b}: {shlex.join(w)}" for b in ALL if not b.skip for w in commands(b) if tokennet_args(w) is None
           or w[0] != "tokennet"]
    assert not bad, "a block this test runs may hold only tokennet commands (else mark it skip):\n" + "\n".join(bad)


# ------------------------------------------------------------------------------------------------------- rewriting


def _split_sets(args: list[str]) -> tuple[list[str], dict[str, str]]:
    """The arguments without their ``--set`` groups, and the settings those groups give."""
    rest, sets, i = [], {}, 0
    while i < len(args):
        if args[i] == "--set":
            i += 1
            while i < len(args) and not args[i].startswith("--"):
                key, _, value = args[i].partition("=")
                sets[key] = value
                i += 1
        else:
            rest.append(args[i])
            i += 1
    return rest, sets


def _drop(args: list[str], flag: str) -> list[str]:
    out = list(args)
    while flag in out:
        i = out.index(flag)
        del out[i:i + 2]
    return out


def small_train(args: list[str], workdir: Path) -> list[str]:
    """A train command with a tiny budget (see the module's docstring)."""
    head = args[:args.index("train") + 2]
    rest, sets = _split_sets(args[len(head):])
    recipe = next(r for r in list_recipes() if r.name == head[-1])
    rest = _drop(_drop(rest, "--time-budget"), "--max-iters")
    rest += ["--max-iters", "4" if "--resume" in rest else "2"]
    if "--resume" in rest:  # the run's settings are its own
        return head + rest
    if "--data" not in rest and recipe.name in SMOKE_DATA:
        rest += ["--data", recipe.smoke_data(workdir)]
    elif "--data" in rest and recipe.name in SMOKE_DATA:  # a directory of the reader's own: the smoke data
        j = rest.index("--data") + 1
        if not (workdir / rest[j]).exists():
            (workdir / "smoke").mkdir(exist_ok=True)
            shutil.move(recipe.smoke_data(workdir / "smoke"), workdir / rest[j])
    sets = {k: v for k, v in sets.items() if k not in ("max_iters", "time_budget")}
    shrink = INIT_SHRINK if "--init" in rest else SHRINK
    merged = {**({} if "--init" in rest else recipe.smoke), **sets, **STEPS}
    merged.update({k: recipe.smoke[k] for k in shrink if k in recipe.smoke})
    merged.update({k: v for k, v in SHRINK_GIVEN.items() if k in sets})
    if "--init" in rest:  # the settings of these the recipe has (a vit has no block_size)
        merged.update({k: v for k, v in {"batch_size": 2, "block_size": 16}.items() if k in recipe.defaults()})
    if recipe.unused is not None:
        unused = recipe.unused({**recipe.defaults(), **merged})
        merged = {k: v for k, v in merged.items() if k not in unused or k in sets}
    return head + rest + ["--set", *(f"{k}={setting_value(v)}" for k, v in merged.items())]


CORPUS = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(300))
CHATS = [{"messages": [{"role": "user", "content": f"what is {i} plus {i}?"},
                       {"role": "assistant", "content": f"{i} plus {i} is {2 * i}."}]} for i in range(20)]


def _copy_example(src: Path, dest: Path) -> None:
    """A held-out example file as ``dest``: copied, or a ``.npy`` image saved as the image file ``dest`` names."""
    if src.suffix == dest.suffix or dest.suffix == ".npy":
        shutil.copyfile(src, dest)
        return
    from PIL import Image

    x = np.load(src) if src.suffix == ".npy" else np.asarray(Image.open(src))
    if src.suffix == ".npy":
        x = np.clip(np.moveaxis(x, 0, -1) * 255, 0, 255).astype(np.uint8).squeeze()
    Image.fromarray(x).save(dest)


def make_missing_files(args: list[str], workdir: Path) -> None:
    """Make the files a command names that do not exist (see the module's docstring)."""
    for prev, a in zip(["", *args], args):
        path = workdir / a
        if path.exists() or a.startswith("-"):
            continue
        if prev == "--data" and path.suffix == ".txt":
            path.write_text(CORPUS)
        elif prev == "--data" and path.suffix == ".jsonl":
            path.write_text("".join(json.dumps(c) + "\n" for c in CHATS))
    flag = None
    for a in args:
        if a.startswith("--"):
            flag = a
            continue
        if flag not in INPUT_FLAGS or (workdir / a).exists():
            continue
        import tokennet

        run_dir = next(x for x in args[1:] if not x.startswith("-"))
        run = tokennet.load(workdir / run_dir)
        (workdir / "examples-held-out").mkdir(exist_ok=True)
        given = run.task.examples(run, workdir / "examples-held-out")
        key = INPUT_FLAGS[flag] or next(iter(given))
        value = given.get(key) or given[next(iter(given))]
        value = value[0] if isinstance(value, list) else value
        (workdir / a).parent.mkdir(parents=True, exist_ok=True)
        _copy_example(Path(value), workdir / a)


def small(args: list[str], workdir: Path) -> list[str]:
    """The command as this test runs it."""
    i = 0
    while i < len(args) and args[i].startswith("-"):  # -q, --plugin FILE before the command
        i += 2 if args[i] == "--plugin" else 1
    command = args[i] if i < len(args) else None
    if command == "train":
        args = small_train(args, workdir)
    for flag, value in (("--max-new-tokens", "8"), ("--stride", "8")):  # generate; eval (a context of 16)
        if command in ("generate", "eval") and flag in args:
            j = args.index(flag)
            args = args[:j + 1] + [value] + args[j + 2:]
    make_missing_files(args[i:], workdir)
    return args


# ------------------------------------------------------------------------------------------------------ the runs


@pytest.mark.slow  # a few minutes in all on 2 cores: test_every_command_parses is the fast check of every block
@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_page_runs(page, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for name in ("examples", "bench"):
        (tmp_path / name).symlink_to(ROOT / name)
    for block in blocks(page):
        if block.skip:
            continue
        for words in commands(block):
            args = small(tokennet_args(words), tmp_path)
            rc = main(args)
            out = capsys.readouterr()
            assert rc == 0, f"{block}: tokennet {shlex.join(args)} exited {rc}:\n{out.err[-2000:]}"
