"""bench/patch_projection.py and bench/text_direction.py: the summaries of their runs (medians per row, the per-seed
difference), and the recorded files hold what the lecture audit restates (rows 92 and 93)."""

import json
from pathlib import Path

import pytest
from support import load_bench

ROOT = Path(__file__).resolve().parents[2]


def test_patch_projection_takes_the_median_over_seeds_per_projection():
    bench = load_bench("patch_projection")
    runs = [{"projection": name, "seed": seed, "test_accuracy": acc, "test_loss": 1 - acc, "num_parameters": 10}
            for name, accs in (("learned", (0.9, 0.8, 0.95)), ("dct", (0.7, 0.9, 0.85)))
            for seed, acc in enumerate(accs)]
    summary = bench.medians(runs)
    assert set(summary) == {"learned", "dct"}
    assert summary["learned"]["median_test_accuracy"] == 0.9 and summary["dct"]["median_test_accuracy"] == 0.85
    assert summary["dct"]["test_accuracies"] == [0.7, 0.9, 0.85]


def test_text_direction_pairs_each_seeds_directions():
    bench = load_bench("text_direction")
    runs = [{"direction": "forward", "seed": 0, "val_loss": 2.0}, {"direction": "reversed", "seed": 0, "val_loss": 2.1},
            {"direction": "forward", "seed": 1, "val_loss": 1.9}, {"direction": "reversed", "seed": 1, "val_loss": 1.8}]
    summary = bench.summarize(runs)
    assert summary["forward"]["median_val_loss"] == pytest.approx(1.95)
    assert summary["reversed_minus_forward"]["per_seed"] == {0: pytest.approx(0.1), 1: pytest.approx(-0.1)}


@pytest.mark.parametrize("name, rows", [("patch_projection", {"learned", "random", "dct"}),
                                        ("text_direction", {"forward", "reversed"})])
def test_the_recorded_files_have_every_row_and_three_seeds(name, rows):
    record = json.loads((ROOT / "bench" / "results" / f"{name}.json").read_text())
    assert record["command"].startswith(f"python bench/{name}.py") and record["commit"]
    key = "projection" if name == "patch_projection" else "direction"
    assert {run[key] for run in record["runs"]} == rows and record["settings"]["seeds"] == [0, 1, 2]
