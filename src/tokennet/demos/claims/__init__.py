"""The lecture, claim by claim: ``tokennet demo claims`` runs every checkable statement as a small seeded experiment.

Each claim is a function (one module per group: :mod:`.linear_maps` 1–3, :mod:`.mixing` 4–6, :mod:`.causal` 7,
:mod:`.scaling` 8, :mod:`.architectures` 9–10, and two the issue did not list: :mod:`.normalization` 11, LayerNorm's
optimization properties, :mod:`.positions` 12, Fourier positions against other kinds; and issue 45's
:mod:`.receptive_field` 13, the transcript's x1 … x7 learned; issue 46's :mod:`.modalities` 14, one trunk for every
modality; issue 45's :mod:`.corner_pairs` 15, the lecture's three predictions about the corner pairs; issue 62's
:mod:`.heads` 16, heads with different jobs, :mod:`.patch_projection` 17, W_tokenize learned or hard-coded, and
:mod:`.text_direction` 18, text forwards and backwards, :mod:`.look_alikes` 19, a token that learns what it is from the
tokens that look like it) whose docstring quotes the lecture; the command, the tests and
the page call the same functions. :func:`run_claims` runs them (or one, ``only=``), and writes ``claims.json`` and
``claims.html`` (a figure per claim, inline). Claims that take minutes are read from their bench's results file.
"""

from __future__ import annotations

import base64
import html
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

from ...device import one_thread
from ...errors import TokennetError
from . import (  # noqa: F401 -- each registers its claims
    architectures,
    causal,
    corner_pairs,
    heads,
    linear_maps,
    look_alikes,
    mixing,
    modalities,
    normalization,
    patch_projection,
    positions,
    receptive_field,
    scaling,
    text_direction,
)
from ._registry import Claim, Result, claims

__all__ = ["Claim", "Result", "claims", "claim_names", "run_claims", "format_table", "FILES"]

FILES = ("claims.html", "claims.json")


def claim_names() -> list[str]:
    """The claims' names, in the issue's order (what ``--only`` takes)."""
    return [claim.name for claim in claims()]


def _select(only: str | None) -> list[Claim]:
    if only is None:
        return claims()
    chosen = [claim for claim in claims() if claim.name == only]
    if not chosen:
        raise TokennetError(f"unknown claim {only!r}; claims: {', '.join(claim_names())}")
    return chosen


NOT_MEASURED = "not measured here"  # a Result's ``measured`` when nothing was measured (a bench's file is absent)


def _verdict(holds: bool | None, measured: str | None = None) -> str:
    """``None`` is "not decided" when something was measured (a ViT and a CNN that approach but never cross on
    the sizes trained), "not measured" when nothing was."""
    if holds is None:
        return "not measured" if measured in (None, NOT_MEASURED) else "not decided"
    return "holds" if holds else "does not hold"


def run_claims(out_dir: str | Path, *, seed: int = 0, only: str | None = None) -> dict[str, Any]:
    """Run every claim (or ``only`` one), seeded; write ``claims.json`` and ``claims.html`` into ``out_dir``.

    Returns the metrics: per claim its number, the lecture's words, what was run, the measured figure, whether it
    holds (``None``: not measured here, or measured and not decided), where a read figure came from, and the
    seconds it took.
    """
    chosen = _select(only)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, tuple[Claim, Result, float]] = {}
    # The models are tiny: one thread runs them as fast as several, and far faster when other processes share
    # the cores (intra-op threads then wait on each other at every small operator).
    with one_thread():
        for claim in chosen:
            torch.manual_seed(seed)
            start = time.perf_counter()
            results[claim.name] = (claim, claim(seed), time.perf_counter() - start)
            result = results[claim.name][1]
            logging.getLogger(__name__).info("claim %s: %s (%.1f s)", claim.name,
                                             _verdict(result.holds, result.measured), results[claim.name][2])
    metrics = {"seed": seed, "claims": {
        name: {"number": claim.number, "claim": claim.quote, "run": result.run, "measured": result.measured,
               "holds": result.holds, "source": result.source, "seconds": round(dt, 2), "table": result.table,
               "data": _jsonable(result.data)}
        for name, (claim, result, dt) in results.items()}}
    (out / "claims.json").write_text(json.dumps(metrics, indent=2) + "\n")
    (out / "claims.html").write_text(_page(results, seed))
    return metrics


