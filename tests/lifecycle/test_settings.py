"""``--set`` is parsed by each setting's declared type, for every setting of every recipe."""

import typing

import pytest

from tokennet.cli import main
from tokennet.errors import RecipeError
from tokennet.fields import _args, coerce
from tokennet.lifecycle import list_recipes, parse_sets

BAD = {int: "two", float: "fast", bool: "maybe"}


def _bad_value(annotation) -> str | None:
    """A text that no member of the type accepts (None where any text is valid, e.g. a string setting)."""
    members = [a for a in _args(annotation) if a is not type(None)]
    if str in members or not members:
        return None
    if any(typing.get_origin(m) in (list, tuple) for m in members):
        return "a,b"
    return "nan" if members == [float] else BAD[members[0]] if members[0] in BAD else None


def test_every_setting_of_every_recipe_refuses_a_bad_value_of_its_type():
    checked = 0
    for recipe in list_recipes():
        defaults, types = recipe.defaults(), recipe.setting_types()
        for key, annotation in types.items():
            if key not in defaults:
                continue
            bad = _bad_value(annotation)
            if bad is None:
                continue
            with pytest.raises(RecipeError, match=f"setting {key}={bad}: expected"):
                parse_sets([f"{key}={bad}"], defaults, types)
            checked += 1
    assert checked > 300  # every recipe's model, trainer, data and own settings


@pytest.mark.parametrize(("text", "annotation", "expected"), [
    ("3", int, 3), ("none", float | None, None), ("2.5", float | None, 2.5), ("24,48", int | list[int], [24, 48]),
    ("28", int | list[int], 28), ("none", str, "none"), ("off", bool, False), ("5", typing.Any, 5),
])
def test_a_value_parses_as_its_type(text, annotation, expected):
    assert coerce("k", text, annotation) == expected


def test_a_setting_whose_default_is_none_still_has_a_type(capsys):
    """time_budget defaults to None but is a float | None: 'abc' is one line, exit 2 (it used to pass through as
    a string and end as an internal error)."""
    assert main(["-q", "train", "gpt-char", "--set", "time_budget=abc"]) == 2
    assert "time_budget=abc: expected float or none" in capsys.readouterr().err


def test_a_setting_that_does_not_apply_is_refused(tmp_path, capsys):
    assert main(["-q", "train", "gpt-char", "--out", str(tmp_path / "r"), "--set", "vocab_size=0"]) == 2
    assert "vocab_size does not apply" in capsys.readouterr().err and not (tmp_path / "r").exists()
