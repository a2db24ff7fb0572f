"""What the explore page draws: an :class:`Exploration` (one input, its tokens, the views they sit on) and the
:class:`Explorer` a task names to build one.

A token is drawn where it came from: a patch as a cell of the picture (or the spectrogram), a character or a
BPE piece as a chip of the text, a node as a point of the graph. Each token says which *view* it sits on and
which *cell* of that view it is; tokens with no view (``<cls>``, a sink, a summary token) are drawn as chips
of their own. The page gets the views once and then only numbers: one query's attention row per layer and head.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ...errors import DataError

if TYPE_CHECKING:
    from ...run import Run

__all__ = ["Exploration", "Explorer", "png_data_url", "grid_view", "grid_tokens", "text_tokens", "graph_view",
           "top_k", "check_index"]

MAX_TEXT_CHARS = 20_000  # a typed text longer than this cannot fit any context tokennet trains


@dataclasses.dataclass
class Exploration:
    """One input as the page shows it.

    Args:
        inputs: what the model takes (``model(inputs)``, ``model.attention_maps(inputs)``).
        tokens: one ``{"label", "view", "cell"}`` per token, in the attention matrix's order.
        views: view name → what to draw it from (``{"kind": "grid" | "text" | "graph", ...}``).
        title: one line: where the input came from and its label.
        predict: the output of the model as it is when called (class probabilities, the answer, the
            continuation), as ``{"text": ..., "top": [[label, probability], ...]}``; called again with a head
            ablated.
        per_token: a model that writes tokens: each token's next-token distribution (top-k), one entry per token
            of ``tokens`` (None for the tokens it does not write), else None.
        offsets: attention kind → ``(first query token, first key token)`` in ``tokens``, where a kind's queries
            and keys are not all the tokens from the first: an encoder–decoder lists the source (or the patches),
            then the target, so ``"cross"`` is ``(S, 0)`` and ``"decoder"`` ``(S, S)``; a kind not named is
            ``(0, 0)``.
        run: the run whose model computes it, where not the explored run itself (a multimodal run's part).
    """

    inputs: Any
    tokens: list[dict[str, Any]]
    views: dict[str, dict[str, Any]]
    title: str
    predict: Callable[[], dict[str, Any]]
    per_token: Callable[[], list[list[list[Any]] | None]] | None = None
    offsets: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    run: Any = None


class Explorer:
    """How one task's runs are explored. A task names its explorer class (``Task.explorer``, or any callable
    ``run → Explorer``; ``None``: the page has nothing to show for it); the page builds one per run, so it may keep
    the held-out data it reads.

    ``accepts`` says what the page lets a user give besides the held-out examples: ``"text"`` (typed),
    ``"image"``, ``"audio"`` (uploaded files), ``"graph"`` (JSON), ``"question"`` (typed, with a picture).
    The constructor raises ``RunError`` when the run cannot be explored (said at start, in one line).
    """

    accepts: tuple[str, ...] = ()

    def __init__(self, run: Run):
        self.run = run

    def examples(self, limit: int) -> list[str]:
        """One line per held-out example the page lists (its label included)."""
        return []

    def example(self, index: int) -> Exploration:
        raise DataError("this run has no held-out examples to show")

    def custom(self, fields: dict[str, Any]) -> Exploration:
        """The user's own input: ``fields`` holds ``text`` / ``question`` (str), ``graph`` (parsed JSON) or
        ``upload`` (bytes) with ``upload_kind`` (``"image"``, ``"audio"``) and, for vqa, ``question``."""
        raise DataError("this run takes only its held-out examples")


def check_index(index: Any, n: int, what: str = "example") -> int:
    """An index from the page, as an int in ``0..n-1`` (a ``DataError`` otherwise)."""
    if isinstance(index, bool) or not isinstance(index, int):
        raise DataError(f"{what} must be a whole number, got {index!r}")
    if not 0 <= index < n:
        raise DataError(f"{what} {index} out of range: 0..{n - 1}")
    return index


def png_data_url(image: torch.Tensor, *, scale_to: int = 256) -> str:
    """A ``(C, H, W)`` picture (grey or RGB, any range) as a PNG data URL, scaled to its min..max and enlarged by
    whole pixels to about ``scale_to`` px (nearest neighbour, so patch edges stay sharp)."""
    from PIL import Image

    pixels = image.detach().float().cpu()
    pixels = pixels[:1] if pixels.shape[0] < 3 else pixels[:3]
    low, high = float(pixels.min()), float(pixels.max())
    pixels = ((pixels - low) / (high - low + 1e-8) * 255).round().clamp(0, 255).to(torch.uint8)
    array = pixels[0].numpy() if pixels.shape[0] == 1 else pixels.permute(1, 2, 0).numpy()
    picture = Image.fromarray(np.ascontiguousarray(array))
    factor = max(1, scale_to // max(picture.size))
    picture = picture.resize((picture.width * factor, picture.height * factor), Image.NEAREST)
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def grid_view(image: torch.Tensor, geom: dict, *, caption: str) -> dict[str, Any]:
    """A picture with its patch grid (``grid, patch, stride, offset, image_hw`` in pixels)."""
    return {"kind": "grid", "image": png_data_url(image), "caption": caption,
            **{key: list(geom[key]) for key in ("grid", "patch", "stride", "offset", "image_hw")}}


def grid_tokens(prefix: list[str], geom: dict, view: str = "picture") -> list[dict[str, Any]]:
    """Tokens of a patch sequence: the prefix tokens (no view), then one per patch, row-major."""
    grid_h, grid_w = geom["grid"]
    tokens = [{"label": name, "view": None, "cell": None} for name in prefix]
    tokens += [{"label": f"patch {i} (row {i // grid_w}, col {i % grid_w})", "view": view, "cell": i}
               for i in range(grid_h * grid_w)]
    return tokens


def text_tokens(pieces: list[str], view: str = "text") -> list[dict[str, Any]]:
    """Tokens of a text: one chip per piece (a character or a BPE piece, as the tokenizer decodes it)."""
    return [{"label": piece, "view": view, "cell": i} for i, piece in enumerate(pieces)]


def graph_view(num_nodes: int, edges: list[tuple[int, int]], marked: list[int]) -> dict[str, Any]:
    """A graph drawn with a seeded spring layout: node positions in ``[0, 1]²``, the edges, the marked nodes."""
    import networkx as nx

    graph = nx.Graph()
    graph.add_nodes_from(range(num_nodes))
    graph.add_edges_from(edges)
    layout = nx.spring_layout(graph, seed=0)
    points = np.array([layout[i] for i in range(num_nodes)], dtype=np.float64).reshape(num_nodes, 2)
    low, span = points.min(0), np.maximum(points.max(0) - points.min(0), 1e-9)
    unit = (points - low) / span
    return {"kind": "graph", "positions": [[round(float(x), 4), round(float(y), 4)] for x, y in unit],
            "edges": [[int(i), int(j)] for i, j in edges], "marked": [int(i) for i in marked],
            "caption": f"{num_nodes} nodes, {len(edges)} edges (spring layout)"}


def top_k(probs: torch.Tensor, names: list[str] | None, k: int = 5, *,
          label: Callable[[int], str] | None = None) -> list[list[Any]]:
    """The ``k`` most likely classes of a probability vector as ``[[name, probability], ...]`` (names from
    ``names``, or ``label(index)``, or the index)."""
    values, indices = probs.float().topk(min(k, probs.numel()))

    def name(i: int) -> str:
        if label is not None:
            return label(i)
        return names[i] if names and i < len(names) else str(i)

    return [[name(int(i)), round(float(v), 5)] for v, i in zip(values, indices, strict=True)]


def uploaded_suffix(data: bytes, kind: str) -> str:
    """The file suffix an upload is read with, from its first bytes (a ``.npy`` array, or what ``kind`` says)."""
    if data.startswith(b"\x93NUMPY"):
        return ".npy"
    return {"audio": ".wav"}.get(kind, ".png")


def _a(word: str) -> str:
    return f"{'an' if word[:1] in 'aeiou' else 'a'} {word}"


def read_upload(fields: dict[str, Any], kind: str, read: Callable[[str], Any]) -> Any:
    """Read an uploaded file of ``kind`` with ``read(path)`` (the task's own reader and checks), from a private
    temporary file that is removed afterwards; a ``DataError`` when the upload is missing or of another kind."""
    data = fields.get("upload")
    if not isinstance(data, bytes) or not data:
        raise DataError(f"no {kind} file uploaded")
    if fields.get("upload_kind") != kind:
        given = fields.get("upload_kind") or "file"
        raise DataError(f"this run takes {_a(kind)} file, not {_a(given)} upload")
    with tempfile.TemporaryDirectory(prefix="tokennet-explore-") as directory:
        path = Path(directory) / ("upload" + uploaded_suffix(data, kind))
        path.write_bytes(data)
        try:
            return read(str(path))
        except DataError as error:  # the message names the temporary file: name the upload instead
            raise DataError(str(error).replace(str(path), f"the uploaded {kind}")) from None
