"""The end-of-training summary: the recipe's headline metrics as columns, a row for the model and one per baseline
that reported them, the last progress line's step and seconds; every recipe's declaration is well formed."""

import dataclasses
from pathlib import Path

import pytest

from tokennet.lifecycle import Recipe, list_recipes
from tokennet.lifecycle.summary import headline_rows, summary
from tokennet.recipes import get_recipe


def test_the_table_has_the_model_and_each_baseline_in_the_same_columns(tmp_path):
    recipe = get_recipe("audio")
    metrics = {"step": 347, "run_seconds": 58.4, "wall_seconds": 63.0, "num_parameters": 120_000,
               "test_accuracy": 0.9812, "baseline_accuracy": 0.9502, "test_accuracy_other_synth": 0.91,
               "test_accuracy_babble_10db": 0.95, "test_accuracy_white_0db": 0.5, "test_loss": 0.1}
    text = summary(recipe, tmp_path, metrics, time_budget=60.0)
    lines = text.splitlines()
    assert lines[0] == "trained audio: 347 steps in 58 s of a 60 s budget, 63 s in all, 0.12M parameters"
    header, model, baseline = lines[2:5]
    assert header.split() == ["test_accuracy", "test_accuracy_other_synth", "test_accuracy_babble_10db"]
    assert model.split() == ["ast-digits", "0.9812", "0.91", "0.95"]
    assert baseline.split() == ["MFCC", "+", "SVM", "0.9502", "–", "–"]  # the baseline's missing sets: a dash
    assert "test_accuracy_white_0db" not in text and "test_loss" not in text  # those stay in metrics.json
    assert f"run directory: {tmp_path}" in text
    assert max(map(len, lines[:5])) <= 100  # a glance: no line of a hundred metrics


def test_baselines_that_did_not_run_have_no_row_and_nested_metrics_are_read():
    columns, rows = headline_rows(get_recipe("vqa"), {"exact_match": 93.4, "exact_match_unseen_count": 71.0})
    assert columns == ["exact_match", "exact_match_unseen_count"] and [name for name, _ in rows] == ["vqa-transformer"]
    nested = {"text": {"val_loss": 1.9}, "graph": {"test_accuracy": 0.2}}  # a run of several tasks
    columns, rows = headline_rows(get_recipe("multimodal"), nested)
    assert columns == ["text.val_loss", "graph.test_accuracy"] and rows[0][1] == [1.9, 0.2]


def test_a_recipe_without_a_headline_shows_its_numbers_on_one_line(tmp_path):
    plain = dataclasses.replace(get_recipe("graph"), headline=(), baselines={})
    text = summary(plain, Path(tmp_path), {"step": 3, "wall_seconds": 4.0, "accuracy": 0.5})
    assert "trained graph: 3 steps in 4 s, 4 s in all" in text and "  accuracy 0.5" in text


@pytest.mark.parametrize("recipe", [r for r in list_recipes() if r.build.__module__.startswith("tokennet.")],
                         ids=lambda r: r.name)
def test_every_recipe_declares_its_headline(recipe):
    assert recipe.headline, f"recipe {recipe.name} declares no headline metric for the summary"
    for name, keys in recipe.baselines.items():
        assert len(keys) == len(recipe.headline), name


def test_a_baseline_row_must_fill_the_headline_columns():
    with pytest.raises(ValueError, match="baseline 'b' names 2 metrics for the 1 headline columns"):
        Recipe("x", "", "gpt-micro", build=lambda ctx: None, headline=("a",), baselines={"b": ("c", "d")})


def test_the_budget_shown_is_the_one_training_ran_under(tmp_path):
    """A recipe's default budget extended by a first run's one-time preparation: the progress line said "of 412 s",
    so the summary does too (the setting, 270, is what the run.json holds)."""
    metrics = {"step": 9, "run_seconds": 400.0, "time_budget": 412.0, "wall_seconds": 410.0, "num_parameters": 1}
    assert "9 steps in 400 s of a 412 s budget" in summary(get_recipe("audio"), tmp_path, metrics, time_budget=270.0)
