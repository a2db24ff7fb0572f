"""Recipes: which data, which model preset, which training settings. Importing registers them all."""

from . import (
    audio,  # noqa: F401  (registers audio)
    caption,  # noqa: F401  (registers caption)
    gpt,  # noqa: F401  (registers gpt, gpt-char)
    graph,  # noqa: F401  (registers graph)
    seq2seq,  # noqa: F401  (registers seq2seq)
    sphere,  # noqa: F401  (registers sphere)
    vit,  # noqa: F401  (registers vit)
)
from .base import Job, Recipe, RecipeError, get_recipe, list_recipes, parse_sets, register_recipe, train

__all__ = ["Recipe", "Job", "RecipeError", "get_recipe", "list_recipes", "parse_sets", "register_recipe", "train"]
