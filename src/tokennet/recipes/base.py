"""Kept for code written against the old module: the recipe declaration and ``train`` live in
:mod:`tokennet.lifecycle` now (below the recipes, which only declare)."""

from ..errors import RecipeError
from ..lifecycle import BuildContext, Job, Recipe, get_recipe, list_recipes, parse_sets, register_recipe, train
from ..run import RUN_FILE

__all__ = ["Recipe", "Job", "BuildContext", "register_recipe", "get_recipe", "list_recipes", "train", "parse_sets",
           "RUN_FILE", "RecipeError"]
