"""The explore page's server: a Starlette application (the stack ``tokennet serve`` uses) over one run.

Routes (JSON in, JSON out; every error is a 4xx ``{"error": message}``, never a traceback):

- ``GET /`` the page; ``GET /static/explore.js`` and ``/static/explore.css`` its script and style, shipped in
  the package (nothing else is served: no file is read from a path a request names);
- ``GET /api/run``: the run — its task, layers, heads, what a user may give, the held-out examples;
- ``POST /api/input``: an input — ``{"example": i}``, ``{"text": ...}``, ``{"graph": {...}}``,
  ``{"question": ..., "example": i}`` — returns its ``id``, tokens, views, attention shapes and prediction;
- ``POST /api/upload?kind=image|audio[&question=...]``: the same for a file sent as the request's body;
- ``GET /api/attention?id=&kind=self&query=i``: query token ``i``'s attention in every layer and head
  ``(L, H, Nk)``, its rollout row, and (language models) the next-token distribution at ``i``;
- ``GET /api/matrix?id=&kind=self&layer=&head=``: one head's whole matrix ``(Nq, Nk)``;
- ``POST /api/ablate`` ``{"id", "kind", "layer", "head"}``: the prediction with that head ablated, beside the
  model's.

Bodies are capped (``max_body`` bytes for a file, 1 MiB for JSON; 413 beyond), read before any parsing. The
model runs in a worker thread, one request at a time (an ablation hooks the model while it runs).
"""

from __future__ import annotations

import itertools
import logging
import math
import re
import threading
from collections import OrderedDict
from importlib import resources
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ... import jsonio
from ...errors import DataError, RunError, TokennetError
from ...run import load
from .measure import Inspection, ablated_head, attention_layers
from .views import Exploration, Explorer

__all__ = ["create_app", "Explore", "open_run", "run_server", "exposure", "MAX_UPLOAD", "MAX_JSON", "STATIC"]

log = logging.getLogger(__name__)

