"""Every figure in the docs has a file (CONTRIBUTING.md: a measured figure lives in one place, a JSON file in
``bench/results/`` with the command, the commit and the machine; docs cite it rather than copy it).

A *figure* is a number with a decimal point (``92.8``), a percent sign (``45%``) or a ratio sign (``1.35×``; a
size such as ``3×3`` or ``4 × 4`` is not one). Outside fenced code blocks and inline code, every figure in README.md
and ``docs/**/*.md`` (not CHANGELOG.md, not the generated ``docs/report/``) must sit in a paragraph, list item,
table row or heading that links to at least one ``bench/results/*.json`` (an inline link or a reference-style one),
and one of the linked files must hold the number: some number in the JSON, rounded to the figure's shown precision,
equals it (a percentage, or a bare figure in a table "in %", may be stored as a fraction 0–1 or as 0–100; a ratio
as the ratio). Not figures: dates (``2024-05-01``), versions (``2.13.0``, ``torch 2.13``, ``v1.2``), section
numbers (``§11.2``), numbers in a
link's target or in a URL, and numbers that are part of a hyphenated name (``SmolLM2-1.7B``).

Run ``python3 tests/test_figures_traced.py [FILE ...]`` to list the offenders of the given files (all by default).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXCLUDED = ("CHANGELOG.md", "docs/report/")

FENCE = re.compile(r"^\s*(```|~~~)")
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
HEADING = re.compile(r"^\s*#{1,6}\s")
TABLE_ROW = re.compile(r"^\s*\|")
RST_RULE = re.compile(r"^\s*=+(\s+=+)*\s*$")
REF_DEF = re.compile(r"^\s{0,3}\[([^\]]+)\]:\s*<?(\S+?)>?(?:\s+[\"'(].*)?$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
HTML_COMMENT = re.compile(r"<!--.*?-->", re.S)
INLINE_LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\](?:\[([^\]]*)\])?")
URL = re.compile(r"(?:https?|ftp)://\S+|<[a-z]+://[^>]*>|\b[\w.-]+@[\w.-]+\.\w+")
SECTION = re.compile(r"§\s?\d+(?:\.\d+)*")
DATE = re.compile(r"\b\d{4}-\d{2}(?:-\d{2})?(?:[T ]\d{2}:\d{2}(?::\d{2})?)?")
VERSION = re.compile(r"\b[vV]?\d+(?:\.\d+){2,}\b|\b[vV]\d+(?:\.\d+)+\b"
                     r"|(?i:\b(?:python|torch|pytorch|cuda|triton|numpy|version|versions|onnx|opset|transformers|"
                     r"llama\.cpp|gguf|ggml|ruff|pip|ubuntu|debian|node|go|rust|gcc|clang)\s*[≥≤<>=~^!]*\s*)\d+(?:\.\d+)+")
NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+"
FIGURE = re.compile(rf"(?<![\w.,])(?<!\w-)(?<!×)({NUMBER})(\s?%|\s?×(?!\s*\d))?(?![\w.,]?\d)")
RATIO_PREFIX = re.compile(rf"(?<![\w.\s])×({NUMBER})(?![\d.]\d)|(?<=\s)×({NUMBER})(?![\d.]\d)")
RESULTS = "bench/results/"


def markdown_files(root: Path = ROOT) -> list[Path]:
    """README.md and docs/**/*.md, less CHANGELOG.md and the generated report."""
    files = [root / "README.md"] + sorted((root / "docs").rglob("*.md"))
    return [f for f in files if f.exists() and not any(f.relative_to(root).as_posix().startswith(e) or
                                                      f.name == e for e in EXCLUDED)]


def units(text: str) -> tuple[list[tuple[int, str]], dict[str, str]]:
    """The file's paragraphs, list items, table rows and headings as ``(first line, text)``, outside fenced code,
    and its reference-style link definitions (label, lower case → target)."""
    refs: dict[str, str] = {}
    out: list[tuple[int, str]] = []
    current: list[str] = []
    start = 0
    fenced = None

    def close():
        nonlocal current
        if current:
            out.append((start, "\n".join(current)))
        current = []

    for number, line in enumerate(text.splitlines(), 1):
        fence = FENCE.match(line)
        if fenced is not None:
            if fence and fence.group(1) == fenced:
                fenced = None
            continue
        if fence:
            close()
            fenced = fence.group(1)
            continue
        ref = REF_DEF.match(line)
        if ref:
            refs[ref.group(1).strip().lower()] = ref.group(2)
            continue
        if not line.strip() or RST_RULE.match(line):
            close()
            continue
        if HEADING.match(line) or TABLE_ROW.match(line) or LIST_ITEM.match(line) or not current:
            close()
            start = number
            current = [line]
            if HEADING.match(line) or TABLE_ROW.match(line):
                close()
            continue
        current.append(line)
    close()
    return out, refs


def _strip(unit: str, refs: dict[str, str]) -> tuple[str, list[str]]:
    """The unit's visible prose (inline code, comments, URLs, link targets, dates and versions blanked) and the
    targets of its links."""
    targets: list[str] = []
    text = HTML_COMMENT.sub(" ", unit)
    text = INLINE_CODE.sub(" ", text)

    def inline(match: re.Match) -> str:
        targets.append(match.group(2))
        return match.group(1)

    def by_reference(match: re.Match) -> str:
        label = (match.group(2) or match.group(1)).strip().lower()
        if label in refs:
            targets.append(refs[label])
        return match.group(1)

    text = INLINE_LINK.sub(inline, text)
    return REF_LINK.sub(by_reference, text), targets


def figures(text: str) -> list[str]:
    """The figures in a stretch of visible prose, as shown (URLs, dates and versions are none)."""
    for pattern in (URL, DATE, VERSION, SECTION):
        text = pattern.sub(" ", text)
    found = []
    for match in FIGURE.finditer(text):
        number, sign = match.group(1), (match.group(2) or "").strip()
        if "." in number or sign:
            found.append(number + sign)
    found += ["×" + (m.group(1) or m.group(2)) for m in RATIO_PREFIX.finditer(text)]
    return found


def _numbers(node) -> list[float]:
    if isinstance(node, bool):
        return []
    if isinstance(node, (int, float)):
        return [float(node)]
    if isinstance(node, dict):
        return [x for value in node.values() for x in _numbers(value)]
    if isinstance(node, list):
        return [x for value in node for x in _numbers(value)]
    if isinstance(node, str) and re.fullmatch(r"\s*-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?\s*", node):
        return [float(node)]
    return []


def holds(values: list[float], figure: str) -> bool:
    """Whether a number of ``values``, rounded to the figure's shown precision, is the figure."""
    shown = figure.strip("×%").replace(",", "")
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    target = float(shown)
    tolerance = 0.5 * 10 ** -decimals * (1 + 1e-9) + 1e-12
    scales = (1.0,) if figure.endswith("×") or figure.startswith("×") else (1.0, 100.0)
    return any(abs(abs(value) * scale - target) <= tolerance for value in values for scale in scales)


