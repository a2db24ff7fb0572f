"""bench/default_runs.py: the README's recipe table is rendered from its JSON, every recipe has a row, a run is a
real ``tokennet train`` process whose headline metric is read back, and a failed run is kept as a failure."""


import pytest
from support import load_bench


@pytest.fixture(scope="module")
def default_runs():
    return load_bench("default_runs")


def test_the_readme_table_is_rendered_from_the_json(default_runs):
    readme = default_runs.README.read_text()
    assert readme == default_runs.readme_with_table(readme, default_runs.load_rows()), (
        "README.md's recipe table differs from bench/results/default-runs.json: "
        "run python bench/default_runs.py table --write")


def test_every_recipe_has_a_row_and_a_run_over_the_bar_says_so(default_runs):
    rows = {"vit": {"wall_s": 61.0, "within_limit": True, "metric": "test_accuracy", "value": 0.98},
            "vqa": {"wall_s": 809.0, "within_limit": False, "metric": "test_accuracy", "value": 0.9}}
    text = default_runs.table(rows)
    for name in default_runs.recipes():
        assert f"| `{name}` |" in text
    assert "| `vit` | 61 s | test_accuracy 0.98 |" in text
    assert "809 s (over the 10-minute bar)" in text


def test_the_headline_is_the_first_known_metric(default_runs):
    assert default_runs.headline({"val_loss": 1.5, "test_accuracy": 0.9}) == ("test_accuracy", 0.9)
    assert default_runs.headline({"val_loss": 1.5, "sample": "text"}) == ("val_loss", 1.5)
    assert default_runs.headline({"sample": "text"}) == (None, None)
    assert default_runs.headline({"text.val_loss": 2.0, "image.test_accuracy": 0.9}) == ("image.test_accuracy", 0.9)
    nested = {"text": {"val_loss": 2.0}, "image": {"test_accuracy": 0.9}, "sample": "x"}  # multimodal's metrics.json
    assert default_runs.headline(nested) == ("image.test_accuracy", 0.9)


def test_a_run_is_a_real_process_and_a_failure_is_kept(default_runs, tmp_path, monkeypatch):
    monkeypatch.setattr(default_runs, "recipes", lambda: ["vit", "no-such-recipe"])
    failed = default_runs.run_default("no-such-recipe")
    assert "error" in failed and failed["wall_s"] > 0
    path = tmp_path / "default-runs.json"
    monkeypatch.setattr(default_runs, "run_default", lambda name, seed=0: {
        "recipe": name, "wall_s": 1.0, "within_limit": True, "metric": "val_loss", "value": 2.0})
    rows = default_runs.measure(["vit"], path=path)
    assert default_runs.load_rows(path) == rows and rows["vit"]["value"] == 2.0
    assert "| `no-such-recipe` | not measured |" in default_runs.table(rows)


def test_an_unknown_recipe_is_refused_before_anything_runs(default_runs, monkeypatch):
    monkeypatch.setattr(default_runs, "measure", lambda names: pytest.fail("ran"))
    with pytest.raises(SystemExit, match="unknown recipes"):
        default_runs.main(["run", "--recipes", "nope"])


def test_rows_come_from_records_only_where_the_command_was_the_plain_default(default_runs, tmp_path):
    import json

    attempt = {"change": "c", "commit": "abc", "runs": [{"seed": 1, "value": 0.5, "wall_s": 9.0},
                                                        {"seed": 0, "value": 0.9, "wall_s": 80.0}]}
    rows = {"graph": {"history": [{**attempt, "command": "tokennet train graph --seed S"}]},
            "mnist1d": {"history": [{**attempt, "command": "tokennet train vit --data mnist1d --seed S"}]}}
    path = tmp_path / "records.json"
    path.write_text(json.dumps({"rows": rows}))
    taken = default_runs.from_records(path)
    assert list(taken) == ["graph"]  # vit --data mnist1d is not vit's default run
    assert taken["graph"]["wall_s"] == 80.0 and taken["graph"]["value"] == 0.9
    assert taken["graph"]["metric"] == "test_accuracy" and "records.json" in taken["graph"]["source"]


def test_rows_come_from_a_runs_file_only_for_a_plain_seed_0_default(default_runs, tmp_path):
    import json

    runs = [{"seed": 0, "command": "tokennet train vqa --seed 0 --out /tmp/x --overwrite --set progress=false",
             "wall_seconds": 525.9, "commit": "abc", "metrics": {"exact_match": 99.3}},
            {"seed": 1, "command": "tokennet train vqa --seed 1 --out /tmp/y", "wall_seconds": 9.0, "metrics": {}},
            {"seed": 0, "command": "tokennet train vit --data mnist1d --seed 0", "wall_seconds": 9.0, "metrics": {}}]
    path = tmp_path / "vqa_default.json"
    path.write_text(json.dumps({"runs": runs}))
    taken = default_runs.from_runs_file(path)
    assert list(taken) == ["vqa"]
    assert taken["vqa"]["wall_s"] == 525.9 and taken["vqa"]["metric"] == "exact_match"
    assert taken["vqa"]["within_limit"] and "vqa_default.json" in taken["vqa"]["source"]
