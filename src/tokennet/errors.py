"""One family of expected errors: what a user can cause and fix, as opposed to a bug.

Every error tokennet raises on purpose derives from :class:`TokennetError`; the CLI prints those as one
line (``tokennet: error: ...``) and exits with status 2, and lets anything else — a bug — show its
traceback. Each subclass also derives from the built-in exception it refines (``ValueError``,
``RuntimeError``), so ``except ValueError`` keeps working for library users. Messages say what is wrong
and how to fix it in library terms; they do not name CLI flags.
"""

from __future__ import annotations

__all__ = ["TokennetError", "ConfigError", "DataError", "RecipeError", "RunError", "TrainingStopped", "one_line",
           "did_you_mean", "unknown_name"]


class TokennetError(Exception):
    """Base of every expected tokennet error."""


class ConfigError(TokennetError, ValueError):
    """A model config or setting with an invalid value (the message names the field and the fix)."""


class DataError(TokennetError, ValueError):
    """Input data that cannot be used, with a message that names the file and the problem."""


class RecipeError(TokennetError, ValueError):
    """A recipe cannot run as asked (bad settings, output directory in the way, ...)."""


class RunError(TokennetError, ValueError):
    """A run directory that is missing, damaged, locked by another writer, or asked for a verb its task lacks."""


class TrainingStopped(TokennetError, RuntimeError):
    """Training ended early for a reason the user must see (e.g. the loss became NaN)."""


def one_line(message: object) -> str:
    """A message on one line, as the CLI prints errors (a parser's or the Rust tokenizer engine's messages can
    span several); an exception with no message gives its type's name."""
    return " ".join(str(message).split()) or (type(message).__name__ if isinstance(message, BaseException) else "")


def did_you_mean(word: str, choices) -> str:
    """``"did you mean 'gpt'?"`` — the names of ``choices`` closest to ``word`` by edit distance (difflib's ratio,
    at least 0.6, and within 0.05 of the closest: up to three, closest first); ``""`` when none is close."""
    import difflib

    names = [str(choice) for choice in choices]
    close = difflib.get_close_matches(word, names, n=3, cutoff=0.6)
    best = difflib.SequenceMatcher(None, word, close[0]).ratio() if close else 0.0
    close = [name for name in close if difflib.SequenceMatcher(None, word, name).ratio() >= best - 0.05]
    if not close:  # the same words in another order ("lr_min"), or a part of a longer name, that the ratio misses
        words = sorted(word.replace("-", "_").split("_"))
        close = [name for name in names if sorted(name.replace("-", "_").split("_")) == words]
        close = close or [name for name in names if len(word) > 2 and word in name][:3]
    return f"did you mean {' or '.join(repr(name) for name in close)}?" if close else ""


def unknown_name(kind: str, word: str, choices, *, listed: int = 20, where: str = "") -> str:
    """One line for an unknown ``kind`` of name: the closest names, and the whole list only when it is short
    (``listed`` names at most; ``where`` says where to see a longer one)."""
    names = sorted(str(choice) for choice in choices)
    hint = did_you_mean(word, names)
    message = f"unknown {kind} {word!r}" + (f"; {hint}" if hint else "")
    if len(names) <= listed:
        return message + f" ({kind}s: {', '.join(names)})"
    return message + (f" ({where})" if where else f" ({len(names)} {kind}s)")
