"""Every setting of every recipe is described where it is declared, and ``--show-settings`` prints it grouped, one line
each (issue 61)."""

import dataclasses
import json

from tokennet.cli import main
from tokennet.fields import field_docs
from tokennet.lifecycle import list_recipes, resolve_settings
from tokennet.lifecycle.settings import one_line, show_settings


def test_every_setting_of_every_recipe_has_a_one_line_description():
    """A new model field, trainer field, data spec field or recipe option without its words fails here, naming it."""
    missing, counted = [], 0
    for recipe in list_recipes():  # the example plugin's recipe among them (tests/conftest.py loads it)
        for name, (group, text) in recipe.setting_docs().items():
            counted += 1
            line = one_line(text)
            if not line or line == name or "\n" in line or len(line.split()) < 2:
                missing.append(f"{recipe.name}: {name} ({group})")
    assert missing == [], f"settings without a description (add one where each is declared): {missing}"
    assert counted > 600


def test_field_docs_reads_google_style_args_with_shared_lines_and_a_base_class():
    @dataclasses.dataclass
    class Base:
        """Base.

        Args:
            dim: width D of every token.
            num_layers: depth L.
        """

        dim: int = 1
        num_layers: int = 1

    @dataclasses.dataclass
    class Child(Base):
        """Child.

        Args:
            dim, num_layers: the encoder (a shared line leaves the base's own words).
            lr, min_lr: peak and final learning rate, continued
                on the next line.
            beta1, beta2: first, second
        """

        lr: float = 0.1
        min_lr: float = 0.01
        beta1: float = 0.9
        beta2: float = 0.99

    docs = field_docs(Child)
    assert docs["dim"] == "width D of every token." and docs["num_layers"] == "depth L."
    assert docs["lr"] == docs["min_lr"] == "peak and final learning rate, continued on the next line."
    assert (docs["beta1"], docs["beta2"]) == ("first", "second")  # a list of short parts: one each


def test_show_settings_groups_the_settings_and_describes_each_on_one_line(capsys):
    assert main(["train", "gpt", "--show-settings", "--set", "num_layers=3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    headings = [line for line in lines if not line.startswith(" ")]
    assert headings[:3] == ["model (GPTConfig):", "training:", "data (TextCorpus):"] and "recipe gpt:" in headings
    rows = {line.split(" = ", 1)[0].strip(): line for line in lines if line.startswith("  ")}
    assert "num_layers = 3" in rows["num_layers"] and "depth L" in rows["num_layers"]
    assert "validation batches per evaluation" in rows["eval_iters"]
    assert len(rows) == len(lines) - len(headings)  # one line per setting
    from tokennet.recipes import get_recipe

    recipe = get_recipe("gpt")
    assert set(rows) == set(resolve_settings(recipe, recipe.defaults(), None, {}))
    assert show_settings(recipe, {"dim": 8})[0] == "model (GPTConfig):"


def test_show_settings_json_is_the_settings_a_run_would_use(capsys):
    assert main(["train", "gpt-char", "--show-settings", "--json", "--max-iters", "7"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["max_iters"] == 7 and shown["time_budget"] is None and shown["tokenizer"] == "char"
