"""bench/time_budget.py: whole ``tokennet train --time-budget`` processes, the first on an empty cache and the next
on what it left there; each run's wall against the budget and the reserve it said it kept."""

import json

import pytest
from support import load_bench, setting_value

from tokennet.recipes import get_recipe


def test_the_first_run_measures_its_reserve_and_the_next_reads_what_the_first_left(tmp_path, capsys):
    bench = load_bench("time_budget")
    sets = {**get_recipe("graph").smoke, "max_iters": 4, "eval_interval": 0, "report": False}
    out = tmp_path / "time-budget-graph.json"
    assert bench.main(["graph", "--budget", "120", "--runs", "2", "--out", str(out),
                       "--set", *(f"{k}={setting_value(v)}" for k, v in sets.items())]) == 0
    record = json.loads(out.read_text())
    first, second = record["runs"]
    assert (first["cache"], first["steps"], second["steps"]) == ("empty", 4, 4)
    assert "from one evaluation measured now" in first["reserve_line"]
    assert "as the last run like it took here" in second["reserve_line"]  # the first run's timings, kept
    for run in (first, second):
        assert 0 < run["wall_seconds"] <= run["wall_s"] + 0.05  # the process's wall, rounded to 0.1 s, holds the run's
        assert run["wall_over_budget"] == pytest.approx(run["wall_s"] / 120, abs=1e-3)
    assert record["budget_s"] == 120 and record["commit"] and "| run | cache |" in capsys.readouterr().out


def test_bad_arguments_are_refused(capsys):
    assert load_bench("time_budget").main(["graph", "--budget", "0"]) == 2
    assert "--budget > 0" in capsys.readouterr().err
