"""bench/deit.py across data sizes: a teacher trained on each size's own images, the rows at that size, the CNN of
the same budget beside them, one table over the sizes; and the refusals (one teacher for several sizes)."""

import json

import pytest
from support import load_bench


def test_a_size_gets_its_own_teacher_rows_and_the_cnn_of_the_same_budget(tmp_path, capsys):
    """One size (three processes of a few steps; two sizes' table is test_medians_…'s): the teacher learnt from the
    student's 64 images, the distillation row read that teacher, the CNN row is the ViT run's baseline."""
    bench = load_bench("deit")
    results = tmp_path / "deit-digits.json"
    assert bench.main(["--data", "digits", "--sizes", "64", "--steps", "3", "--teacher-recipe", "cnn",
                       "--rows", "ViT", "+ distillation", "--threads", "1",
                       "--out", str(tmp_path / "runs"), "--results", str(results)]) == 0
    record = json.loads(results.read_text())
    assert record["steps"] == 3 and [(r["train_size"], r["seed"]) for r in record["results"]] == [(64, 0)]
    for size, result in zip((64,), record["results"]):
        rows = result["rows"]
        assert set(rows) == {"teacher", "ViT", "+ distillation", "CNN, same budget"}
        assert {row["train_size"] for row in rows.values()} == {size}  # the teacher learnt from the student's images
        assert "train cnn" in rows["teacher"]["command"] and result["teacher"] in rows["+ distillation"]["command"]
        # the same teacher evaluated in two processes; a 3-step teacher's near-tied logits may flip an image or two
        assert rows["+ distillation"]["teacher_test_accuracy"] == pytest.approx(rows["teacher"]["test_accuracy"],
                                                                                abs=2 / 899)
        assert rows["CNN, same budget"]["test_accuracy"] == rows["ViT"]["baseline_cnn_accuracy"]
    table = capsys.readouterr().out
    assert "| row | 64 |" in table and "| + distillation |" in table and set(record["medians"]) == {"64"}
    assert record["claim"] == bench.claim(record["medians"])


def _summary(vit: dict, deit: dict, size: str = "100") -> dict:
    def cell(per_seed):
        return {"per_seed": per_seed, "median": sorted(per_seed.values())[len(per_seed) // 2]}
    return {size: {"ViT": cell(vit), "+ distillation": cell(deit)}, "898": {"ViT": cell({"0": 0.98}),
                                                                             "+ distillation": cell({"0": 0.97})}}


def test_the_claim_holds_only_when_deit_wins_every_seed_by_two_points_at_the_smallest_size():
    bench = load_bench("deit")
    wins = bench.claim(_summary({"0": 0.83, "1": 0.80, "2": 0.85}, {"0": 0.91, "1": 0.90, "2": 0.88}))
    assert wins["holds"] is True and wins["measured"].startswith("100 images: DeiT 90.0% against the plain ViT's 83.0%")
    assert "898 images: 97.0% against 98.0%" in wins["measured"]
    one_seed_lost = bench.claim(_summary({"0": 0.83, "1": 0.80, "2": 0.89}, {"0": 0.91, "1": 0.90, "2": 0.88}))
    assert one_seed_lost["holds"] is False and "higher on 2 of 3 seeds" in one_seed_lost["measured"]
    too_small = bench.claim(_summary({"0": 0.83}, {"0": 0.84}))
    assert too_small["holds"] is False
    no_pair = bench.claim({"100": {"ViT": {"per_seed": {"0": 0.8}, "median": 0.8}}})
    assert no_pair["holds"] is None


def test_rejudge_recomputes_the_claim_without_training_and_keeps_the_measurement(tmp_path, capsys):
    bench = load_bench("deit")
    results = tmp_path / "deit-digits.json"
    rows = {"ViT": {"test_accuracy": 0.8, "train_size": 100}, "+ distillation": {"test_accuracy": 0.9,
                                                                                 "train_size": 100}}
    results.write_text(json.dumps({"command": "python bench/deit.py --sizes 100", "commit": "abc", "data": "digits",
                                   "steps": 5, "results": [{"train_size": 100, "seed": 0, "rows": rows}]}))
    assert bench.main(["--data", "digits", "--rejudge", "--results", str(results)]) == 0
    record = json.loads(results.read_text())
    assert (record["command"], record["commit"]) == ("python bench/deit.py --sizes 100", "abc")
    assert record["claim"]["holds"] is True and record["medians"]["100"]["ViT"]["median"] == 0.8
    assert "claim: holds: 100 images" in capsys.readouterr().out
    with pytest.raises(SystemExit) as stop:
        bench.main(["--data", "digits", "--rejudge", "--results", str(tmp_path / "absent.json")])
    assert stop.value.code == 2


def test_one_teacher_for_several_sizes_is_refused(tmp_path, capsys):
    bench = load_bench("deit")
    with pytest.raises(SystemExit) as stop:
        bench.main(["--data", "digits", "--sizes", "64", "0", "--teacher", str(tmp_path), "--results",
                    str(tmp_path / "x.json")])
    assert stop.value.code == 2 and "one teacher for one size" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_medians_are_per_size_and_row_over_the_seeds():
    bench = load_bench("deit")
    results = [{"train_size": size, "seed": seed, "teacher": "t",
                "rows": {"ViT": {"test_accuracy": acc, "train_size": size or 898}}}
               for size, accs in ((100, (0.8, 0.9, 0.7)), (0, (0.95, 0.97, 0.96))) for seed, acc in enumerate(accs)]
    summary = bench.medians(results)
    assert list(summary) == ["100", "898"]
    assert summary["100"]["ViT"] == {"per_seed": {"0": 0.8, "1": 0.9, "2": 0.7}, "median": 0.8}
    assert summary["898"]["ViT"]["median"] == 0.96
    assert "| ViT | 0.8000 | 0.9600 |" in bench.table(summary, "digits", 10)
