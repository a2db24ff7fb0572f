"""bench/vqa_default.py: each seed's run is ``tokennet train vqa`` with the settings ``--set`` passes on, and the JSON
records them beside the per-seed metrics it collects."""

import json
from pathlib import Path

from support import load_bench


def _bench():
    return load_bench("vqa_default")


def test_set_reaches_every_runs_command_and_the_json(tmp_path, monkeypatch):
    bench = _bench()
    commands, real_run = [], bench.subprocess.run

    def fake_train(cmd, **kwargs):  # stands for tokennet train: writes the metrics a run would
        if "train" not in cmd:  # git, for the commit the JSON records
            return real_run(cmd, **kwargs)
        commands.append(cmd)
        out = Path(cmd[cmd.index("--out") + 1])
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.json").write_text(json.dumps({"exact_match": 90.0, "exact_match_same_species": 80.0,
                                                       "head_distance_min": 10.0, "head_distance_max": 30.0}))

    monkeypatch.setattr(bench.subprocess, "run", fake_train)
    out = tmp_path / "generic.json"
    argv = ["--seeds", "0", "1", "--runs-dir", str(tmp_path / "runs"), "--set", "transformer=generic",
            "baselines=false", "--out", str(out)]
    assert bench.main(argv) == 0
    assert len(commands) == 2 and all(cmd[-2:] == ["transformer=generic", "baselines=false"] for cmd in commands)
    record = json.loads(out.read_text())
    assert record["sets"] == ["transformer=generic", "baselines=false"]
    assert record["median"]["exact_match_same_species"] == 80.0 and record["median"]["head_distance_max"] == 30.0
    assert "transformer=generic" in record["runs"][0]["command"]
