"""Where tasks and recipes come from: tokennet's own modules, installed packages, and files named on the command line.

A *plugin* is a Python module that registers things when it is imported — a task
(:func:`tokennet.tasks.register_task`), a recipe (:func:`tokennet.recipes.register_recipe`), a model
family (:func:`tokennet.models.registry.register_family`) — exactly as tokennet's own modules do.
tokennet's built-in tasks and recipes are loaded the same way, first. Then, as pytest does with its
``pytest11`` group:

- every installed package's entry points in the group ``tokennet.plugins``
  (``[project.entry-points."tokennet.plugins"] my_task = "my_package.my_task"``) are imported;
- ``tokennet --plugin FILE.py`` (or :func:`load_file`) imports a file that is not part of a package.

Discovery is the one place where a lower layer reaches modules above it, on purpose and only by name:
:func:`tokennet.load` must find the task of a run whatever imported it, so the task registry asks for
the built-ins and the installed plugins on first use (:func:`discover`). Nothing here imports a
tokennet module statically.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from pathlib import Path

from .errors import TokennetError

__all__ = ["discover", "load_file", "loaded", "register_task", "task_for", "list_tasks", "all_verbs",
           "ENTRY_POINT_GROUP", "BUILTIN", "PluginError"]

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "tokennet.plugins"
# Importing these registers tokennet's own tasks (and their model families) and recipes.
BUILTIN = ("tokennet.tasks", "tokennet.recipes", "tokennet.demos")

_done = False
_loaded: list[str] = []


class PluginError(TokennetError, ImportError):
    """A plugin that cannot be found or fails to import (the message names it and the first line of the error)."""


# -- the task registry: model family → task adapter --------------------------------------------------------
# It lives here, at the bottom, so that tokennet.load (run.py) finds a run's task without importing the
# tasks package, which sits above it (tasks draw pictures with viz).
_TASKS: dict[str, object] = {}


def register_task(family: str | None, task) -> None:
    """Register the task adapter serving a model family (see :mod:`tokennet.tasks`); ``family=None``: the
    generic task (no verbs) of every family no task serves."""
    _TASKS[family] = task


def task_for(family: str):
    """The task adapter of a model family (the generic one for a family no loaded plugin serves)."""
    if family not in _TASKS:
        discover()
    return _TASKS.get(family, _TASKS.get(None))


def list_tasks() -> dict[str, object]:
    """Model family → task adapter, for every family registered so far (after discovery)."""
    discover()
    return dict(sorted((family, task) for family, task in _TASKS.items() if family is not None))


def all_verbs() -> set[str]:
    """Every verb some registered task offers (so ``run.translate`` on a language model says what it can do)."""
    return {v for t in list_tasks().values() for v in t.verbs}


# -- discovery ------------------------------------------------------------------------------------------------
def loaded() -> list[str]:
    """The plugins imported so far (entry points as ``group:name``, files as their path), in order."""
    return list(_loaded)


def discover() -> None:
    """Import the built-in tasks and recipes and every installed ``tokennet.plugins`` entry point (once)."""
    global _done
    if _done:
        return
    _done = True  # before importing: a plugin that itself asks for discovery must not recurse
    for name in BUILTIN:
        importlib.import_module(name)
    from importlib.metadata import entry_points

    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            entry.load()
        except Exception as error:  # noqa: BLE001 - a broken third-party plugin must not break tokennet's own commands
            log.warning("tokennet: plugin %s (%s) failed to load and is skipped: %s", entry.name, entry.value,
                        str(error).splitlines()[0] if str(error) else type(error).__name__)
            continue
        _loaded.append(f"{ENTRY_POINT_GROUP}:{entry.name}")


def load_file(path: str | Path) -> str:
    """Import a plugin from a ``.py`` file (``tokennet --plugin FILE``); return the module's name.

    The module is imported under a name derived from the file's stem (``tokennet_plugin_<stem>``), once:
    loading the same file again returns the module already loaded. An error while importing it is a
    :class:`PluginError` naming the file and the error's first line.
    """
    discover()  # the plugin's own imports of tokennet may rely on the built-ins being registered
    file = Path(path)
    if not file.is_file():
        raise PluginError(f"plugin file {path} does not exist")
    if file.suffix != ".py":
        raise PluginError(f"plugin file {path} is not a Python file (.py)")
    name = "tokennet_plugin_" + "".join(char if char.isalnum() else "_" for char in file.stem)
    key = str(file.resolve())
    if key in _loaded and name in sys.modules:
        return name
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name while it runs
    try:
        spec.loader.exec_module(module)
    except TokennetError:
        sys.modules.pop(name, None)
        raise
    except Exception as error:  # noqa: BLE001 - the user's file: report it as theirs, in one line
        sys.modules.pop(name, None)
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise PluginError(f"plugin {path} failed to import: {type(error).__name__}: {first}") from error
    _loaded.append(key)
    return name
