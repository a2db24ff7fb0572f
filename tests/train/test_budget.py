"""The trainer under a run's clock: it stops before the time the budget leaves for training, its last progress line
and its final record give the same step and seconds, and a resumed run's clock goes on from its earlier sessions."""

import json
import logging
import re
import time

import pytest
import torch

from tokennet.data.text import LMBatches
from tokennet.models import create_model
from tokennet.train import TrainConfig, Trainer
from tokennet.train.budget import RunClock, process_started

LINE = re.compile(r"step (\d+)/\d+ · (\d+) s of (\d+) s")


def _trainer(tmp_path, clock=None, **cfg):
    torch.manual_seed(0)
    model = create_model("gpt-micro", vocab_size=17, block_size=8)
    ids = torch.randint(17, (500,), generator=torch.Generator().manual_seed(0))
    src = LMBatches(ids, 8, 4, seed=0)
    config = TrainConfig(**{"max_iters": 100_000, "warmup_iters": 2, "eval_interval": 0, "log_interval": 0,
                            "progress": False, **cfg})
    return Trainer(model, config, src, out_dir=tmp_path / "run", tokens_per_batch=32, clock=clock)


def test_run_clock_counts_earlier_sessions_and_keeps_the_reserve():
    clock = RunClock(budget=10.0, started=time.perf_counter() - 2.0, earlier=3.0, reserve=4.0)
    assert 5.0 <= clock.spent() < 5.5
    assert clock.train_until() == 6.0
    assert 0.5 < clock.left_for_training() <= 1.0
    assert RunClock().train_until() is None and RunClock().left_for_training() is None
    assert 0 <= time.perf_counter() - process_started() < 3600  # this process started before now


def test_a_reserve_per_step_moves_the_stop_earlier_with_every_step_and_the_schedule_sees_it():
    """What follows training may repeat its steps (vqa's baselines): each step keeps its share, and the stop the
    learning-rate schedule projects is where the clock and the steps' reserve meet the budget."""
    clock = RunClock(budget=100.0, reserve=10.0, reserve_per_step=0.1)
    assert clock.train_until() == 90.0 and clock.train_until(100) == 80.0
    # 100 steps in the 10 s since training began (10 a second): the stop is 30 s on, where 50 s + 0.1 s × 400 steps
    # meets 90 s
    assert clock.projected_stop(now=20.0, begun=10.0, steps=100) == pytest.approx(50.0)
    assert clock.projected_stop(now=10.0, begun=10.0, steps=0) == 90.0  # no pace yet: the fixed reserve's stop
    assert RunClock(budget=100.0, reserve=10.0).projected_stop(now=20.0, begun=10.0, steps=100) == 90.0
    assert RunClock().projected_stop(now=20.0, begun=10.0, steps=100) is None


def test_a_trainer_keeps_each_steps_reserve_and_its_schedule_ends_at_the_stop(tmp_path):
    trainer = _trainer(tmp_path, time_budget=4.0, schedule="cosine", lr=1e-3, min_lr=1e-5, log_interval=1)
    # 0.5 s spent before training, 0.5 s reserved, and as long again per step as a step takes (about): training
    # stops near the middle of the 3 s it would have
    trainer.clock = RunClock(budget=4.0, started=time.perf_counter() - 0.5, reserve=0.5, reserve_per_step=0.02)
    final = trainer.fit()
    steps = final["step"]
    assert steps > 1
    assert final["run_seconds"] + 0.02 * steps <= 3.5 + 0.3  # a step whose share would end past the stop is not begun
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    lrs = [r["lr"] for r in records if "lr" in r]
    assert lrs and lrs[-1] < 0.2 * 1e-3  # the schedule followed the projected stop down, not the fixed reserve's


def test_stops_before_the_budget_and_the_last_line_is_the_final_record(tmp_path, caplog):
    trainer = _trainer(tmp_path, time_budget=4.5)
    # 1.5 s spent before training (the clock started earlier), 1 s reserved: training gets about 2 s
    trainer.clock = clock = RunClock(budget=4.5, started=time.perf_counter() - 1.5, reserve=1.0)
    with caplog.at_level(logging.INFO, logger="tokennet.train.trainer"):
        final = trainer.fit()
    assert final["step"] > 1
    assert final["run_seconds"] <= clock.train_until() + 0.3  # a step that would end past the stop is not begun
    last = [m for m in caplog.messages if LINE.search(m)][-1]
    step, seconds, budget = map(int, LINE.search(last).groups())
    assert (step, seconds, budget) == (final["step"], int(f"{final['run_seconds']:.0f}"), 4)  # 4.5 shown "4"
    assert seconds <= budget


def test_resumed_clock_goes_on_from_the_checkpoint(tmp_path, caplog):
    first = _trainer(tmp_path, max_iters=3)
    first.clock = RunClock(budget=60.0, started=time.perf_counter() - 5.0)
    first.fit()
    assert first.train_started >= 5.0  # the run's first step came after 5 s of preparation
    again = _trainer(tmp_path, RunClock(budget=60.0), max_iters=6)
    assert again.resume()
    assert again.clock.earlier >= 5.0 and again.train_started == first.train_started
    with caplog.at_level(logging.INFO, logger="tokennet.train.trainer"):
        final = again.fit()
    last = [m for m in caplog.messages if LINE.search(m)][-1]
    assert LINE.search(last).group(1) == "6" and LINE.search(last).group(2) == f"{final['run_seconds']:.0f}"
    assert final["run_seconds"] >= 5.0  # the earlier session's seconds are counted


def test_a_labelled_trainer_says_whose_steps_they_are(tmp_path, caplog):
    torch.manual_seed(0)
    trainer = _trainer(tmp_path, max_iters=2)
    trainer.label = "vqa-cnn baseline"
    with caplog.at_level(logging.INFO, logger="tokennet.train.trainer"):
        trainer.fit()
    assert any(m.startswith("vqa-cnn baseline: step 2/2 · ") for m in caplog.messages)