def _jsonable(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def _short(quote: str, width: int = 70) -> str:
    return quote if len(quote) <= width else quote[: width - 1].rstrip() + "…"


def format_table(metrics: dict[str, Any]) -> str:
    """The run's table as markdown: the claim in the lecture's words, what was run, the measured figure, the verdict."""
    lines = ["| # | claim (the lecture's words) | what was run | measured | verdict |", "|---|---|---|---|---|"]
    for name, m in metrics["claims"].items():
        run = m["run"] + (f" ({m['source']})" if m.get("source") else "")
        verdict = _verdict(m["holds"], m["measured"])
        cells = [m["number"], f"**{name}**: {_short(m['claim'])}", run, m["measured"], verdict]
        lines.append("| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |")
    for name, m in metrics["claims"].items():  # a claim's own table, under the main one
        if m.get("table"):
            head, *body = m["table"]
            lines += ["", f"Claim {m['number']} ({name}):", "", "| " + " | ".join(head) + " |",
                      "|" + "---|" * len(head)]
            lines += ["| " + " | ".join(row) + " |" for row in body]
    done = [_verdict(m["holds"], m["measured"]) for m in metrics["claims"].values()]
    lines.append(f"\n{done.count('holds')} hold, {done.count('does not hold')} do not, {done.count('not decided')} "
                 f"not decided, {done.count('not measured')} not measured here (seed {metrics['seed']}).")
    return "\n".join(lines)


CSS = """body { font: 15px/1.45 system-ui, sans-serif; margin: 0; background: #f4f6f8; color: #1d2329; }
main { max-width: 1180px; margin: 0 auto; padding: 18px 22px 40px; }
section { background: #fff; border: 1px solid #dde3e8; border-radius: 8px; padding: 10px 14px; margin: 14px 0; }
blockquote { margin: 6px 0; padding: 6px 12px; border-left: 4px solid #5b8fd1; background: #e8f1fb; }
.holds { color: #1e7b34; font-weight: 600; } .fails { color: #b3261e; font-weight: 600; }
.none { color: #8a5a00; font-weight: 600; } img { max-width: 100%; height: auto; }
table { border-collapse: collapse; font-size: 14px; } th, td { border: 1px solid #dde3e8; padding: 4px 8px;
text-align: left; vertical-align: top; } th { background: #eef2f5; }"""


def _page(results: dict[str, tuple[Claim, Result, float]], seed: int) -> str:
    esc = html.escape
    cls = {True: "holds", False: "fails", None: "none"}
    rows, sections = [], []
    for name, (claim, result, dt) in results.items():
        verdict = f'<span class="{cls[result.holds]}">{_verdict(result.holds, result.measured)}</span>'
        rows.append(f"<tr><td>{esc(claim.number)}</td><td><a href='#{esc(name)}'>{esc(name)}</a></td>"
                    f"<td>{esc(result.measured)}</td><td>{verdict}</td></tr>")
        fig = (f'<img alt="{esc(name)}" src="data:image/png;base64,{base64.b64encode(result.figure).decode("ascii")}">'
               if result.figure else "<p><i>no figure: not measured here</i></p>")
        source = f"<p>{esc(result.source)}</p>" if result.source else ""
        if result.table:
            head, *body = result.table
            source += ("<table><tr>" + "".join(f"<th>{esc(heading)}</th>" for heading in head) + "</tr>"
                       + "".join("<tr>" + "".join(f"<td>{esc(cell)}</td>" for cell in row) + "</tr>" for row in body)
                       + "</table>")
        sections.append(f'<section id="{esc(name)}"><h2>{esc(claim.number)}. {esc(name)} — {verdict}</h2>'
                        f"<blockquote>{esc(claim.quote)}</blockquote><p><b>Run:</b> {esc(result.run)}</p>"
                        f"<p><b>Measured:</b> {esc(result.measured)} ({dt:.1f} s)</p>{source}{fig}</section>")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>The lecture, claim by claim</title>"
            f"<style>{CSS}</style></head><body><main><h1>The lecture, claim by claim</h1>"
            f"<p>Every checkable statement run as a small seeded experiment (seed {seed}); "
            "<code>tokennet demo claims</code> wrote this page.</p>"
            "<table><tr><th>#</th><th>claim</th><th>measured</th><th>verdict</th></tr>"
            + "".join(rows) + "</table>" + "".join(sections) + "</main></body></html>\n")


def _register() -> None:
    from .. import Demo, register_demo

    register_demo(Demo("claims", run_claims, "the lecture, claim by claim: every checkable statement as a small "
                       "seeded experiment, a table of what it measured and whether it holds, claims.html with a "
                       "figure each (--only NAME, --list)", FILES, parts=claim_names, summary=format_table))


_register()
