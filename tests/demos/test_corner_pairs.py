"""Claim 15 (``tokennet demo claims --only receptive-field``): the lecture's three predictions about the corner pairs,
judged from small synthetic learning-curve records — each verdict able to come out either way — and "not recorded"
when the bench's file is absent or holds no curves."""

import json

import pytest

from tokennet.cli import main
from tokennet.demos.claims import claims
from tokennet.demos.claims.corner_pairs import (
    FILE,
    claim_corner_pairs,
    examples_to,
    median_examples,
    median_interval,
    summarize,
    verdicts,
)


def _curve(points: list[tuple[int, float]]) -> list[dict]:
    return [{"step": n // 64, "examples": n, "seconds": n / 1000, "same_species": em, "species": 90.0}
            for n, em in points]


def _row(family: str, field: int, seed: int, points: list[tuple[int, float]]) -> dict:
    return {"model": "transformer" if family == "transformer" else "cnn", "family": family, "seed": seed,
            "receptive_field": field, "same_species": points[-1][1], "species": 90.0, "curve": _curve(points)}


def _record(transformer, small, covering) -> dict:
    rows = []
    for seed in range(3):
        rows += [_row("transformer", 64, seed, transformer), _row("unit", 20, seed, small),
                 _row("unit", 64, seed, covering)]
    return {"rows": rows, "command": "python bench/vqa_receptive_field.py --curves", "commit": "0123456789abcdef",
            "machine": {"cpus": 2}}


DYE = _record(transformer=[(1000, 60.0), (2000, 80.0), (4000, 95.0)],
              small=[(1000, 50.0), (2000, 51.0), (4000, 49.0)],
              covering=[(1000, 50.0), (2000, 55.0), (4000, 78.0)])


def test_examples_to_a_level_and_their_median_over_seeds():
    curve = _curve([(1000, 60.0), (2000, 75.0), (3000, 92.0)])
    assert (examples_to(curve, 75), examples_to(curve, 90), examples_to(curve, 99)) == (2000, 3000, None)
    assert median_examples([3000, 1000, 2000]) == 2000
    assert median_examples([1000, None, 3000]) == 3000  # a seed that never reached it is the latest
    assert median_examples([1000, None, None]) is None and median_examples([]) is None
    assert median_examples([1000, 3000]) == 2000


def test_the_interval_for_the_median_is_the_narrowest_order_statistics_that_cover_it():
    # n = 5: only (min, max) covers 90 % (1 − 2/32 = 93.75 %); n = 10: (x_2, x_9), 1 − 2·11/1024 = 97.85 %
    assert median_interval([5000, 1000, None, 3000, 2000]) == ([1000, None], 0.9375)  # one seed never got there
    assert median_interval(list(range(10, 0, -1))) == ([2, 9], 0.9785)
    assert median_interval([1, 2, 3]) == ([1, 3], 0.75)  # too few seeds for 90 %: the range, and its coverage
    assert median_interval([]) == ([None, None], 0.0)


def test_the_dye_bleeding_slowly_holds_on_curves_that_show_it():
    found = verdicts(DYE)
    assert [found[k]["holds"] for k in "abc"] == [True, True, True], found
    summary = summarize(DYE["rows"])
    assert summary[("unit", 64)]["examples_to_75"] == 4000 and summary[("transformer", 64)]["examples_to_75"] == 2000
    assert summary[("unit", 20)]["examples_to_75"] is None and summary[("unit", 20)]["seeds"] == [0, 1, 2]


def test_each_prediction_the_measurements_contradict_is_reported_as_not_holding():
    record = _record(transformer=[(1000, 60.0), (2000, 70.0), (4000, 80.0)],
                     small=[(1000, 55.0), (2000, 62.0), (4000, 70.0)],  # a small field well above chance
                     covering=[(1000, 76.0), (2000, 85.0), (4000, 90.0)])  # the covering CNN there first
    found = verdicts(record)
    assert [found[k]["holds"] for k in "abc"] == [False, False, False], found
    assert "unit CNN, 20 px 70.0 %" in found["a"]["measured"]
    assert "reached 75 % after 1,000 examples" in found["b"]["measured"]
    assert "layers deep" not in found["c"]["measured"]  # the record does not say how deep
    for row in record["rows"]:
        row["layers"] = 3 if row["family"] == "transformer" else 5
    assert found["c"]["measured"] + " — its 64-px field is only 5 layers deep" == verdicts(record)["c"]["measured"]
    at_chance = verdicts(_record([(1000, 60.0), (2000, 80.0)], [(1000, 50.0), (2000, 50.0)],
                                 [(1000, 50.0), (2000, 52.0)]))
    assert at_chance["b"]["holds"] is False and at_chance["c"]["holds"] is True  # covering, but at chance


def test_a_transformer_that_never_gets_there_leaves_b_undecided_and_c_not_holding():
    found = verdicts(_record([(1000, 55.0), (2000, 70.0)], [(1000, 50.0), (2000, 50.0)],
                             [(1000, 50.0), (2000, 65.0)]))
    assert found["b"]["holds"] is None and "not decided" in found["b"]["measured"]
    assert found["c"]["holds"] is False and "never reached 75 %" in found["c"]["measured"]


def test_the_claim_reads_the_recorded_curves_or_says_not_recorded(tmp_path):
    absent = claim_corner_pairs(0, results_dir=tmp_path)
    assert (absent.holds, absent.measured) == (None, "not measured here")
    assert absent.run.startswith("not recorded: run python bench/vqa_receptive_field.py --curves")
    (tmp_path / FILE).write_text(json.dumps({"rows": [{"model": "cnn", "receptive_field": 20, "same_species": 50}]}))
    old = claim_corner_pairs(0, results_dir=tmp_path)  # a sweep recorded before the curves were
    assert old.holds is None and old.run.startswith("not recorded: it holds no learning curves")
    (tmp_path / FILE).write_text("{not json")
    assert claim_corner_pairs(0, results_dir=tmp_path).run.startswith("unreadable")
    (tmp_path / FILE).write_text(json.dumps(DYE))
    read = claim_corner_pairs(0, results_dir=tmp_path)
    assert read.holds is True and read.figure.startswith(b"\x89PNG")
    assert read.source == f"from bench/results/{FILE}, measured at commit 0123456789ab"
    assert read.measured.count("holds") == 3
    assert read.table[0][-2:] == ["examples to 75 % (median, interval)", "examples to 90 % (median, interval)"]
    assert ["unit", "64", "3", "78.0", "4,000 (4,000 – 4,000, 75 %)", "not reached (not reached – not reached, 75 %)"
            ] in read.table
    bad = _record([(1000, 60.0), (2000, 80.0)], [(1000, 70.0), (2000, 71.0)], [(1000, 60.0), (2000, 80.0)])
    (tmp_path / FILE).write_text(json.dumps(bad))
    assert claim_corner_pairs(0, results_dir=tmp_path).holds is False


def test_the_claim_is_registered_and_runs_from_the_command_line(tmp_path, monkeypatch, capsys):
    from tokennet.demos.claims import corner_pairs

    claim = next(c for c in claims() if c.name == "receptive-field")
    assert claim.number == "15" and claim.quote.startswith('"is the top right bird')
    monkeypatch.setattr(corner_pairs, "bench_results_dir", lambda: tmp_path)
    assert main(["demo", "claims", "--only", "receptive-field", "--out", str(tmp_path / "out")]) == 0
    metrics = json.loads((tmp_path / "out" / "claims.json").read_text())
    assert metrics["claims"]["receptive-field"]["holds"] is None
    assert "not measured" in capsys.readouterr().out


@pytest.mark.parametrize("field", ["rows", "curve"])
def test_a_damaged_record_is_unreadable_not_a_crash(tmp_path, field):
    record = json.loads(json.dumps(DYE))
    if field == "rows":
        record["rows"] = "x"
    else:
        record["rows"][0]["curve"] = [{"examples": "x"}]
    (tmp_path / FILE).write_text(json.dumps(record))
    result = claim_corner_pairs(0, results_dir=tmp_path)
    assert result.holds is None and result.measured == "not measured here"
