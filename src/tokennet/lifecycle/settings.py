"""``--set key=value``: parsed against each setting's type, checked against the recipe, resolved with a saved run.

Every value is parsed by its setting's declared type (:mod:`tokennet.fields`), so ``--set
time_budget=abc`` is one line naming the setting and the type it takes, for a setting whose default
is None as much as for any other. A setting the recipe does not know, or one that does not apply
to it as configured (``vocab_size`` with a character tokenizer), is an error rather than silently ignored.
"""

from __future__ import annotations

from typing import Any

from ..errors import RecipeError
from ..fields import coerce
from .recipe import Recipe

__all__ = ["parse_sets", "check_known", "check_applicable", "resolve_settings"]


def parse_sets(items: list[str], defaults: dict[str, Any], types: dict[str, Any] | None = None) -> dict[str, Any]:
    """Parse ``key=value`` strings against the recipe's settings (``types``: from :meth:`Recipe.setting_types`;
    without them, each default's type)."""
    from typing import Any as _Any

    out = {}
    for item in items:
        if "=" not in item:
            raise RecipeError(f"settings are key=value, got {item!r}")
        key, value = item.split("=", 1)
        key = key.strip().replace("-", "_")
        if key not in defaults:
            raise RecipeError(f"unknown setting {key!r}; valid: {', '.join(sorted(defaults))}")
        out[key] = coerce(key, value, (types or {}).get(key, _Any), defaults[key])
    return out


def check_known(recipe: Recipe, sets: dict[str, Any], defaults: dict[str, Any]) -> None:
    for k in sets:
        if k not in defaults:
            raise RecipeError(f"unknown setting {k!r}; valid: {', '.join(sorted(defaults))}")


def check_applicable(recipe: Recipe, settings: dict[str, Any], given: set[str]) -> None:
    """Refuse a setting the user gave that does not apply to the recipe as configured (``recipe.unused``)."""
    if recipe.unused is None:
        return
    bad = sorted(given & set(recipe.unused(settings)))
    if bad:
        what = ", ".join(bad)
        raise RecipeError(f"{what} does not apply to recipe {recipe.name!r} as configured; leave it unset "
                          f"(see `tokennet train {recipe.name} --show-settings`)")


def resolve_settings(recipe: Recipe, defaults: dict[str, Any], saved: dict[str, Any] | None,
                     sets: dict[str, Any]) -> dict[str, Any]:
    """The run's settings: the defaults, then a resumed run's saved settings, then what the user sets.

    Settings a saved run does not name were added later: it ran with their field defaults (e.g.
    ``optimizer="adamw"``), not with what the recipe defaults to now. Setting ``max_iters`` without
    ``time_budget`` on a new run drops the recipe's default time budget (an exact iteration budget). A new run's
    settings that follow from others come last (``recipe.derive``), each unless the user set it.
    """
    settings = dict(defaults)
    if saved is not None:
        older = recipe.field_defaults()
        settings.update({k: older[k] for k in set(defaults) - set(saved) if k in older})
        settings.update(saved)
    elif "max_iters" in sets and "time_budget" not in sets:
        settings["time_budget"] = None
    settings.update(sets)
    if recipe.derive is not None and saved is None:  # settings that follow from others, unless the user set them
        # (a resumed run's saved settings hold what they derived to, and what its user set then)
        settings.update(recipe.derive(settings, set(sets)))
    return settings
