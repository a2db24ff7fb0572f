"""Recipes: which data, which model preset, which training settings — one module each, registered by
``register_recipe`` in the module. Every module of this package is imported, so a new recipe edits
nothing else; a plugin's recipe registers the same way from its own file (:mod:`tokennet.plugins`)."""

import importlib as _importlib
import pkgutil as _pkgutil

from ..errors import RecipeError
from ..lifecycle import BuildContext, Job, Recipe, get_recipe, list_recipes, parse_sets, register_recipe, train

__all__ = ["Recipe", "Job", "BuildContext", "RecipeError", "get_recipe", "list_recipes", "parse_sets",
           "register_recipe", "train"]

for _m in _pkgutil.iter_modules(__path__):
    if _m.name != "base" and not _m.name.startswith("_"):
        _importlib.import_module(f"{__name__}.{_m.name}")
