"""`tokennet viz` on a graph run: one node's attention over the graph and the Laplacian positions."""

import pytest

from tokennet.cli import main
from tokennet.recipes import train

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = {"dim": 16, "num_layers": 2, "num_heads": 2, "batch_size": 8, "max_iters": 2, "eval_interval": 0,
        "warmup_iters": 1, "test_size": 6, "val_size": 4, "ablation": False, "progress": False}


def test_graph_pictures(tmp_path, capsys):
    run_dir, _ = train("graph", out=tmp_path / "g", sets=TINY, device="cpu")
    assert main(["viz", str(run_dir), "--out", str(tmp_path / "v"), "--index", "2", "--layer", "1"]) == 0
    files = capsys.readouterr().out.split()
    assert [f.rsplit("/", 1)[-1] for f in files] == ["node_attention.png", "laplacian_positions.png"]
    assert all(open(f, "rb").read(4) == b"\x89PNG" for f in files)
    assert main(["viz", str(run_dir), "--index", "99"]) == 2
    assert "index 99 out of range" in capsys.readouterr().err
    assert main(["viz", str(run_dir), "--patch", "40"]) == 2
    assert "node 40 out of range" in capsys.readouterr().err


def test_report_has_the_graph_panel(tmp_path):
    import json
    import re

    from tokennet.viz.report import write_report

    run_dir, metrics = train("graph", out=tmp_path / "g", sets={**TINY, "ablation": True, "report": False},
                             device="cpu")
    html = write_report(run_dir).read_text()
    assert "Structure ablation" in html and "node attention" in html
    shown = dict(re.findall(r'data-metric="ablation\.([^"]+)">([^<]+)<', html))
    assert {k: json.loads(v) for k, v in shown.items()} == metrics["ablation"]
