"""The tutorials do what they say: every ```bash block of docs/tutorials/*.md and README.md runs, with small budgets.

Each page runs top to bottom in a new, empty directory, as a reader who copies its blocks in order into a shell at
the root of a fresh clone would: the clone's ``examples/``, ``bench/``, ``docs/`` and ``README.md`` are linked in
(the pages name them), and nothing else is there. ``tokennet`` commands run through ``tokennet.cli.main`` in this
process; every other line (a heredoc, ``python -c``, ``mkdir``, a ``for`` loop) runs with bash, consecutive lines
together. Every file a command reads is made by an earlier command of the page (``tokennet examples`` writes the
runs' inputs): the test makes none. What changes is the size, never the meaning:

- ``tokennet train``: ``--max-iters 2`` (4 with ``--resume``) instead of any step count or time budget; the
  recipe's own ``smoke`` settings (``Recipe.smoke``, what tests/recipes/test_every_recipe.py trains with) where the
  block does not choose them, and the smoke sizes (``SHRINK``, ``SHRINK_GIVEN``) even where it does; no evaluation
  during training. A recipe whose default data takes minutes to make (``SMOKE_DATA``: the spoken digits) trains on
  its smoke data when the block gives no ``--data``.
- ``tokennet generate``: ``--max-new-tokens`` 8 where the block gives it; ``tokennet eval``: ``--stride`` 8 (the small
  models' context is 16 tokens).

A block that needs what a test machine lacks is marked just above its fence with ``<!-- test: skip (REASON) -->``,
REASON one of ``REASONS``; there are at most ``MAX_SKIPS`` of them. A shell line that calls a program this machine
lacks (``OPTIONAL_PROGRAMS``: espeak-ng) skips the rest of its page, saying so. Skipped or not, every ``tokennet``
command of every block must parse (the fast test): its command and flags exist, and a ``train`` command's ``--set``
keys and values are valid for its recipe (``--show-settings``); and the shell lines of the blocks that run call only
``SHELL_PROGRAMS``, which make files and fetch nothing.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

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
CLONE = ("examples", "bench", "docs", "README.md")  # the clone's files a page names, linked into its directory
SHELL_PROGRAMS = {"cat", "mkdir", "python", "for", "done", "espeak-ng", "cp", "echo", "printf"}
OPTIONAL_PROGRAMS = {"espeak-ng"}  # installed by scripts/install.sh system where the machine allows it
HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")

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


@dataclass
class Step:
    """One step of a block: a command's words (``tokennet ...``, or another program's on a skipped block's line), or
    ``shell``: lines bash runs together (a heredoc, a loop, ``python -c``)."""

    words: list[str] | None = None
    shell: str | None = None


def _words(line: str) -> list[str] | None:
    try:
        return [w for w in shlex.split(line, comments=True) if w != "&"]  # "&": a server in the background
    except ValueError:  # an unbalanced quote: shell syntax this reader does not split (a loop's body, say)
        return None


def steps(block: Block) -> list[Step]:
    """The block's steps in order: continuation lines joined, comments dropped, ``&&`` split; a line that is not a
    command of ``tokennet`` (or ``torchrun``, ``pip``, ``lm-eval``: programs of skipped blocks) is shell, with the
    lines after it up to the next command, and a heredoc's body up to its terminator."""
    out, shell, lines = [], [], re.sub(r"\\\n", " ", block.text).splitlines()
    i = 0
    while i < len(lines):
        line, i = lines[i], i + 1
        heredoc = HEREDOC.search(line)
        words = None if heredoc else _words(line)
        if heredoc or words is None or (words and words[0] not in ("tokennet", "torchrun", "pip", "lm-eval")):
            shell.append(line)
            while heredoc and i < len(lines):
                shell.append(lines[i])
                i += 1
                if shell[-1].strip() == heredoc.group(2):
                    break
            continue
        if shell:
            out.append(Step(shell="\n".join(shell)))
            shell = []
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            out.append(Step(words=words[:cut]))
            words = words[cut + 1:]
    if shell:
        out.append(Step(shell="\n".join(shell)))
    return out


def commands(block: Block) -> list[list[str]]:
    """The block's commands (not its shell lines) as argument lists."""
    return [step.words for step in steps(block) if step.words is not None]


def shell_programs(text: str) -> list[str]:
    """The first word of each line of shell text, heredoc bodies left out."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        words = lines[i].split()
        if words and not words[0].startswith("#"):
            out.append(words[0])
        heredoc = HEREDOC.search(lines[i])
        i += 1
        while heredoc and i < len(lines) and lines[i - 1].strip() != heredoc.group(2):
            i += 1
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


def test_unskipped_blocks_run_tokennet_and_make_files():
    bad = [f"{b}: {shlex.join(w)}" for b in ALL if not b.skip for w in commands(b) if w[0] != "tokennet"]
    bad += [f"{b}: {program}" for b in ALL if not b.skip for step in steps(b) if step.shell
            for program in shell_programs(step.shell) if program not in SHELL_PROGRAMS]
    assert not bad, ("a block this test runs may hold tokennet commands and shell lines that make files "
                     f"({sorted(SHELL_PROGRAMS)}; else mark it skip):\n" + "\n".join(bad))


def test_steps_keep_heredocs_and_loops_whole():
    text = ("tokennet train vit\ncat > a.txt <<'EOF'\ntokennet is not run here\nit's text\nEOF\n"
            "for w in a b; do\n  mkdir -p d/$w\ndone\ntokennet examples runs/vit --out e && tokennet list")
    block = Block(ROOT / "x.md", 1, text, None)
    found = steps(block)
    assert [s.words for s in found if s.words] == [["tokennet", "train", "vit"],
                                                    ["tokennet", "examples", "runs/vit", "--out", "e"],
                                                    ["tokennet", "list"]]
    assert [s.shell for s in found if s.shell] == ["cat > a.txt <<'EOF'\ntokennet is not run here\nit's text\nEOF\n"
                                                   "for w in a b; do\n  mkdir -p d/$w\ndone"]
    assert shell_programs(found[1].shell) == ["cat", "for", "mkdir", "done"]


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
    if "--data" not in rest and recipe.name in SMOKE_DATA:  # the default data takes minutes to make
        (workdir / ".smoke").mkdir(exist_ok=True)
        rest += ["--data", recipe.smoke_data(workdir / ".smoke")]
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
    return args


# ------------------------------------------------------------------------------------------------------ the runs


def run_shell(block: Block, text: str, workdir: Path) -> None:
    """Shell lines of a block, with bash in the page's directory (``python`` is this test's interpreter)."""
    missing = [p for p in shell_programs(text) + text.split() if p in OPTIONAL_PROGRAMS and shutil.which(p) is None]
    if missing:
        pytest.skip(f"{block}: needs {missing[0]}, which this machine lacks (bash scripts/install.sh system)")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", text], cwd=workdir, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, f"{block}: bash exited {done.returncode}:\n{text}\n{done.stderr[-2000:]}"


@pytest.mark.slow  # a few minutes in all on 2 cores: test_every_command_parses is the fast check of every block
@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_page_runs(page, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for name in CLONE:
        (tmp_path / name).symlink_to(ROOT / name)
    for block in blocks(page):
        if block.skip:
            continue
        for step in steps(block):
            if step.shell is not None:
                run_shell(block, step.shell, tmp_path)
                continue
            args = small(tokennet_args(step.words), tmp_path)
            rc = main(args)
            out = capsys.readouterr()
            assert rc == 0, f"{block}: tokennet {shlex.join(args)} exited {rc}:\n{out.err[-2000:]}"
