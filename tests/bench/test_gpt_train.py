"""bench/gpt_train.py's budget protocol: the settings it gives ``tokennet train gpt-char`` are ones the recipe
takes through its command line, and a budget run trains on time (no evaluation before the end, a time-tied
schedule). A tiny model on a small corpus: a few CPU seconds."""

import json
from pathlib import Path

import pytest
from support import load_bench

from tokennet.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def _bench():
    return load_bench("gpt_train")


B = _bench()
TINY = {"dim": 32, "num_layers": 1, "num_heads": 2, "block_size": 16, "batch_size": 4, "eval_iters": 2}


def _corpus(tmp_path) -> Path:
    p = tmp_path / "corpus.txt"
    p.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(200)))
    return p


def test_budget_settings_give_the_whole_run_its_time():
    s = B._budget_settings({**B.BEST_SETTINGS, **B.BUDGET_SETTINGS}, 42.5)
    assert s["time_budget"] == 42.5 and s["target_val_loss"] is None and s["max_iters"] >= 10_000
    assert s["eval_interval"] == 0 and s["checkpoint_interval"] == 0  # evaluating spends the budget
    assert B._budget_settings(s, -3)["time_budget"] == 1.0  # a budget below the fixed cost still runs


def test_a_budget_run_through_the_command_line_trains_on_time(tmp_path, monkeypatch):
    from tokennet.lifecycle import budget as timings

    monkeypatch.setattr(timings, "recorded", lambda key: {"final": 0.2})  # a run like it here: 0.2 s after training
    settings = {**B._budget_settings({**B.BEST_SETTINGS, **B.BUDGET_SETTINGS}, 2.5), **TINY}
    out = tmp_path / "run"
    assert main(B.train_argv(settings, out, _corpus(tmp_path))) == 0
    recs = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    evals = [r for r in recs if "val_loss" in r]
    assert len(evals) == 1  # one evaluation, at the end, once the time is spent
    assert 1 < evals[0]["step"] < settings["max_iters"]
    assert json.loads((out / "metrics.json").read_text())["run_seconds"] <= 2.5 + 2.0  # the whole run, in budget
    lrs = [r["lr"] for r in recs if "lr" in r]
    assert lrs and min(lrs) < settings["lr"]  # the schedule decays with the time spent, not with max_iters
    run = json.loads((out / "run.json").read_text())["settings"]
    for k in ("muon_lr", "warmup_iters", "batch_size", "optimizer", "schedule", "decay_fraction"):
        assert run[k] == settings[k]
