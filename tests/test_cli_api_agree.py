"""One behaviour for the command line and the API: what ``tokennet generate`` prints is what a verb returns, for the
same run and options (issue 61; docs/python-api.md has the table); and ``eval`` refuses, in one line, a flag the run
cannot use."""

from __future__ import annotations

import pytest

import tokennet
from tokennet.cli import main
from tokennet.lifecycle import get_recipe
from tokennet.recipes import train
from tokennet.tasks.graph import write_graphs

pytestmark = pytest.mark.usefixtures("one_thread")

QUICK = {"max_iters": 2, "eval_interval": 0, "progress": False, "report": False}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus):
    root = tmp_path_factory.mktemp("agree")
    out = {}
    out["lm"], _ = train("gpt-char", data=str(corpus), out=root / "lm", sets={**get_recipe("gpt-char").smoke, **QUICK})
    out["graph"], _ = train("graph", out=root / "graph", sets={**get_recipe("graph").smoke, **QUICK})
    smoke = {k: v for k, v in get_recipe("multimodal").smoke.items() if not k.startswith("sphere_")}
    out["multimodal"], _ = train("multimodal", out=root / "mm", sets={**smoke, **QUICK, "tasks": "text,graph"})
    return out


def _printed(capsys, argv) -> str:
    capsys.readouterr()
    assert main(argv) == 0
    return capsys.readouterr().out


def _rows(text: str) -> list[tuple[int, float]]:
    """``index<TAB>class<TAB>probability`` lines as ``(class, probability)``."""
    rows = [line.split("\t") for line in text.splitlines() if line[:1].isdigit()]
    return [(int(row[1]), float(row[2])) for row in rows]


@pytest.mark.parametrize("kind", ["lm", "multimodal"])
def test_generate_prints_the_prompt_and_what_run_generate_returns(kind, runs, capsys):
    run = tokennet.load(runs[kind])
    printed = _printed(capsys, ["generate", str(runs[kind]), "--prompt", "line 1", "--max-new-tokens", "12",
                                "--temperature", "0", "--no-compile"])
    continuation = run.generate("line 1", 12, temperature=0, compile=False)
    assert printed == run.generate("line 1", 12, temperature=0, compile=False, include_prompt=True) + "\n"
    assert printed == "line 1" + continuation + "\n"  # the default leaves the prompt out, as it always did
    both = run.generate(["line 1", "line 2"], 6, temperature=0, include_prompt=True)
    assert [text[:6] for text in both] == ["line 1", "line 2"]


@pytest.mark.parametrize("kind", ["graph", "multimodal"])
def test_a_graph_classifier_prints_run_classify_and_run_predict_returns_its_logits(kind, runs, tmp_path, capsys):
    run = tokennet.load(runs[kind])
    spec = run.data.part("graph") if kind == "multimodal" else run.data
    graphs = str(write_graphs(spec.held_out()[0], tmp_path / "graphs.json", items=range(3)))
    printed = _rows(_printed(capsys, ["generate", str(runs[kind]), "--graphs", graphs]))
    classified = run.classify(graphs)
    assert [label for label, _ in printed] == [label for label, _ in classified]
    assert [round(prob, 4) for _, prob in classified] == [prob for _, prob in printed]
    logits = run.predict(graphs)  # more than the command prints: the raw outputs it computes them from
    assert logits.shape[0] == 3 and logits.argmax(-1).tolist() == [label for label, _ in printed]


@pytest.mark.parametrize("kind, argv, fragment", [
    ("graph", ["--data", "other.json"], "takes no other data"),
    ("multimodal", ["--data", "other"], "takes no --data"),
    ("graph", ["--stride", "4", "--data", "notes.txt"], "--stride applies to language-model runs"),
    ("lm", ["--stride", "4"], "--stride needs --data"),
])
def test_eval_refuses_a_flag_the_runs_task_cannot_use_in_one_line(kind, argv, fragment, runs, capsys):
    before = sorted(path.name for path in runs[kind].iterdir())
    capsys.readouterr()
    assert main(["eval", str(runs[kind]), *argv]) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1, err
    assert sorted(path.name for path in runs[kind].iterdir()) == before  # nothing written


def test_a_mistyped_task_of_a_multimodal_run_gets_the_closest(runs, tmp_path):
    from tokennet.errors import DataError

    run = tokennet.load(runs["multimodal"])
    graphs = str(write_graphs(run.data.part("graph").held_out()[0], tmp_path / "graphs.json", items=range(1)))
    with pytest.raises(DataError, match=r"no grap task; did you mean 'graph'\?"):
        run.classify(graphs, task="grap")
