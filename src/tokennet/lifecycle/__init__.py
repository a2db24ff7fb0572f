"""Recipes as declarations, and the one run lifecycle every recipe goes through.

- :mod:`~tokennet.lifecycle.recipe`: :class:`Recipe` (what to train), :class:`BuildContext` (what ``build``
  reads), :class:`Job` (what it returns), the recipe registry;
- :mod:`~tokennet.lifecycle.settings`: ``--set`` parsed by type, settings that do not apply refused, a
  resumed run's settings restored;
- :mod:`~tokennet.lifecycle.runner`: :func:`train` — lock, resume/overwrite, torchrun, build, train, save,
  metrics, report.

This package sits below :mod:`tokennet.recipes` (which only declares) and above the run, tasks and
pictures it drives.
"""

from .recipe import BuildContext, Job, Recipe, get_recipe, list_recipes, register_recipe
from .runner import train, write_report
from .settings import check_applicable, parse_sets, resolve_settings

__all__ = ["Recipe", "Job", "BuildContext", "register_recipe", "get_recipe", "list_recipes", "parse_sets",
           "check_applicable", "resolve_settings", "train", "write_report"]
