"""Graph files at and past the bounds of :mod:`tokennet.tokens.graph` (issue 44), for the fuzz tests of graph readers
(``test_data_files_fuzz.py``: the reader; ``test_run_files_fuzz.py``: ``tokennet generate --graphs``)."""

from __future__ import annotations

from hypothesis import strategies as st


@st.composite
def oversized_graphs(draw) -> tuple[str, str | None]:
    """A graph file at or past a bound: ``(its text, the bound the refusal must name, or None: it must read)``. The
    text is built by repetition (a file of 20,000 nodes or 260,000 edges in milliseconds)."""
    from tokennet.tokens.graph import MAX_GRAPH_EDGES, MAX_GRAPH_NODES, MAX_NODE_PAIRS

    def graph(n: int, m: int = 0) -> str:
        edges = ",".join(["[0,1]"] * m)
        return '{"nodes": [' + ",".join(["[1.0,0.0]"] * n) + '], "edges": [' + edges + "]}"

    kind = draw(st.sampled_from(["nodes", "edges", "pairs", "deep", "largest"]))
    if kind == "nodes":
        n = draw(st.sampled_from([MAX_GRAPH_NODES + 1, 20_000]) | st.integers(MAX_GRAPH_NODES + 1, 4 * MAX_GRAPH_NODES))
        graphs, bound = [graph(draw(st.integers(1, 8)))] * draw(st.integers(0, 2)) + [graph(n, 2)], "MAX_GRAPH_NODES"
    elif kind == "edges":
        m = MAX_GRAPH_EDGES + draw(st.integers(1, 5000))
        graphs, bound = [graph(draw(st.integers(2, 16)), m)], "MAX_GRAPH_EDGES"
    elif kind == "pairs":
        n = draw(st.integers(256, MAX_GRAPH_NODES))
        graphs, bound = [graph(n)] * (MAX_NODE_PAIRS // n**2 + draw(st.integers(1, 3))), "MAX_NODE_PAIRS"
    elif kind == "deep":
        depth = draw(st.integers(129, 5000))
        graphs, bound = ['{"nodes": ' + "[" * depth + "]" * depth + ', "edges": []}'], "nested"
    else:  # at the bounds, not past them: reads
        graphs, bound = [graph(draw(st.integers(MAX_GRAPH_NODES - 2, MAX_GRAPH_NODES)), draw(st.integers(0, 64)))], None
    return "[" + ",".join(graphs) + "]", bound
