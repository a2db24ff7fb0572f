"""Runs written before data specs (tests/fixtures/runs_0_1, made by the code of 91601a5) still load, evaluate
to their own metrics.json, draw and report with today's code."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from tokennet.cli import main
from tokennet.run import load

FIXTURES = Path(__file__).parent / "fixtures" / "runs_0_1"
RUNS = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
EXPECTED_KIND = {"gpt-char": "text", "vit": "images", "seq2seq": "dates", "caption": "shapes",
                 "graph": "marked-distance", "sphere": "sphere-images"}

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def run_dir(request, tmp_path):
    d = tmp_path / request.param
    shutil.copytree(FIXTURES / request.param, d)  # report and viz write into the run directory
    return d


def test_the_fixtures_are_there():
    assert set(RUNS) == set(EXPECTED_KIND)
    for name in RUNS:
        info = json.loads((FIXTURES / name / "run.json").read_text())
        assert "data_spec" not in info, f"{name} must be an old run (no data spec)"


@pytest.mark.parametrize("run_dir", RUNS, indirect=True)
def test_an_old_run_loads_with_a_data_spec_rebuilt_from_its_settings(run_dir):
    run = load(run_dir)
    assert run.data is not None and run.data.kind == EXPECTED_KIND[run_dir.name]
    assert run.verbs, "the task's verbs are there"


def test_the_old_gpt_char_run_trained_on_the_python_docs_not_on_todays_default():
    assert load(FIXTURES / "gpt-char").data.source == "python-docs"


@pytest.mark.parametrize("run_dir", RUNS, indirect=True)
def test_an_old_run_evaluates_to_its_own_metrics(run_dir, capsys):
    saved = json.loads((run_dir / "metrics.json").read_text())
    assert main(["-q", "eval", str(run_dir), "--device", "cpu"]) == 0
    fresh = json.loads(capsys.readouterr().out)
    common = [k for k in fresh if isinstance(fresh[k], float) and k in saved]
    assert common
    for k in common:
        assert math.isclose(saved[k], fresh[k], rel_tol=1e-5, abs_tol=1e-6), (k, saved[k], fresh[k])


@pytest.mark.parametrize("run_dir", RUNS, indirect=True)
def test_an_old_run_draws_and_reports(run_dir, capsys):
    assert main(["-q", "viz", str(run_dir)]) == 0
    assert all(Path(p).is_file() for p in capsys.readouterr().out.split())
    assert main(["-q", "report", str(run_dir)]) == 0
    text = (run_dir / "report.html").read_text(encoding="utf-8")
    assert "could not be drawn" not in text
