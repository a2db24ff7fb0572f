"""bench/vqa_receptive_field.py --curves on tiny settings: every model's learning curve per seed, the same tuning trials
for every family recorded, the JSON's provenance and figures, and claim 15 reading what it wrote."""

import json
from pathlib import Path

import pytest
from support import load_bench

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    return load_bench("vqa_receptive_field")


def test_the_trial_plan_is_the_same_for_every_family_and_starts_at_the_defaults():
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    from _vqa_train import trial_plan

    knobs = {"lr": (1e-3, 3e-3), "width": (0.5, 1.0), "depth": (0, 1)}
    plan = trial_plan(4, 0, knobs, {"lr": 3e-3, "width": 1.0, "depth": 0})
    assert plan[0] == {"lr": 3e-3, "width": 1.0, "depth": 0} and len({json.dumps(t) for t in plan}) == 4
    assert plan == trial_plan(4, 0, knobs, {"lr": 3e-3, "width": 1.0, "depth": 0})  # seeded
    assert len(trial_plan(100, 0, knobs, plan[0])) == 8 and trial_plan(0, 0, knobs, plan[0]) == []


def test_tuning_ranks_pairs_the_noise_of_chance_explains_as_chance_and_then_species_decides():
    choose = _bench().choose
    guessing = [{"lr": 1e-3, "val_same_species": 53.0, "val_species": 83.0},
                {"lr": 3e-3, "val_same_species": 50.0, "val_species": 99.0}]
    assert choose(guessing, 100)["lr"] == 3e-3  # 53 % on 100 pairs is within 2 sigma (10 points) of chance
    learning = [{"lr": 1e-3, "val_same_species": 75.0, "val_species": 60.0},
                {"lr": 3e-3, "val_same_species": 50.0, "val_species": 99.0}]
    assert choose(learning, 100)["lr"] == 1e-3  # a trial that compares the corners wins over one that only names
    assert choose(guessing, 10_000)["lr"] == 1e-3  # on 10,000 pairs 3 points are well outside chance's noise


# The recipe's baselines' family trained in two worker processes (--jobs 2), and the one-unit family here.
@pytest.mark.parametrize(("family", "large", "jobs"), [("field", 68, 2), ("unit", 64, 1)])
def test_curves_per_model_and_seed_tuning_recorded_and_the_claim_reads_them(tmp_path, capsys, family, large, jobs):
    from tokennet.demos.claims.corner_pairs import FILE, claim_corner_pairs

    out = tmp_path / FILE
    argv = ["--curves", "--transformer", "generic", "--family", family, "--fields", "20", str(large), "--steps", "4",
            "--eval-every", "2", "--trials", "2", "--tune-steps", "2", "--seeds", "0", "1", "--test-size", "8",
            "--val-size", "8", "--batch-size", "4", "--jobs", str(jobs), "--out", str(out)]
    assert _bench().main(argv) == 0
    record = json.loads(out.read_text())
    assert record["command"] == "python bench/vqa_receptive_field.py " + " ".join(argv)
    assert record["commit"] and record["machine"]["cpu"] and record["settings"]["seeds"] == [0, 1]
    assert record["settings"]["transformer"] == "generic"  # claim 15 reads the recipe default's curves
    rows = record["rows"]
    assert [(r["family"], r["receptive_field"], r["seed"]) for r in rows] == [
        ("transformer", 64, 0), ("transformer", 64, 1), (family, 20, 0), (family, 20, 1), (family, large, 0),
        (family, large, 1)]
    for r in rows:
        assert [p["step"] for p in r["curve"]] == [2, 4] and [p["examples"] for p in r["curve"]] == [8, 16]
        assert all(0 <= p["same_species"] <= 100 and p["seconds"] > 0 for p in r["curve"])
    tuning = record["tuning"]
    assert set(tuning) == {"transformer", family} and tuning[family]["field"] == large
    assert all("chance" in tuned["rule"] for tuned in tuning.values())
    for tuned in tuning.values():
        assert len(tuned["trials"]) == 2 and tuned["chosen"] in [{k: t[k] for k in ("lr", "width", "depth")}
                                                                 for t in tuned["trials"]]
    # the same budget: the same learning rates and widths tried, in the same order
    assert [(t["lr"], t["width"]) for t in tuning["transformer"]["trials"]] == \
        [(t["lr"], t["width"]) for t in tuning[family]["trials"]]
    assert {(s["family"], s["receptive_field"]) for s in record["summary"]} == {("transformer", 64), (family, 20),
                                                                                (family, large)}
    if family == "field":  # fields that differ in stages alone: one width, 20 px and 68 px
        assert len({r["width"] for r in rows if r["family"] == "field"}) == 1
        assert {r["layers"] for r in rows if r["family"] == "field"} == {3, 5}
    assert set(record["verdicts"]) == {"a", "b", "c"}
    assert out.with_suffix(".png").is_file() and out.with_name(out.stem + "_curves.png").is_file()
    assert "examples to 75 %" in capsys.readouterr().out
    result = claim_corner_pairs(0, results_dir=tmp_path)
    assert result.source.startswith(f"from bench/results/{FILE}") and len(result.table) == 4
    assert result.data["verdicts"] == record["verdicts"]
