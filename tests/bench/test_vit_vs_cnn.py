"""bench/vit_vs_cnn.py's sweep machinery on a tiny size: the budget grows with the data, early stopping stops,
the best weights are tested, and the results file keeps the contract ``tokennet demo claims`` reads."""

import json

import pytest
import torch
from support import load_bench

from tokennet.data.vision_data import load_digits

pytestmark = pytest.mark.usefixtures("one_thread")


def _bench():
    return load_bench("vit_vs_cnn")


B = _bench()
TINY_CNN = {"preset": "cnn", "widths": [8, 16], "depths": [1, 1], "stem_stride": 1}


def test_step_budget_scales_with_the_data_and_is_clamped():
    budgets = [B.step_budget(n, 64, epochs=10, min_steps=50, max_steps=500) for n in (64, 640, 1280, 6400)]
    assert budgets == [50, 100, 200, 500]  # 10 × 1 step clamped up, 10 × 10, 10 × 20, 10 × 100 clamped down
    assert B.step_budget(30, 64, epochs=10, min_steps=1, max_steps=500) == 10  # a batch of 30: 1 step per epoch


def test_validation_is_held_out_of_the_pool():
    full = load_digits()
    pool, xv, yv = B.split_validation(full, 100)
    assert len(yv) == 100 and len(pool.y_train) == len(full.y_train) - 100
    flat = lambda x: {tuple(r.flatten().tolist()) for r in x}  # noqa: E731
    # digits repeat a little, so compare counts: every validation image is a training image not in the pool
    assert len(pool.y_train) + len(yv) == len(full.y_train)
    assert flat(xv) <= flat(full.x_train)
    with pytest.raises(B.DataError, match="val-size"):
        B.split_validation(full, len(full.y_train))


def test_early_stopping_stops_and_learning_runs_to_the_best_weights():
    pool, xv, yv = B.split_validation(load_digits(), 100)
    data = B.subset(pool, 200, seed=0)
    # lr 0: the validation accuracy never improves after the first evaluation, so patience 2 stops at 3 × 5 steps
    frozen = B.fit_to_convergence(data, xv, yv, model=TINY_CNN, max_steps=200, eval_every=5, patience=2, lr=0.0)
    assert frozen["steps"] == 15 and frozen["stopped_early"] and frozen["best_step"] == 5
    learnt = B.fit_to_convergence(data, xv, yv, model=TINY_CNN, max_steps=80, eval_every=20, patience=100, lr=5e-3)
    assert learnt["steps"] == 80 and not learnt["stopped_early"]
    assert learnt["val_accuracy"] > 0.4 and learnt["test_accuracy"] > 0.3 > frozen["test_accuracy"]  # chance: 0.1


def test_claim_verdicts():
    row = lambda n, v, c: {"train_size": n, "vit": v, "cnn": c}  # noqa: E731
    crossed = B.claim([row(50, 0.5, 0.8), row(500, 0.9, 0.85)], "digits")
    assert crossed["holds"] is True and "cross between 50 and 500" in crossed["verdict"]
    narrowing = B.claim([row(50, 0.5, 0.8), row(500, 0.8, 0.9)], "digits")
    assert narrowing["holds"] is None and "no crossing" in narrowing["verdict"]
    widening = B.claim([row(50, 0.7, 0.8), row(500, 0.6, 0.9)], "digits")
    assert widening["holds"] is False
    assert "ViT 50.0%, CNN 80.0%" in crossed["measured"]
    # a larger budget that lifts the ViT by > 2 points: no crossing is then "not decided", never "does not hold"
    check = {"train_size": 500, "vit": 0.7, "cnn": 0.9, "epochs": 300, "base_epochs": 150}
    limited = B.claim([row(50, 0.7, 0.8), row(500, 0.6, 0.9)], "digits", check)
    assert limited["holds"] is None and "budget-limited" in limited["measured"] and limited["vit_budget_gain"] > 0.02
    flat = B.claim([row(50, 0.7, 0.8), row(500, 0.6, 0.9)], "digits", {**check, "vit": 0.605})
    assert flat["holds"] is False and "budget-limited" not in flat["measured"]
    assert "converged: at 500 images 300 epochs instead of 150 leave the ViT at 60.5%" in flat["measured"]


def test_the_results_file_keeps_the_contract(tmp_path):
    out = tmp_path / "vit_vs_cnn.json"
    rc = B.main(["--sizes", "20", "200", "--seeds", "0", "--epochs", "4", "--min-steps", "4", "--max-steps", "12",
                 "--vit-dim", "16", "--vit-layers", "1", "--cnn-widths", "8", "16", "--val-size", "50",
                 "--budget-check", "20", "--out", str(out)])
    assert rc == 0
    r = json.loads(out.read_text())
    assert set(r["claim"]) >= {"holds", "measured", "run"} and r["claim"]["holds"] in (True, False, None)
    assert r["claim"]["measured"] and "digits" in r["claim"]["run"]
    assert r["command"].startswith("python bench/vit_vs_cnn.py") and "cpu" in r["machine"] and "commit" in r
    sizes = [x["train_size"] for x in r["rows"]]
    assert sizes == [20, 200] and r["rows"][0]["max_steps"] < r["rows"][1]["max_steps"]  # the budget scaled
    for x in r["rows"]:
        for k in ("vit", "cnn"):
            assert 0 <= x[k] <= 1 and len(x[f"{k}_runs"]) == 1 and x[f"{k}_runs"][0]["steps"] <= x["max_steps"]
    check = r["budget_check"]
    assert check["train_size"] == 20 and check["epochs"] == 8 and check["vit_runs"][0]["max_steps"] == 8  # 2 × 4
    assert out.with_suffix(".png").stat().st_size > 0
    assert torch.get_num_threads() == 1