def offenders(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line: figure (why)`` for each figure of ``path`` that no linked bench/results JSON holds."""
    rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
    found = []
    cache: dict[Path, list[float] | None] = {}
    paragraphs, refs = units(path.read_text(encoding="utf-8"))
    for line, unit in paragraphs:
        text, targets = _strip(unit, refs)
        shown = figures(text)
        if not shown:
            continue
        results = []
        for target in targets:
            clean = target.split("#")[0].split("?")[0]
            if RESULTS in clean and clean.endswith(".json"):
                results.append((path.parent / clean).resolve())
        for file in results:
            if file not in cache:
                try:
                    cache[file] = _numbers(json.loads(file.read_text(encoding="utf-8")))
                except (OSError, ValueError):
                    cache[file] = None
        missing = [f.name for f in results if cache[f] is None]
        readable = [f.name for f in results if cache[f] is not None]
        values = [x for f in results if cache[f] is not None for x in cache[f]]
        lines = unit.splitlines()
        cursor = 0
        for figure in shown:
            digits = figure.strip("×%")
            hit = next((i for i in range(cursor, len(lines)) if digits in lines[i]), cursor)
            cursor = hit
            if not results:
                why = "no link to a bench/results/*.json in its paragraph"
            elif holds(values, figure):
                continue
            else:
                why = "; ".join(([f"not in {', '.join(readable)}"] if readable else []) +
                                ([f"linked file missing or unreadable: {', '.join(missing)}"] if missing else []))
            found.append(f"{rel}:{line + hit}: {figure} ({why})")
    return found


def test_every_figure_has_a_file():
    found = [o for path in markdown_files() for o in offenders(path)]
    assert not found, f"{len(found)} figure(s) with no bench/results JSON that holds them:\n" + "\n".join(found)


def test_the_checker_catches_an_untraced_figure(tmp_path):
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "x.json").write_text(json.dumps(
        {"command": "python bench/x.py", "accuracy": 0.92813, "speedup": 1.347, "loss": 1.6123, "steps": 1500}))
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "# A page, released 2024-05-01 with torch 2.13 and tokennet 2.13.0\n\n"
        "Accuracy 92.8% and 1.35× faster, loss 1.61 after 1,500 steps ([x](../bench/results/x.json)).\n\n"
        "- a list item with 3×3 convolutions and 4 × 4 patches: no figure here\n"
        "- a list item that copies 93.1% and cites nothing\n\n"
        "| row | 92.81 | [x](../bench/results/x.json) |\n"
        "| row | 88.40 | [x](../bench/results/x.json) |\n\n"
        "A paragraph citing [the file][res] for 1.6,\n"
        "spread over two lines, with `0.123 in code` and a wrong 7.5%.\n\n"
        "[res]: ../bench/results/x.json\n\n"
        "```\n12.5% in a fenced block is no figure\n```\n\n"
        "Linked but missing: 5.5% ([y](../bench/results/y.json)); a link target's number [z](https://e.org/1.5).\n")
    found = offenders(page, tmp_path)
    assert found == [
        "docs/page.md:6: 93.1% (no link to a bench/results/*.json in its paragraph)",
        "docs/page.md:9: 88.40 (not in x.json)",
        "docs/page.md:12: 7.5% (not in x.json)",
        "docs/page.md:20: 5.5% (linked file missing or unreadable: y.json)",
    ], found
    assert figures("SmolLM2-1.7B, Qwen2.5, 2.13.0, 2024-05-01, 3×3, 4 × 4, 400 steps × 32, Python ≥ 3.10, §11.2") == []
    assert figures("0.5 s, 45 %, 2× and ×1.8 (×3)") == ["0.5", "45%", "2×", "×1.8", "×3"]


if __name__ == "__main__":
    paths = [Path(p).resolve() for p in sys.argv[1:]] or markdown_files()
    report = [o for p in paths for o in offenders(p)]
    print("\n".join(report) or "every figure has a file")
    print(f"{len(report)} offender(s)", file=sys.stderr)
    sys.exit(1 if report else 0)
