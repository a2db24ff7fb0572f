"""The report's HTML pieces: escaping, inline images, tables, and the page around them.

Everything is inline (CSS in a ``<style>`` element, images as ``data:image/png;base64`` URIs), and
the page has no script at all, so it reads the same offline, mailed, or behind a strict CSP.
"""

from __future__ import annotations

import base64
import html
import io
import json
from typing import Any

__all__ = ["esc", "img", "inline_img", "png_size", "png_of", "table", "section", "note", "number", "page", "Section"]

Section = tuple[str, str]  # (heading, HTML body)

CSS = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #1d2329;
       background: #f4f6f8; }
main { max-width: 1180px; margin: 0 auto; padding: 18px 22px 40px; }
h1 { font-size: 24px; margin: 8px 0 4px; }
h2 { font-size: 19px; margin: 28px 0 8px; border-bottom: 2px solid #d5dbe1; padding-bottom: 3px; }
h3 { font-size: 16px; margin: 18px 0 6px; }
.sub { color: #56616c; margin: 0 0 10px; }
.card { background: #fff; border: 1px solid #dde3e8; border-radius: 8px; padding: 12px 14px; margin: 10px 0; }
.facts { display: grid; grid-template-columns: repeat(auto-fill, minmax(210px, 1fr)); gap: 8px; }
.fact { background: #fff; border: 1px solid #dde3e8; border-radius: 8px; padding: 8px 12px; }
.fact .k { color: #56616c; font-size: 12.5px; text-transform: uppercase; letter-spacing: .03em; }
.fact .v { font-size: 18px; font-weight: 600; overflow-wrap: anywhere; }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); gap: 10px; }
figure.wide { overflow-x: auto; }
.plots figure, figure.wide { margin: 0; background: #fff; border: 1px solid #dde3e8; border-radius: 8px;
                             padding: 6px; }
figure img { max-width: 100%; height: auto; display: block; margin: 0 auto; }
figcaption { color: #56616c; font-size: 13px; padding: 2px 6px; }
table { border-collapse: collapse; background: #fff; font-size: 14px; }
th, td { border: 1px solid #dde3e8; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #eef2f5; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.changed td { background: #fff4cc; }
tr.miss td.out { background: #fde2e1; }
tr.hit td.out { background: #e3f5e5; }
mark.diff { background: #f6a6a2; padding: 0; }
code, pre, .mono { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, monospace; font-size: 13.5px; }
pre { background: #fff; border: 1px solid #dde3e8; border-radius: 8px; padding: 10px; white-space: pre-wrap;
      overflow-wrap: anywhere; margin: 6px 0; }
.note { background: #e8f1fb; border-left: 4px solid #5b8fd1; padding: 8px 12px; margin: 10px 0; }
.warn { background: #fff1e0; border-left: 4px solid #e39a3b; padding: 8px 12px; margin: 10px 0; }
.tokens { background: #fff; border: 1px solid #dde3e8; border-radius: 8px; padding: 10px; white-space: pre-wrap;
          line-height: 1.9; overflow-wrap: anywhere; }
.tokens span { border-radius: 2px; }
.scale { display: flex; align-items: center; gap: 6px; font-size: 13px; color: #56616c; margin: 4px 0; }
.scale .bar { width: 220px; height: 12px; border: 1px solid #c9d0d6;
              background: linear-gradient(to right, rgb(255,255,255), rgb(255,200,120), rgb(230,60,40)); }
.thumbs { display: flex; flex-wrap: wrap; gap: 10px; }
.thumbs figure { margin: 0; background: #fff; border: 1px solid #dde3e8; border-radius: 8px; padding: 6px;
                 width: 170px; }
img.cell { border: 1px solid #c9d0d6; image-rendering: pixelated; display: block; }
.thumbs img { width: 136px; image-rendering: pixelated; }
details > summary { cursor: pointer; color: #2c5e9e; margin: 6px 0; }
"""


def esc(text: Any) -> str:
    """HTML-escape any value's ``str``."""
    return html.escape(str(text), quote=True)


def png_of(fig, dpi: int = 100) -> bytes:
    """A matplotlib figure as PNG bytes (the figure is closed)."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    finally:
        plt.close(fig)
    return buf.getvalue()


PAGE_WIDTH = 1100  # px of content in the page's main column


def png_size(png: bytes) -> tuple[int, int]:
    """``(width, height)`` of a PNG from its IHDR chunk."""
    if png[:8] != b"\x89PNG\r\n\x1a\n" or len(png) < 24:
        raise ValueError("not a PNG")
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def img(png: bytes, alt: str, caption: str | None = None, *, cls: str = "", width: int | None = None) -> str:
    """A ``<figure>`` with the PNG inline as a data URI.

    ``cls="wide"``: a large picture (``tokennet viz``'s grids of heads) is shown at no less than 55% of its
    size, so its labels stay legible, and scrolls sideways when that is wider than the page.
    """
    uri = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    style = f' style="max-width:{width}px"' if width else ""
    if cls == "wide":
        natural = png_size(png)[0]
        shown = min(natural, max(PAGE_WIDTH, round(natural * 0.55)))
        style = f' style="width:{shown}px;max-width:none"'
    cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
    class_attr = f' class="{cls}"' if cls else ""
    return f'<figure{class_attr}><img src="{uri}" alt="{esc(alt)}"{style}>{cap}</figure>'


def inline_img(png: bytes, alt: str) -> str:
    """A bare ``<img>`` (for table cells), PNG inline as a data URI."""
    uri = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    return f'<img class="cell" src="{uri}" alt="{esc(alt)}">'


def number(value: Any, metric: str | None = None) -> str:
    """A number as the JSON it came from (so the page shows exactly what ``metrics.json`` holds).

    With ``metric``, the element carries ``data-metric`` so a test can hold every shown metric equal to
    ``metrics.json``.
    """
    text = json.dumps(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)
    attr = f' data-metric="{esc(metric)}"' if metric else ""
    return f'<span class="mono"{attr}>{esc(text)}</span>'


def table(header: list[str], rows: list[list[str]], row_classes: list[str] | None = None,
          num_cols: tuple[int, ...] = (), col_classes: dict[int, str] | None = None) -> str:
    """A table; cells are HTML already (escape text with :func:`esc`).

    ``num_cols`` are right-aligned numbers; ``col_classes`` gives columns a class (``-1``: the last).
    """
    head = "".join(f"<th>{heading}</th>" for heading in header)
    classes = {j % len(header): name for j, name in (col_classes or {}).items()} if header else {}
    classes.update({j: "num" for j in num_cols})
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        cells = "".join(f'<td class="{classes[j]}">{cell}</td>' if j in classes else f"<td>{cell}</td>"
                        for j, cell in enumerate(row))
        body.append(f"<tr{cls}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def section(title: str, body: str, anchor: str | None = None) -> str:
    id_attr = f' id="{esc(anchor)}"' if anchor else ""
    return f"<section{id_attr}><h2>{esc(title)}</h2>{body}</section>"


def note(text: str, kind: str = "note") -> str:
    """A boxed message (``kind``: ``note`` or ``warn``); ``text`` is HTML."""
    return f'<div class="{kind}">{text}</div>'


def page(title: str, body: str) -> str:
    """The whole HTML5 document."""
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{esc(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<main>\n{body}\n</main>\n"
            "</body>\n</html>\n")
