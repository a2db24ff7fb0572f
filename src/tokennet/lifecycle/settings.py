"""``--set key=value``: parsed against each setting's type, checked against the recipe, resolved with a saved run.

Every value is parsed by its setting's declared type (:mod:`tokennet.fields`), so ``--set
time_budget=abc`` is one line naming the setting and the type it takes, for a setting whose default
is None as much as for any other. A setting the recipe does not know, or one that does not apply
to it as configured (``vocab_size`` with a character tokenizer), is an error rather than silently ignored.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import RecipeError, unknown_name
from ..fields import coerce
from .recipe import Recipe

__all__ = ["parse_sets", "check_known", "check_applicable", "resolve_settings", "show_settings", "one_line"]


def parse_sets(items: list[str], defaults: dict[str, Any], types: dict[str, Any] | None = None, *,
               recipe: str = "RECIPE") -> dict[str, Any]:
    """Parse ``key=value`` strings against the recipe's settings (``types``: from :meth:`Recipe.setting_types`;
    without them, each default's type; ``recipe``: its name, for the message naming an unknown key)."""
    from typing import Any as _Any

    out = {}
    for item in items:
        if "=" not in item:
            raise RecipeError(f"settings are key=value, got {item!r}")
        key, value = item.split("=", 1)
        key = key.strip().replace("-", "_")
        if key not in defaults:
            raise RecipeError(_unknown_setting(key, defaults, recipe))
        out[key] = coerce(key, value, (types or {}).get(key, _Any), defaults[key])
    return out


def check_known(recipe: Recipe, sets: dict[str, Any], defaults: dict[str, Any]) -> None:
    for k in sets:
        if k not in defaults:
            raise RecipeError(_unknown_setting(k, defaults, recipe.name))


def _unknown_setting(key: str, defaults: dict[str, Any], recipe: str = "RECIPE") -> str:
    """One line: the closest settings' names, not all of them (``--show-settings`` lists those)."""
    return unknown_name("setting", key, defaults, listed=0,
                        where=f"`tokennet train {recipe} --show-settings` lists all {len(defaults)}")


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


_MARKUP = re.compile(r":\w+:`~?([^`]+)`|``([^`]+)``")  # :class:`~x.Y` → Y.. (last part), ``x`` → x


def one_line(text: str) -> str:
    """A description's first sentence, without reStructuredText markup (``--show-settings`` prints it)."""
    plain = _MARKUP.sub(lambda m: m.group(1).rsplit(".", 1)[-1] if m.group(1) else m.group(2), text)
    first = re.split(r"(?<!e\.g)(?<!i\.e)(?<!etc)\.\s+(?=[A-Z(])", plain.strip(), maxsplit=1)[0]
    return first.rstrip(".")


def show_settings(recipe: Recipe, settings: dict[str, Any]) -> list[str]:
    """``--show-settings``: the settings grouped by where they are declared (the model config, the trainer, the
    data spec, fine-tuning, the recipe's options), one line each: ``name = value  description``."""
    docs = recipe.setting_docs()
    order = ("model", "training", "data", "fine-tuning")  # then the recipe's own options
    headings = sorted(dict.fromkeys(group for group, _ in docs.values()),
                      key=lambda group: next((i for i, word in enumerate(order) if group.startswith(word)), len(order)))
    groups: dict[str, list[str]] = {group: [] for group in headings}
    for name in sorted(settings):
        groups.setdefault(docs.get(name, ("other", ""))[0], []).append(name)
    width = min(36, max(len(f"{name} = {settings[name]!r}") for name in settings))
    lines = []
    for group, names in groups.items():
        if not names:
            continue
        lines.append(f"{group}:")
        for name in names:
            shown = f"{name} = {settings[name]!r}"
            lines.append(f"  {shown:<{width}}  {one_line(docs.get(name, ('', ''))[1])}".rstrip())
    return lines
