"""bench/vqa_generic.py on tiny settings: trials of the generic transformer recorded with their curves, the best
one tested on a seed, no knob that builds the task in, bad settings refused in one line with nothing written."""

import json

import pytest
from support import load_bench

pytestmark = pytest.mark.usefixtures("one_thread")


def _bench():
    return load_bench("vqa_generic")


def test_trials_are_recorded_with_curves_and_the_best_is_tested_on_its_seeds(tmp_path):
    from tokennet.recipes.vqa import GENERIC

    b = _bench()
    assert not set(b.KNOBS) & set(GENERIC)  # tuning the generic model, never a piece built for the task
    out = tmp_path / "generic.json"
    argv = ["--trials", "2", "--steps", "3", "--eval-every", "2", "--batch-size", "4", "--confirm-seeds", "0",
            "--out", str(out)]
    assert b.main(argv) == 0
    record = json.loads(out.read_text())
    assert record["command"] == "python bench/vqa_generic.py " + " ".join(argv) and record["machine"]["cpu"]
    trials = record["trials"]
    assert len(trials) == 2 and {k: trials[0][k] for k in b.KNOBS} == {**b.FIRST, "steps": 3}
    for trial in trials:
        assert [p["step"] for p in trial["curve"]] == [2, 3] and "same_species" in trial["curve"][0]
        assert 0 <= trial["val_exact_match"] <= 100
    assert record["chosen"] in [{k: t[k] for k in b.KNOBS} for t in trials]
    assert [s["seed"] for s in record["seeds"]] == [0] and "exact_match_same_species" in record["median"]
    assert record["generic"] == GENERIC


def test_given_trials_run_instead_of_drawn_ones_and_a_bad_one_is_refused(tmp_path, capsys):
    b = _bench()
    out = tmp_path / "given.json"
    argv = ["--trial", "lr=2e-3,schedule=wsd,steps=2", "--trial", "dim=32,steps=2", "--eval-every", "0",
            "--batch-size", "4", "--confirm-seeds", "--out", str(out)]
    assert b.main(argv) == 0
    trials = json.loads(out.read_text())["trials"]
    assert [{k: t[k] for k in b.KNOBS} for t in trials] == [{**b.FIRST, "lr": 2e-3, "schedule": "wsd", "steps": 2},
                                                            {**b.FIRST, "dim": 32, "steps": 2}]
    for bad, fragment in [("width=2", "KNOB one of dim"), ("steps=1.5", "whole number"), ("lr=fast", "a number")]:
        with pytest.raises(SystemExit) as exit_:
            b.parse(["--trial", bad, "--out", str(tmp_path / "bad.json")])
        assert exit_.value.code == 2 and fragment in capsys.readouterr().err
    assert not (tmp_path / "bad.json").exists()


@pytest.mark.parametrize("argv", [["--trials", "0"], ["--steps", "0"], ["--batch-size", "1"]])
def test_bad_settings_are_one_line_and_write_nothing(tmp_path, capsys, argv):
    out = tmp_path / "generic.json"
    assert _bench().main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err and not out.exists()
