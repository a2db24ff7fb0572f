"""``--time-budget`` is the whole process's budget: the summary repeats the last progress line's step and seconds
(after ``--resume`` too, whose clock goes on from its earlier session), a budget that cannot hold the data's
preparation is refused at the start (one line, exit 2, nothing written), one that leaves no time to train after the
preparation is refused too, and what follows training is measured for the next run's budget."""

from __future__ import annotations

import json
import re
from unittest import mock

import pytest
from support import setting_value

from tokennet.cli import main
from tokennet.lifecycle import budget as timings
from tokennet.lifecycle.budget import Preparation
from tokennet.recipes import get_recipe

pytestmark = pytest.mark.usefixtures("one_thread")

LINE = re.compile(r"step (\d+)/\d+ · (\d+) s of (\d+) s")
SUMMARY = re.compile(r"trained graph: (\d+) steps in (\d+) s of a (\d+) s budget, (\d+) s in all")


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Timings measured here stay here (not in the user's cache)."""
    monkeypatch.setenv("TOKENNET_CACHE", str(tmp_path / "cache"))


def _graph(out, *flags):
    sets = {**get_recipe("graph").smoke, "eval_interval": 0, "warmup_iters": 2, "report": False}
    return ["train", "graph", "--out", str(out), *flags, "--set", *(f"{k}={setting_value(v)}" for k, v in sets.items())]


def _last_line_and_summary(err: str, out: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    lines = [m.groups() for m in LINE.finditer(err)]
    summary = SUMMARY.search(out)
    assert lines and summary, (err, out)
    return lines[-1], summary.groups()


def test_summary_repeats_the_last_progress_line_and_resume_goes_on(tmp_path, capsys):
    run = tmp_path / "graph"
    assert main(_graph(run, "--time-budget", "120", "--max-iters", "6")) == 0
    captured = capsys.readouterr()
    (step, seconds, budget), (s_step, s_seconds, s_budget, total) = _last_line_and_summary(captured.err, captured.out)
    assert (step, seconds, budget) == (s_step, s_seconds, s_budget) == ("6", seconds, "120")
    assert int(total) >= int(seconds)
    assert "time budget 120 s:" in captured.err  # what was spent, kept and left, said before training
    first_seconds = int(seconds)

    assert main(["train", "graph", "--out", str(run), "--resume", "--max-iters", "10", "--time-budget", "120"]) == 0
    captured = capsys.readouterr()
    (step, seconds, _), (s_step, s_seconds, _, _) = _last_line_and_summary(captured.err, captured.out)
    assert (step, seconds) == (s_step, s_seconds) and step == "10"
    assert int(seconds) >= first_seconds  # the run's clock counts the first session too
    assert "final" in timings.recorded(next(iter(timings._read())))  # measured for the next run like it


def test_a_budget_that_cannot_hold_the_preparation_is_refused_at_the_start(tmp_path, capsys):
    recipe = get_recipe("graph")
    slow = Preparation("synthesizing 9,999 clips", 400.0, "4 clips timed: 80 ms each, 2 at a time")
    run = tmp_path / "refused"
    with mock.patch.object(recipe, "preparation", lambda spec, settings: slow), \
            mock.patch.object(recipe, "build", side_effect=AssertionError("built before refusing")):
        assert main(_graph(run, "--time-budget", "30")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tokennet: error: --time-budget 30 s cannot hold")
    assert "~400 s here (4 clips timed" in err[0]
    assert not run.exists()


def test_a_budget_the_preparation_leaves_no_training_time_is_refused(tmp_path, capsys):
    run = tmp_path / "short"
    measured = mock.patch.object(timings, "recorded", lambda key: {"final": 60.0})  # a last run here took 60 s after
    with measured:
        assert main(_graph(run, "--time-budget", "30")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("tokennet: error: time_budget 30 s leaves no time to train:")
    assert not run.exists()


def test_a_first_run_whose_guessed_costs_fill_the_budget_still_trains_its_one_step(tmp_path, capsys):
    run = tmp_path / "short"
    assert main(_graph(run, "--time-budget", "3")) == 0  # the first run's 10 s guess is no reason to refuse
    assert (run / "metrics.json").exists() and (run / "log.jsonl").read_text().count('"step"') >= 1


def test_preparation_check_passes_cached_data_and_unbudgeted_runs():
    timings.check_preparation(None, 30.0, None, "--time-budget")  # cached: nothing to prepare
    timings.check_preparation(Preparation("x", 400.0, "y"), None, None, "--time-budget")  # no budget
    with pytest.raises(Exception, match="~20 s of final evaluation"):
        timings.check_preparation(Preparation("x", 15.0, "y"), 30.0, 20.0, "--time-budget")


def test_timings_are_keyed_by_what_decides_them(tmp_path):
    a = timings.timings_key("gpt", None, {"dim": 64, "time_budget": 60, "seed": 0})
    assert a == timings.timings_key("gpt", None, {"dim": 64, "time_budget": 300, "seed": 3})
    assert a != timings.timings_key("gpt", None, {"dim": 128, "time_budget": 60, "seed": 0})
    assert timings.recorded(a) == {}
    timings.record(a, final=12.345)
    assert timings.recorded(a)["final"] == 12.35
    timings.record(a, final=90.0)  # one run on a busy machine
    timings.record(a, final=13.0)
    assert timings.recorded(a)["final"] == 13.0  # the median of the last three, not the slow one
    for seconds in (20.0, 21.0, 22.0):
        timings.record(a, final=seconds)
    assert timings.recorded(a)["final"] == 21.0  # only the last three count
    timings.record(a, finish_per_step=0.04489)  # a step of 45 ms: to the hundredth it was 0.04 (11 % short)
    assert timings.recorded(a)["finish_per_step"] == 0.04489


def test_a_call_of_main_counts_from_the_call_not_the_process(tmp_path, capsys, monkeypatch):
    """``tokennet`` on the command line counts from its process's start; ``main([...])`` called from Python (a
    notebook, a test session hours old) from the call."""
    import time

    import tokennet.train.budget as clock

    monkeypatch.setattr(clock, "process_started", lambda: time.perf_counter() - 10_000.0)
    assert main(_graph(tmp_path / "graph", "--time-budget", "60", "--max-iters", "2")) == 0
    assert SUMMARY.search(capsys.readouterr().out).group(1) == "2"


def test_a_recipes_own_budget_counts_from_the_end_of_a_one_time_preparation(tmp_path, caplog):
    """No --time-budget given: the recipe's default budget is not refused for a first run's synthesis; it starts
    counting once the data is prepared (the budget training ran under is the default plus the preparation)."""
    import logging

    from tokennet.recipes import train

    recipe = get_recipe("graph")
    real = recipe.defaults
    slow = Preparation("synthesizing 9,999 clips", 400.0, "4 clips timed")
    own = {"time_budget": 60.0, "max_iters": 3, "eval_interval": 0, "warmup_iters": 1, "report": False,
           "progress": False}
    with mock.patch.object(recipe, "preparation", lambda spec, settings: slow), \
            mock.patch.object(recipe, "defaults", lambda data=None: {**real(data), **recipe.smoke, **own}), \
            caplog.at_level(logging.INFO, logger="tokennet"):
        _, metrics = train("graph", out=tmp_path / "graph")
    assert metrics["step"] == 3 and metrics["time_budget"] > 60.0
    assert any("the recipe's time_budget of 60 s counts from its end" in m for m in caplog.messages)


class Counted:
    """A job's batches, counting the furthest one drawn (as vqa's QABatches do)."""

    def __init__(self, source):
        self.source, self.max_index = source, -1

    def batch(self, i):
        self.max_index = max(self.max_index, i)
        return self.source.batch(i)

    def __getattr__(self, name):
        return getattr(self.source, name)


def test_a_finish_that_repeats_the_steps_is_kept_per_step_and_measured_for_the_next_run(tmp_path, capsys):
    """A job whose ``finish`` trains again for the run's steps (vqa's baselines): the first run keeps what the job
    measures per step, so the whole run stays in its budget; what the finish then took, per step, is what the next
    run keeps (apart from the fixed seconds after training, so another number of steps is kept right too)."""
    import dataclasses
    import time

    recipe = get_recipe("graph")
    build = recipe.build
    per_step = 0.01  # the finish sleeps this per step trained: about as long again as a graph step here
    sleeps = []

    def repeating(ctx):
        job = build(ctx)
        source = Counted(job.source)

        def finish(model):
            sleeps.append(per_step * (source.max_index + 1))
            time.sleep(sleeps[-1])
            return {}

        return dataclasses.replace(job, source=source, finish=finish, finish_step_seconds=lambda: per_step)

    budget = 8.0
    with mock.patch.object(recipe, "build", repeating), \
            mock.patch.object(timings, "recorded", lambda key: {"final": 1.0}):  # a last run here took 1 s after
        assert main(_graph(tmp_path / "first", "--time-budget", f"{budget:g}")) == 0
    err = capsys.readouterr().err
    assert "~10.0 ms per step trained for what the run trains after it (measured now)" in err
    metrics = json.loads((tmp_path / "first" / "metrics.json").read_text())
    assert metrics["step"] > 1 and sleeps[-1] == pytest.approx(per_step * metrics["step"])
    # training stopped where its steps' share and the fixed second still fit: well before the fixed reserve's stop
    assert metrics["run_seconds"] + per_step * metrics["step"] <= budget - 1.0 + 0.3
    key = next(iter(timings._read()))
    kept = timings.recorded(key)
    assert kept["finish_per_step"] == pytest.approx(per_step, rel=0.5)  # the sleep's, per step (it may oversleep)
    assert kept["final"] < sleeps[-1]  # the finish is kept apart from the fixed seconds after training

    with mock.patch.object(recipe, "build", repeating):
        assert main(_graph(tmp_path / "second", "--time-budget", f"{budget:g}")) == 0
    assert "ms per step trained for what the run trains after it (as the last run like it took here)" in \
        capsys.readouterr().err


@pytest.mark.parametrize("believed", [True, False])
def test_a_finish_that_measures_its_steps_keeps_what_it_spends_once_with_the_fixed_seconds(tmp_path, believed):
    """vqa's finish starts a worker process once, then trains the run's steps: with ``finish_step_metric`` the next
    run keeps per step only what the steps took, and the once-only seconds with the fixed seconds after training
    (so a run of more steps is not charged them again per step). A figure the finish cannot have measured (more
    than all its seconds per step) is not believed: then all its seconds count per step, as without the metric."""
    import dataclasses
    import time

    recipe = get_recipe("graph")
    build = recipe.build
    once, per_step = 0.6, 0.01

    def repeating(ctx):
        job = build(ctx)
        source = Counted(job.source)

        def finish(model):
            time.sleep(once)
            steps = source.max_index + 1
            started = time.perf_counter()
            time.sleep(per_step * steps)
            took = (time.perf_counter() - started) / steps
            return {"repeat_seconds_per_step": took if believed else 1e6}

        return dataclasses.replace(job, source=source, finish=finish, finish_step_seconds=lambda: per_step,
                                   finish_step_metric="repeat_seconds_per_step")

    with mock.patch.object(recipe, "build", repeating):
        assert main(_graph(tmp_path / "run", "--time-budget", "60", "--max-iters", "20")) == 0
    steps = json.loads((tmp_path / "run" / "metrics.json").read_text())["step"]
    assert steps == 20
    kept = timings.recorded(next(iter(timings._read())))
    everything = (once + per_step * steps) / steps  # 40 ms: what the finish took, over the steps
    if believed:
        assert per_step <= kept["finish_per_step"] < (per_step + everything) / 2  # the sleep's (it may oversleep)
        assert kept["final"] >= once  # the worker's start, once, with the fixed seconds
    else:
        assert kept["finish_per_step"] >= everything

