"""The house rules a reader relies on (CONTRIBUTING.md): functions a reader holds in one screen, and local names
that say what they hold.

- No function in ``src/tokennet`` is longer than 80 lines (aim for about 60), kernels excepted.
- No local variable of one or two letters, except the names of the lecture's mathematics: indices (``i j k n m``),
  vectors and tensors (``x y z``, the query, key and value ``q k v``, the time step ``t``), the capital letters of
  shapes and matrices (``B T C H W D N ...``), ``lr``, ``dx dy dt``, ``ax`` (a matplotlib axis), ``ok`` and ``_``.
  Parameters are not counted (they are the API); lambda parameters are. Kernel files are excepted: their names
  follow the papers and formats they implement (GGML block layouts, FlashAttention's tiles).

Run ``python3 tests/test_house.py [DIR ...]`` to list what breaks the rules under ``src/tokennet/DIR``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "tokennet"

MAX_FUNCTION_LINES = 80
MATH_NAMES = frozenset("i j k n m x y z q v t _ lr ok ax dx dy dt".split()) | frozenset("ABCDEFGHKLMNPQRSTVW")
KERNELS = frozenset({  # files whose names follow a paper or a binary format, bit for bit
    "layers/int8dot.py", "layers/blockquant.py", "layers/quantize.py",
    "attention/flash.py", "attention/_triton_kernels.py", "attention/triton_flash.py",
})


def _files(under: str = "") -> list[tuple[str, ast.Module]]:
    root = PACKAGE / under if under else PACKAGE
    paths = [root] if root.is_file() else sorted(root.rglob("*.py"))
    out = []
    for path in paths:
        rel = path.relative_to(PACKAGE).as_posix()
        if rel not in KERNELS:
            out.append((rel, ast.parse(path.read_text(encoding="utf-8"))))
    return out


def long_functions(under: str = "") -> list[str]:
    """``file:line name (N lines)`` for each function longer than MAX_FUNCTION_LINES."""
    found = []
    for rel, tree in _files(under):
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{rel}:{node.lineno} {node.name} ({length} lines)")
    return found


def short_local_names(under: str = "") -> list[str]:
    """``file:line name`` for each binding of a short local name that is not one of MATH_NAMES."""
    found = set()
    for rel, tree in _files(under):
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            bound = [(node.id, node.lineno) for node in ast.walk(func)
                     if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)]
            if isinstance(func, ast.Lambda):
                bound += [(a.arg, func.lineno) for a in func.args.args]
            bound += [(h.name, h.lineno) for h in ast.walk(func) if isinstance(h, ast.ExceptHandler) and h.name]
            found.update(f"{rel}:{line} {name}" for name, line in bound if len(name) <= 2 and name not in MATH_NAMES)
    return sorted(found, key=lambda entry: (entry.split(":")[0], int(entry.split(":")[1].split()[0])))


def test_no_function_is_longer_than_a_screen():
    assert long_functions() == []


def test_no_local_name_is_one_or_two_letters_outside_the_mathematics():
    found = short_local_names()
    assert found == [], f"{len(found)} short local names, the first: {found[:20]}"


def test_the_rules_find_what_they_forbid(tmp_path, monkeypatch):
    """The checks themselves can fail: a long function and a short name in a file of their own are found."""
    (tmp_path / "bad.py").write_text("def f():\n    qq = 1\n" + "    x = 1\n" * 80 + "    return qq\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    assert long_functions() == ["bad.py:1 f (83 lines)"]
    assert short_local_names() == ["bad.py:2 qq"]


if __name__ == "__main__":
    for where in sys.argv[1:] or [""]:
        print(*long_functions(where), *short_local_names(where), sep="\n")