MAX_UPLOAD = 8 * 1024 * 1024  # bytes of an uploaded file (a picture or a clip of a minute fits)
MAX_JSON = 1024 * 1024  # bytes of a JSON body (a typed text, a graph)
KEEP = 8  # inputs remembered (the page asks about the last one; a few more for other tabs)
EXAMPLES = 50  # held-out examples listed on the page
STATIC = {"explore.js": "text/javascript", "explore.css": "text/css"}
HEAD_MEASURE = re.compile(r"^(?P<name>.+)_layer(?P<layer>\d+)(?:_head(?P<head>\d+))?$")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class RequestError(Exception):
    """A bad request: its status and message become the JSON error the page shows."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Explore:
    """One run on the page: its explorer, the inputs seen lately (their attention) and the ablatable layers."""

    def __init__(self, run):
        explorer_class = getattr(run.task, "explorer", None)
        if not hasattr(run.model, "attention_maps"):
            raise RunError(f"{run.path}: a {run.family} model has no attention, so there is nothing for tokennet "
                           "explore to draw; `tokennet viz` draws what it has (a CNN: its class activation map)")
        if explorer_class is None:
            raise RunError(f"{run.path}: tokennet explore does not show {run.task.name} runs yet; `tokennet viz` "
                           "draws their pictures")
        self.run = run
        self.explorer: Explorer = explorer_class(run)
        self.inputs: OrderedDict[str, tuple[Exploration, Inspection, dict]] = OrderedDict()
        self.next_tokens: dict[str, list] = {}  # input id → each token's next-token top-k (models that write)
        self.ids = itertools.count(1)
        self.lock = threading.Lock()

    def describe(self) -> dict[str, Any]:
        return {"run": self.run.path.name, "task": self.run.task.name, "a_task": self.run.task.a_name,
                "family": self.run.family,
                "accepts": list(self.explorer.accepts), "examples": self.explorer.examples(EXAMPLES),
                "head_measures": head_measures(self.run.metrics)}

    def add(self, make) -> dict[str, Any]:
        """Build an input with ``make()`` (the explorer's), compute its attention and prediction; remember it."""
        with self.lock:
            exploration: Exploration = make()
            inspection = Inspection((exploration.run or self.run).attention_maps(exploration.inputs))
            prediction = exploration.predict()
            input_id = str(next(self.ids))
            self.inputs[input_id] = (exploration, inspection, prediction)
            if exploration.per_token is not None:  # now, so that a click only looks it up
                self.next_tokens[input_id] = exploration.per_token()
            while len(self.inputs) > KEEP:
                forgotten, _ = self.inputs.popitem(last=False)
                self.next_tokens.pop(forgotten, None)
        return {"id": input_id, "title": exploration.title, "tokens": exploration.tokens, "views": exploration.views,
                "kinds": {kind: self._kind(exploration, inspection, kind) for kind in inspection.maps},
                "prediction": _public(prediction), "next_tokens": exploration.per_token is not None}

    def _kind(self, exploration: Exploration, inspection: Inspection, kind: str) -> dict[str, Any]:
        """One attention kind's shape, where its queries and keys sit among the tokens, and whether a head of it
        can be ablated."""
        layers, heads, queries, keys = inspection.shape(kind)
        query_offset, key_offset = exploration.offsets.get(kind, (0, 0))
        return {"layers": layers, "heads": heads, "queries": queries, "keys": keys, "query_offset": query_offset,
                "key_offset": key_offset,
                "ablation": attention_layers((exploration.run or self.run).model, kind, layers) is not None}

    def get(self, input_id: str) -> tuple[Exploration, Inspection, dict]:
        if input_id not in self.inputs:
            raise RequestError(404, f"no input {input_id!r} here (the page shows the last {KEEP}); pick it again")
        return self.inputs[input_id]

    def attention(self, input_id: str, kind: str, query: int) -> dict[str, Any]:
        exploration, inspection, _ = self.get(input_id)
        rows = inspection.row(kind, query)  # (L, H, Nk)
        out: dict[str, Any] = {"rows": rows.tolist()}
        rollout = inspection.rollout_row(kind, query)
        out["rollout"] = None if rollout is None else rollout.tolist()
        if input_id in self.next_tokens:
            out["next"] = self.next_tokens[input_id][exploration.offsets.get(kind, (0, 0))[0] + query]
        return out

    def ablate(self, input_id: str, kind: str, layer: int, head: int) -> dict[str, Any]:
        exploration, inspection, prediction = self.get(input_id)
        layers = attention_layers((exploration.run or self.run).model, kind, inspection.tensor(kind).shape[0])
        if layers is None:
            raise RequestError(400, f"this model's {kind} attention modules do not line up one per layer: no "
                                    "ablation")
        if not 0 <= layer < len(layers):
            raise RequestError(400, f"layer {layer} out of range: 0..{len(layers) - 1}")
        with self.lock, ablated_head(layers[layer], head):
            ablated = exploration.predict()
        out = {"kind": kind, "layer": layer, "head": head, "prediction": _public(prediction),
               "ablated": _public(ablated)}
        if "vector" in prediction:
            out["cosine"] = _cosine(prediction["vector"], ablated["vector"])
        return out


def head_measures(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's own measures of what a layer or a head does (``metrics.json``'s ``NAME_layerL`` and
    ``NAME_layerL_headH`` numbers, e.g. a vqa run's mean attention distance per head), for the page to show beside
    the picked layer and head."""
    out = []
    for key, value in metrics.items():
        found = HEAD_MEASURE.match(key)
        if found and isinstance(value, (int, float)) and not isinstance(value, bool):
            head = found["head"]
            out.append({"name": found["name"].replace("_", " "), "layer": int(found["layer"]),
                        "head": None if head is None else int(head), "value": value})
    return out


def _public(prediction: dict) -> dict:
    return {key: value for key, value in prediction.items() if key != "vector"}


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
    return round(dot / norm, 6) if norm else 0.0


# -- requests ---------------------------------------------------------------------------------------------------
async def _body(request: Request, limit: int) -> bytes:
    """The request's body, refused with 413 as soon as it passes ``limit`` bytes (before it is all read)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"the body is {int(declared):,} bytes; the most this page takes is {limit:,}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f"the body is over {limit:,} bytes, the most this page takes")
        chunks.append(chunk)
    return b"".join(chunks)


def _int(value: Any, what: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise RequestError(400, f"{what} must be a whole number, got {value!r}") from None


def _param(request: Request, name: str) -> str:
    value = request.query_params.get(name)
    if value is None:
        raise RequestError(400, f"missing the query parameter {name!r}")
    return value


async def _json_object(request: Request) -> dict[str, Any]:
    body = await _body(request, MAX_JSON)
    try:
        fields = jsonio.loads(body, what="the request body")
    except (ValueError, UnicodeDecodeError) as error:
        raise RequestError(400, f"the body is not JSON ({error})") from None
    if not isinstance(fields, dict):
        raise RequestError(400, "the body must be a JSON object")
    return fields


def _input_maker(explore: Explore, fields: dict[str, Any]):
    if set(fields) == {"example"}:
        return lambda: explore.explorer.example(fields["example"])
    unknown = set(fields) - {"example", "text", "question", "graph"}
    if unknown:
        raise RequestError(400, f"unknown field(s) {', '.join(sorted(unknown))}: give example, text, question or "
                                "graph")
    return lambda: explore.explorer.custom(fields)


def create_app(explore: Explore, *, max_upload: int = MAX_UPLOAD) -> Starlette:
    """The page's application over one explored run (see the module docstring for the routes)."""

    async def page(request: Request) -> Response:
        return Response(_static("explore.html"), media_type="text/html; charset=utf-8")

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:  # a fixed list: a request never names a file to read
            raise RequestError(404, f"no such file: {name}")
        return Response(_static(name), media_type=STATIC[name])

    async def run_info(request: Request) -> Response:
        return JSONResponse(await run_in_threadpool(explore.describe))

    async def add_input(request: Request) -> Response:
        fields = await _json_object(request)
        return JSONResponse(await run_in_threadpool(explore.add, _input_maker(explore, fields)))

    async def upload(request: Request) -> Response:
        kind = request.query_params.get("kind", "")
        if kind not in ("image", "audio"):
            raise RequestError(400, f"kind must be image or audio, got {kind!r}")
        data = await _body(request, max_upload)
        fields: dict[str, Any] = {"upload": data, "upload_kind": kind}
        if "question" in request.query_params:
            fields["question"] = request.query_params["question"]
        return JSONResponse(await run_in_threadpool(explore.add, lambda: explore.explorer.custom(fields)))

    async def attention(request: Request) -> Response:
        query = _int(_param(request, "query"), "query")
        args = (_param(request, "id"), request.query_params.get("kind", "self"), query)
        return JSONResponse(await run_in_threadpool(explore.attention, *args))

    async def matrix(request: Request) -> Response:
        _, inspection, _ = explore.get(_param(request, "id"))
        kind = request.query_params.get("kind", "self")
        layer, head = _int(_param(request, "layer"), "layer"), _int(_param(request, "head"), "head")
        weights = inspection.matrix(kind, layer, head)
        return JSONResponse({"matrix": weights.tolist()})

    async def ablate(request: Request) -> Response:
        fields = await _json_object(request)
        args = (str(fields.get("id")), str(fields.get("kind", "self")), _int(fields.get("layer"), "layer"),
                _int(fields.get("head"), "head"))
        return JSONResponse(await run_in_threadpool(explore.ablate, *args))

    routes = [Route("/", page), Route("/static/{name:path}", static), Route("/api/run", run_info),
              Route("/api/input", add_input, methods=["POST"]), Route("/api/upload", upload, methods=["POST"]),
              Route("/api/attention", attention), Route("/api/matrix", matrix),
              Route("/api/ablate", ablate, methods=["POST"])]
    handlers = {RequestError: _request_error, TokennetError: _input_error, HTTPException: _http_error,
                ClientDisconnect: _client_gone}
    return Starlette(routes=routes, exception_handlers=handlers)


def _static(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


async def _request_error(request: Request, error: RequestError) -> Response:
    return JSONResponse({"error": str(error)}, status_code=error.status)


async def _input_error(request: Request, error: Exception) -> Response:
    """What the user gave cannot be read (a ``TokennetError`` from the task's own checks): 400, in one line."""
    message = str(error).splitlines()[0] if str(error) else type(error).__name__
    status = 400 if isinstance(error, (DataError, RunError)) else 422
    return JSONResponse({"error": message}, status_code=status)


async def _http_error(request: Request, error: HTTPException) -> Response:
    return JSONResponse({"error": error.detail}, status_code=error.status_code)


async def _client_gone(request: Request, error: ClientDisconnect) -> Response:
    return Response(status_code=400)


# -- the command --------------------------------------------------------------------------------------------------
def open_run(run_dir, *, device: str = "cpu") -> Explore:
    """Load a run and its explorer; a ``RunError`` (one line) when the run has nothing to explore."""
    return Explore(load(run_dir, device=device))


def exposure(host: str) -> str | None:
    """What binding to ``host`` exposes, for the start line; None for the loopback (this machine only)."""
    if host in LOOPBACK:
        return None
    return (f"listening on {host}: anyone who can reach this machine sees the run's held-out examples and "
            "attention and can run its model on inputs of their own")


def run_server(explore: Explore, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning") -> None:
    """Serve the page until stopped (Ctrl-C)."""
    uvicorn.run(create_app(explore), host=host, port=port, log_level=log_level)
