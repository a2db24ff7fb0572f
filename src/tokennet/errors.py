"""One family of expected errors: what a user can cause and fix, as opposed to a bug.

Every error tokennet raises on purpose derives from :class:`TokennetError`; the CLI prints those as one
line (``tokennet: error: ...``) and exits with status 2, and lets anything else — a bug — show its
traceback. Each subclass also derives from the built-in exception it refines (``ValueError``,
``RuntimeError``), so ``except ValueError`` keeps working for library users. Messages say what is wrong
and how to fix it in library terms; they do not name CLI flags.
"""

from __future__ import annotations

__all__ = ["TokennetError", "ConfigError", "DataError", "RecipeError", "RunError", "TrainingStopped", "one_line"]


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
