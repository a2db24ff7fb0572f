"""bench/records.py: the records table is rendered from its JSON, a record needs three seeds and must beat the old
one beyond the seeds' spread, and a seed is a real ``tokennet train`` process whose metric is read back."""

import dataclasses
import json

import pytest
from support import load_bench


@pytest.fixture(scope="module")
def records():
    return load_bench("records")


def test_the_docs_page_and_the_readme_table_are_rendered_from_the_json(records):
    regenerate = "run python bench/records.py table --write docs/records.md"
    rows = records.load_rows()
    assert records.PAGE.read_text() == records.page(rows), f"docs/records.md differs from records.json: {regenerate}"
    readme = records.README.read_text()
    assert readme == records.readme_with_table(readme, rows), f"README.md's table differs: {regenerate}"


def test_a_record_must_beat_the_old_one_beyond_the_spread(records):
    task = records.TASKS["mnist1d"]  # higher is better
    old = {"median": 0.980, "spread": 0.004}
    assert not records.beats(task, {"median": 0.983, "spread": 0.002}, old)  # within the old spread: noise
    assert records.beats(task, {"median": 0.986, "spread": 0.002}, old)
    assert records.beats(task, {"median": 0.5, "spread": 0.1}, None)  # the first attempt sets the record
    lower = records.TASKS["characters"]  # lower is better
    assert records.beats(lower, {"median": 1.50, "spread": 0.01}, {"median": 1.55, "spread": 0.02})
    assert not records.beats(lower, {"median": 1.56, "spread": 0.01}, {"median": 1.55, "spread": 0.02})


def test_an_attempt_runs_its_seeds_and_keeps_its_history(records, tmp_path, monkeypatch, corpus):
    tiny = records.Task("tiny characters", "gpt-char", "val_loss", False, 600, 2.0, (("none", None, ""),), (
        "--data", str(corpus), "--max-iters", "2", "--set", "dim=16", "num_layers=1", "num_heads=2", "block_size=8",
        "batch_size=2", "eval_iters=1", "sample_tokens=0", "eval_interval=0", "report=false"))
    monkeypatch.setitem(records.TASKS, "tiny", tiny)
    path = tmp_path / "records.json"
    first = records.attempt("tiny", [0, 1, 2], "the first", path=path)
    assert first["record"] and [r["seed"] for r in first["runs"]] == [0, 1, 2]
    assert all(r["value"] > 0 and r["wall_s"] > 0 for r in first["runs"])
    monkeypatch.setattr(records, "run_seed", lambda task, seed, extra: {"seed": seed, "value": first["median"],
                                                                         "wall_s": 1.0})
    again = records.attempt("tiny", [0, 1, 2], "the same again", path=path)
    assert not again["record"]  # equal is not better
    row = json.loads(path.read_text())["rows"]["tiny"]
    assert [h["change"] for h in row["history"]] == ["the first", "the same again"]
    assert row["record"]["change"] == "the first"
    with pytest.raises(SystemExit, match="at least 3 seeds"):
        records.attempt("tiny", [0], "one seed", path=path)
    monkeypatch.setitem(records.TASKS, "tiny", dataclasses.replace(tiny, budget_s=0.5))  # a rule tightened
    row = records.rejudge(path)["tiny"]
    assert row["record"] is None and not any(h["within_budget"] for h in row["history"])


def test_every_task_names_a_recipe_and_a_budget(records):
    from tokennet.lifecycle import list_recipes

    names = {r.name for r in list_recipes()}
    for task in records.TASKS.values():
        assert task.recipe in names and task.budget_s > 0, dataclasses.asdict(task)


def test_an_attempts_own_arguments_reach_the_process_and_its_recorded_command(records, tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(records, "run_seed", lambda task, seed, extra: seen.append(extra) or {
        "seed": seed, "value": 1.0, "wall_s": 1.0})
    path = tmp_path / "records.json"
    new = records.attempt("characters", [0, 1, 2], "longer", path=path, extra=("--time-budget", "840"))
    assert seen == [("--time-budget", "840")] * 3
    assert new["command"].endswith("--time-budget 840 --seed S") and len(new["load_average"]) == 3
    argv = records.TASKS["characters"].command(0, "OUT", ("--time-budget", "840"))
    assert argv[argv.index("--time-budget") + 1] == "840" and argv.index("--time-budget") < argv.index("--seed")


def test_the_command_line_passes_what_follows_two_dashes_to_tokennet_train(records, monkeypatch):
    given = {}

    def fake_attempt(name, seeds, change, extra=()):
        given.update(name=name, extra=extra)
        return {"median": 1.5, "spread": 0.0, "wall_s_median": 1.0, "record": True, "within_budget": True}

    monkeypatch.setattr(records, "attempt", fake_attempt)
    assert records.main(["run", "characters", "--change", "longer", "--", "--time-budget", "840"]) == 0
    assert given == {"name": "characters", "extra": ("--time-budget", "840")}
