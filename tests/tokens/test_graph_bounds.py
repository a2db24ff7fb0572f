"""Graph inputs are bounded (issue 44): a graph of more than MAX_GRAPH_NODES nodes or MAX_GRAPH_EDGES edges, or a file
(or list) of graphs past MAX_NODE_PAIRS, is one line naming the file and the bound, refused before any n × n work
(20,000 nodes used to take hours and gigabytes); graphs within the bounds are collated a few at a time and predict
exactly as one by one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from robustness.fuzzing import check_cli, time_limit

import tokennet
from tokennet.errors import DataError
from tokennet.tasks import graph as task_graph
from tokennet.tasks.graph import read_graphs
from tokennet.tokens.graph import MAX_GRAPH_EDGES, MAX_GRAPH_NODES, MAX_NODE_PAIRS, Graph, check_graph

RUN = Path(__file__).parents[1] / "fixtures" / "runs_0_1" / "graph"  # node_features=2


def _write(path: Path, graphs) -> Path:
    path.write_text(json.dumps(graphs))
    return path


def _graph(n: int, edges=()) -> dict:
    return {"nodes": [[0.0, 1.0]] * n, "edges": [list(e) for e in edges]}


@pytest.fixture
def run():
    return tokennet.load(RUN)


def test_the_bounds_are_what_the_docstring_says():
    assert (MAX_GRAPH_NODES, MAX_GRAPH_EDGES, MAX_NODE_PAIRS) == (512, 512 * 511, 2**24)


def test_a_graph_of_20000_nodes_is_one_line_naming_the_file(tmp_path):
    f = _write(tmp_path / "big.json", _graph(20_000, [(0, 1)]))
    with time_limit(20), pytest.raises(DataError) as e:
        read_graphs(f, node_features=2)
    assert str(f) in str(e.value) and "graph 0" in str(e.value) and "MAX_GRAPH_NODES" in str(e.value)


def test_a_graph_of_too_many_edges_is_one_line(tmp_path):
    f = _write(tmp_path / "edges.json", [_graph(2), _graph(4, [(0, 1)] * (MAX_GRAPH_EDGES + 1))])
    with pytest.raises(DataError) as e:
        read_graphs(f, node_features=2)
    assert str(f) in str(e.value) and "graph 1" in str(e.value) and "MAX_GRAPH_EDGES" in str(e.value)


def test_the_largest_graph_reads(tmp_path):
    f = _write(tmp_path / "ok.json", _graph(MAX_GRAPH_NODES, [(0, 1)]))
    assert read_graphs(f, node_features=2)[0]["x"].shape == (MAX_GRAPH_NODES, 2)


def test_a_file_past_the_node_pairs_bound_is_one_line(tmp_path):
    count = MAX_NODE_PAIRS // 500**2 + 1  # each graph within the bound, the file not
    f = _write(tmp_path / "many.json", [_graph(500)] * count)
    with pytest.raises(DataError) as e:
        read_graphs(f, node_features=2)
    assert str(f) in str(e.value) and "MAX_NODE_PAIRS" in str(e.value)


def test_graphs_from_anywhere_else_are_bounded(run):
    """run.predict with a list of graphs, and collate_graphs itself (every graph passes check_graph)."""
    big = (torch.zeros(MAX_GRAPH_NODES + 1, 2), torch.zeros(0, 2, dtype=torch.long))
    with pytest.raises(DataError, match="MAX_GRAPH_NODES"):
        check_graph(*big)
    with pytest.raises(DataError, match="graphs given.*MAX_GRAPH_NODES"):
        run.predict([big])
    with pytest.raises(DataError, match="MAX_NODE_PAIRS"):
        run.predict([(torch.zeros(500, 2), [])] * (MAX_NODE_PAIRS // 500**2 + 1))


def test_graphs_are_collated_in_parts_and_predict_as_one_by_one(run, monkeypatch):
    """One large graph among small ones: the parts keep B · N² small and the order of the graphs."""
    g = torch.Generator().manual_seed(0)
    graphs = [Graph(torch.rand(n, 2, generator=g), torch.randint(0, n, (n, 2), generator=g)) for n in
              (3, 40, 5, 7, 40, 2)]
    parts = []
    real = task_graph._chunks
    monkeypatch.setattr(task_graph, "_chunks", lambda sizes: parts.extend(real(sizes, cells=40**2)) or parts)
    together = run.predict(graphs)
    assert len(parts) > 1
    monkeypatch.setattr(task_graph, "_chunks", real)
    alone = torch.cat([run.predict([gr]) for gr in graphs])
    torch.testing.assert_close(together, alone)  # padding changes the sums' order, not the function


def test_chunks_cover_every_graph_once_in_order():
    sizes = [3, 512, 1, 1, 2, 300, 300, 5]
    parts = list(task_graph._chunks(sizes, cells=512**2))
    assert [i for p in parts for i in range(len(sizes))[p]] == list(range(len(sizes)))
    assert all(max(sizes[p]) ** 2 * len(sizes[p]) <= 512**2 for p in parts if len(sizes[p]) > 1)


def test_cli_generate_on_a_huge_graph_file_is_one_line(tmp_path):
    d = tmp_path / "run"
    shutil.copytree(RUN, d)
    f = _write(tmp_path / "big.json", _graph(20_000))
    code, err = check_cli(["generate", str(d), "--graphs", str(f)], f)
    assert code == 2 and str(f) in err and "MAX_GRAPH_NODES" in err, err


def test_a_nan_feature_in_a_file_is_one_line_naming_the_file(tmp_path):
    """Found by the fuzzing at 300 examples: a NaN feature was refused by collate_graphs without naming the file."""
    f = tmp_path / "nan.json"
    f.write_text('{"nodes": [[NaN, 1.0], [0.0, 1.0]], "edges": [[0, 1]]}')
    with pytest.raises(DataError) as e:
        read_graphs(f, node_features=2)
    assert str(f) in str(e.value) and "NaN" in str(e.value)
