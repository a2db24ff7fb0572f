"""No import circle between the files of src/tokennet, counting imports placed inside functions.

import-linter (scripts/test.sh) checks the layers between packages; a circle inside a package, or one dodged by an
import inside a function, it does not see. Here every ``import`` and ``from … import`` of each file is an edge to
the module it names (``if TYPE_CHECKING:`` blocks excepted: annotations only), and the graph must have no cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules() -> dict[str, tuple[Path, list[str]]]:
    """``dotted name → (file, its package's parts)`` for every module of tokennet."""
    out = {}
    for path in (SRC / "tokennet").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        package = parts[:-1] if parts[-1] != "__init__" else parts[:-1]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = (path, package)
    return out


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The ids of import nodes inside ``if TYPE_CHECKING:``."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            skip |= {id(n) for child in node.body for n in ast.walk(child)}
    return skip


def _named(node: ast.AST, package: list[str], modules: dict) -> set[str]:
    """The tokennet modules an import node names (a name imported from a package that is a submodule counts as
    that submodule)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = ".".join(package[: len(package) - node.level + 1] if node.level else [])
        base = ".".join(p for p in (base, node.module or "") if p) if node.level else (node.module or "")
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    else:
        return set()
    found = set()
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name.startswith("tokennet"):
            found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, (path, package) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _type_checking_only(tree)
        graph[name] = {m for node in ast.walk(tree) if id(node) not in skip
                       for m in _named(node, package, modules)} - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_checker_finds_a_circle_through_an_import_inside_a_function():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    tree = ast.parse("def f():\n    from .b import g\n")
    assert _named(tree.body[0].body[0], ["tokennet", "p"], {"tokennet.p.b": None, "tokennet.p": None}) == \
        {"tokennet.p.b"}


def test_no_import_circle_between_files():
    graph = import_graph()
    assert len(graph) > 150 and "tokennet.interop.gguf_in" in graph["tokennet.interop.llama"]  # every file read
    assert cycles(graph) == []
