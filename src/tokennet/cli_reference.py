"""The CLI reference, ``docs/cli.md``, written from the parser that ``tokennet`` itself runs, so it cannot drift.

``python -m tokennet.cli_reference > docs/cli.md`` writes it; ``python -m tokennet.cli_reference --check`` exits 1
when ``docs/cli.md`` differs from what the parser says today (``tests/test_cli_reference.py`` does the same).

Every parser of :func:`tokennet.cli.build_parser` is walked, subcommands within subcommands included, and each gets
its usage, its description and a table of its options (flags, default, help). The text is formatted here, not by
argparse's help formatter, so it depends neither on the terminal's width (``COLUMNS``) nor on the Python version's
usage layout; a default is printed as the parser holds it, and the home directory as ``~``. The flags that
``generate`` and ``viz`` take come from the registered tasks: the reference is of tokennet's own tasks, and a run
with installed plugins says so on stderr.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from .cli import build_parser
from .plugins import loaded

__all__ = ["Command", "commands", "render", "main", "REGENERATE", "DEFAULT_PATH"]

REGENERATE = "PYTHONPATH=src python -m tokennet.cli_reference > docs/cli.md"
DEFAULT_PATH = Path("docs") / "cli.md"
USAGE_WIDTH = 100


@dataclass(frozen=True)
class Command:
    """One parser of the command line: ``path`` is the words that reach it (``("tokennet", "train")``)."""

    path: tuple[str, ...]
    parser: argparse.ArgumentParser
    summary: str  # the one-line help its parent lists it with ("" for the root)


def commands(parser: argparse.ArgumentParser | None = None) -> list[Command]:
    """Every parser under ``parser`` (default: tokennet's), depth first, in the order the parser lists them."""
    root = parser if parser is not None else build_parser()
    found = [Command((root.prog,), root, "")]
    _walk(found[0], found)
    return found


def _walk(command: Command, found: list[Command]) -> None:
    for action in command.parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
        for name, child in action.choices.items():
            entry = Command(command.path + (name,), child, helps.get(name, ""))
            found.append(entry)
            _walk(entry, found)


# -- one parser's usage, options and subcommands ---------------------------------------------------------------
def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        name = action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    elif action.choices is not None:
        name = "{" + ",".join(str(choice) for choice in action.choices) + "}"
    else:
        name = action.dest if not action.option_strings else action.dest.upper()
    if action.nargs is None:
        return name
    if action.nargs == "?":
        return f"[{name}]"
    if action.nargs == "*":
        return f"[{name} ...]"
    if action.nargs == "+":
        return f"{name} [{name} ...]"
    if action.nargs in (argparse.REMAINDER, argparse.PARSER):
        return f"{name} ..."
    return " ".join([name] * int(action.nargs)) if action.nargs else ""


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


def _usage_item(action: argparse.Action) -> str:
    if not action.option_strings:
        return _metavar(action)
    flag = action.option_strings[0]
    return f"{flag} {_metavar(action)}" if _takes_value(action) else flag


def _usage_items(parser: argparse.ArgumentParser) -> list[str]:
    """Optionals first (a mutually exclusive group as ``[--a | --b]``), then positionals, as argparse orders them."""
    shown = [action for action in parser._actions if action.help != argparse.SUPPRESS]
    grouped = {id(action): group for group in parser._mutually_exclusive_groups for action in group._group_actions}
    items, done = [], set()
    for action in (action for action in shown if action.option_strings):
        group = grouped.get(id(action))
        if group is None:
            items.append(_usage_item(action) if action.required else f"[{_usage_item(action)}]")
        elif id(group) not in done:
            done.add(id(group))
            inner = " | ".join(_usage_item(member) for member in group._group_actions)
            items.append(f"({inner})" if group.required else f"[{inner}]")
    return items + [_usage_item(action) for action in shown if not action.option_strings]


def _usage(command: Command) -> str:
    """``usage`` wrapped at USAGE_WIDTH, continuation lines indented under the first argument."""
    head = " ".join(command.path)
    lines, line = [], head
    for item in _usage_items(command.parser):
        if len(line) + 1 + len(item) > USAGE_WIDTH and line.strip() != head:
            lines.append(line)
            line = " " * len(head)
        line += " " + item
    return "\n".join(lines + [line])


def _cell(text: str) -> str:
    """Text fit for a Markdown table cell: one line, pipes escaped, the home directory as ``~``."""
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text.replace(str(Path.home()), "~")


def _values_as_code(text: str) -> str:
    """Decimal numbers and percentages in help and descriptions as code: they are settings' values, not measured
    figures (the docs' figures check, tests/test_figures_traced.py, does not read cli.py's help texts either)."""
    return re.sub(r"(?<![\w.`§-])(\d+\.\d+%?|\d+%)(?![\w`]|\.\d)", r"`\1`", text)


def _default(action: argparse.Action) -> str:
    if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
        return ""
    nothing = action.default is None or action.default is False or action.default == []
    if nothing or action.default == argparse.SUPPRESS or action.required:
        return ""
    return f"`{_cell(action.default)}`"


def _help(action: argparse.Action, prog: str) -> str:
    text = action.help or ""
    if "%" in text:  # argparse's own interpolation: %(default)s, %(prog)s, ...
        values = {name: value for name, value in vars(action).items() if value is not argparse.SUPPRESS}
        text = text % dict(values, prog=prog)
    if action.choices is not None and action.option_strings and action.metavar is not None:
        text += f" (one of: {', '.join(str(choice) for choice in action.choices)})"
    return _values_as_code(_cell(text))


def _options_table(command: Command) -> list[str]:
    shown = [action for action in command.parser._actions
             if action.help != argparse.SUPPRESS and not isinstance(action, argparse._SubParsersAction)]
    if not shown:
        return []
    rows = ["| argument | default | help |", "|---|---|---|"]
    for action in shown:
        names = ", ".join(action.option_strings) or action.dest
        value = f" {_metavar(action)}" if _takes_value(action) and action.option_strings else ""
        if not action.option_strings:
            names = _metavar(action)
        rows.append(f"| `{_cell(names + value)}` | {_default(action)} | {_help(action, command.parser.prog)} |")
    return rows + [""]


def _subcommand_table(command: Command, children: list[Command]) -> list[str]:
    if not children:
        return []
    rows = ["| command | what it does |", "|---|---|"]
    rows += [f"| [`{' '.join(child.path)}`](#{_anchor(child)}) | {_cell(child.summary)} |" for child in children]
    return rows + [""]


def _anchor(command: Command) -> str:
    """The anchor GitHub gives the command's heading (lower case, spaces as hyphens, other punctuation dropped)."""
    text = " ".join(command.path).lower()
    return "".join(char for char in text.replace(" ", "-") if char.isalnum() or char in "-_")


def _section(command: Command, children: list[Command]) -> list[str]:
    level = "#" * min(len(command.path) + 1, 6)
    lines = [f"{level} {' '.join(command.path)}", ""]
    if command.summary:
        lines += [f"*{_cell(command.summary)}*", ""]
    lines += ["```text", _usage(command), "```", ""]
    if command.parser.description:
        lines += [_values_as_code(" ".join(command.parser.description.split()).replace(str(Path.home()), "~")), ""]
    lines += _subcommand_table(command, children) + _options_table(command)
    if command.parser.epilog:
        lines += ["```text", command.parser.epilog.strip("\n").replace(str(Path.home()), "~"), "```", ""]
    return lines


def render(parser: argparse.ArgumentParser | None = None) -> str:
    """The whole reference as Markdown: a heading per command, each command's subcommands listed under it."""
    every = commands(parser)
    lines = [
        "# Command-line reference",
        "",
        f"<!-- Generated from the parser in src/tokennet/cli.py; do not edit by hand. Regenerate: {REGENERATE} -->",
        "",
        "Every command and option of `tokennet`, written from the parser the command runs (`tokennet.cli`), with "
        "tokennet's own tasks registered. `tokennet COMMAND --help` prints the same text in the terminal. "
        "A default left blank is none (the option is off, or the help says how it is chosen).",
        "",
    ]
    for command in every:
        depth = len(command.path)
        children = [other for other in every if other.path[:depth] == command.path and len(other.path) == depth + 1]
        lines += _section(command, children)
    return "\n".join(lines).rstrip("\n") + "\n"


def check(path: Path) -> list[str]:
    """The unified diff between ``path`` and the reference generated now (empty when they agree)."""
    current = path.read_text(encoding="utf-8") if path.is_file() else ""
    return list(difflib.unified_diff(current.splitlines(), render().splitlines(), str(path), "generated", lineterm=""))


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(prog="python -m tokennet.cli_reference", description=__doc__.split("\n")[0])
    cli.add_argument("--check", nargs="?", const=str(DEFAULT_PATH), metavar="PATH",
                     help=f"exit 1 if PATH (default {DEFAULT_PATH}) differs from the generated reference")
    args = cli.parse_args(argv)
    if args.check is None:
        sys.stdout.write(render())
    else:
        diff = check(Path(args.check))
        if diff:
            print("\n".join(diff[:60]), file=sys.stderr)
            print(f"{args.check} is out of date; regenerate it: {REGENERATE}", file=sys.stderr)
            return 1
    if loaded():
        print(f"note: installed plugins added their tasks' flags: {', '.join(loaded())}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
