"""bench/screen.py: one tokennet train process per probe, its metric, steps, wall and evaluations added to the
screen's file (a probe measured again replaces its entry), and a command that is not train refused."""

import json

from support import load_bench, setting_value

from tokennet.recipes import get_recipe


def test_probes_are_added_and_a_probe_measured_again_replaces_its_entry(tmp_path, capsys):
    bench = load_bench("screen")
    sets = {**get_recipe("graph").smoke, "max_iters": 4, "eval_interval": 2, "report": False}
    train = ["train", "graph", "--seed", "0", "--set", *(f"{k}={setting_value(v)}" for k, v in sets.items())]
    out = tmp_path / "screen.json"
    for name in ("base", "again", "base"):
        assert bench.main(["--out", str(out), "--name", name, "--metric", "val_accuracy", "--", *train]) == 0
    screen = json.loads(out.read_text())
    assert [r["name"] for r in screen["runs"]] == ["again", "base"] and screen["metric"] == "val_accuracy"
    run = screen["runs"][-1]
    assert run["steps"] == 4 and run["wall_s"] > 0 and run["command"].startswith("tokennet train graph")
    assert [e["step"] for e in run["evaluations"]] == [2, 4]
    assert run["evaluations"][-1]["val_accuracy"] == run["val_accuracy"]  # the final metric is the last evaluation's
    assert "| base |" in capsys.readouterr().out
    assert bench.main(["--out", str(out), "--name", "x", "--metric", "val_loss", "--", *train]) == 2  # another metric
    assert bench.main(["--out", str(out), "--name", "x", "--metric", "val_accuracy", "--", "eval", "run"]) == 2
