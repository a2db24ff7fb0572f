"""``generate``'s tables: each task that prints one declares its fields (``Task.columns``), ``generate --help`` lists
them, the printed lines have exactly those fields, and ``--json`` prints each line as an object of them; a run
that prints text refuses ``--json`` in one line."""

import json

import pytest

from tokennet.cli import build_parser, main
from tokennet.recipes import get_recipe, train
from tokennet.run import load
from tokennet.tasks.graph import write_graphs

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def graph_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("generate-json")
    sets = {**get_recipe("graph").smoke, "max_iters": 2, "eval_interval": 0, "warmup_iters": 1, "report": False,
            "progress": False}
    out, _ = train("graph", out=root / "graph", sets=sets)
    graphs = write_graphs(load(out).data.held_out()[0], root / "graphs.json")  # every held-out graph
    return out, graphs


def test_graph_predictions_as_a_table_and_as_json(graph_run, capsys):
    run_dir, graphs = graph_run
    assert main(["-q", "generate", str(run_dir), "--graphs", str(graphs)]) == 0
    lines = capsys.readouterr().out.splitlines()
    columns = load(run_dir).task.table_columns(load(run_dir))
    assert columns == ("graph", "class", "probability")
    assert len(lines) > 1 and all(len(line.split("\t")) == len(columns) for line in lines)

    assert main(["-q", "generate", str(run_dir), "--graphs", str(graphs), "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [list(r) for r in records] == [list(columns)] * len(lines)
    assert [r["graph"] for r in records] == list(range(len(lines))) and all(0 <= r["probability"] <= 1 for r in records)
    assert [f"{r['graph']}\t{r['class']}\t{r['probability']:.4f}" for r in records] == lines  # the same answers


def test_help_lists_every_table_and_text_runs_refuse_json(tmp_path, capsys):
    helps = build_parser()._subparsers._group_actions[0].choices["generate"].description
    for fields in ("file, class, probability", "file, class, name, probability", "graph, class, probability"):
        assert fields in helps
    sets = {**get_recipe("gpt-char").smoke, "max_iters": 1, "eval_interval": 0, "sample_tokens": 0, "report": False,
            "progress": False}
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a b c d e f g h " * 200)
    out, _ = train("gpt-char", data=str(corpus), out=tmp_path / "lm", sets=sets)
    assert main(["generate", str(out), "--prompt", "a", "--max-new-tokens", "2", "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"tokennet: error: --json: {out} prints text, not a table (language model)"]
