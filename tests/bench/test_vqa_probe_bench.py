"""bench/vqa_probe.py on a tiny trained vqa run of 8-pixel patches: the probe per cut and depth, the gain and what
each cut takes away, beside the run's patch size and metrics, written with the command and the machine."""

import json

import pytest
from support import load_bench

from tokennet.recipes import train

pytestmark = pytest.mark.usefixtures("one_thread")

VQA = {"dim": 32, "num_layers": 2, "num_heads": 2, "batch_size": 16, "max_iters": 20, "eval_interval": 0,
       "warmup_iters": 1, "test_size": 20, "unseen_size": 4, "val_size": 8, "progress": False, "baselines": False,
       "report": False, "patch_size": 8}


def test_the_bench_records_the_probe_per_cut_and_depth(tmp_path):
    run, _ = train("vqa", out=tmp_path / "vqa", sets=VQA, device="cpu")
    out = tmp_path / "probe.json"
    load_bench("vqa_probe").main(["--runs", str(run), "--pictures", "30", "--out", str(out)])
    record = json.loads(out.read_text())
    assert record["command"].startswith("python bench/vqa_probe.py") and record["machine"]["cpus"] >= 1
    (row,) = record["per_run"]
    probe = row["probe"]
    assert row["patch_size"] == 8 and probe["patches_per_animal"] > 1 and row["metrics"]["exact_match"] is not None
    assert len(probe["none"]) == len(probe["own"]) == len(probe["alike"]) == probe["depths"] == 3
    assert probe["gain"] == round(probe["none"][1] - probe["none"][0], 2)
    assert probe["own_cut_loss"] == [round(a - b, 2) for a, b in zip(probe["none"][1:], probe["own"][1:])]
