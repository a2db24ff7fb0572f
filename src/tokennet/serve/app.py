"""The HTTP side: an ASGI application (Starlette) in the OpenAI format, and :func:`serve` (uvicorn).

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (``stream: true`` as server-sent events,
``data: {chunk}`` lines ending with ``data: [DONE]``), ``GET /v1/models``, ``GET /v1/models/{id}`` and
``GET /health`` (no key needed). With an API key every ``/v1`` route needs ``Authorization: Bearer KEY``.

Every request becomes one engine :class:`~tokennet.serve.engine.Sequence` per prompt; the engine's
thread hands each new piece of text to the request's asyncio queue (``call_soon_threadsafe``), so the
event loop never waits on the model. A client that disconnects — mid-stream or while waiting for a whole
completion — cancels its sequences, and their rows go to the next requests. On Ctrl-C (SIGINT) or SIGTERM
uvicorn stops accepting connections, lets the requests in flight finish, then the engine's thread ends.

Bounded work: a body of at most ``max_body`` bytes (8 MiB; 413 beyond), at most
:data:`~tokennet.serve.protocol.MAX_PROMPTS` prompts a request (OpenAI's 2,048; 400 beyond), and at most the
engine's ``max_queue`` sequences waiting for a row (429 ``rate_limit_error`` with ``Retry-After`` beyond, or
400 for a request that could never fit). Parsing and tokenizing a body run in a worker thread, so the event
loop keeps answering other clients while a big body is tokenized. A sequence that fails in the engine
answers its request with a 500 ``server_error`` body (in a stream: an ``error`` event, then ``[DONE]``);
the other requests are not affected (:mod:`.engine`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import importlib.util
import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..errors import RunError
from ..layers import quantize as quantization
from ..tokens.chat_template import check_chat_template
from .engine import PREFIX_CACHE_MB, Engine, Event, QueueFull, Sequence
from .protocol import (
    APIError,
    CompletionRequest,
    chat_body,
    chat_chunk,
    completion_body,
    completion_chunk,
    error_body,
    parse_chat,
    parse_completion,
    parse_json,
    usage,
)

__all__ = ["create_app", "serve", "engine_for_run", "serving_mode"]

log = logging.getLogger(__name__)
MAX_BODY = 8 << 20  # bytes of a request body at most
MAX_QUEUE = 256  # sequences waiting for a row at most (tokennet serve --max-queue)
DISCONNECT_POLL = 0.25  # seconds between checks that a client waiting for a whole completion is still there


def _error(e: APIError) -> JSONResponse:
    headers = {"Retry-After": "1"} if e.status == 429 else None
    return JSONResponse(error_body(e), status_code=e.status, headers=headers)


class _SSE(StreamingResponse):
    """Server-sent events that always notice a client going away (and then close the stream, freeing its rows)."""

    def __init__(self, content: AsyncIterator[str], on_close):
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        import anyio

        try:
            async with anyio.create_task_group() as tg:
                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:  # the client went away while we were sending
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(stream)
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            self._on_close()


class _Request:
    """One HTTP request's sequences and the queue their events arrive on: ``(index, Event)``."""

    def __init__(self, engine: Engine, req: CompletionRequest):
        self.engine, self.req = engine, req
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.seqs = [Sequence(p, req.params, self._emitter(i), group=self) for i, p in enumerate(req.prompts)]

    def _emitter(self, i: int):
        def emit(ev: Event) -> None:
            try:
                self.loop.call_soon_threadsafe(self.queue.put_nowait, (i, ev))
            except RuntimeError:  # the event loop is closed: nobody is listening any more
                pass
        return emit

    def submit(self) -> None:
        try:
            self.engine.submit_all(self.seqs)
        except QueueFull as e:
            raise APIError(429, f"the server is busy: {e}", code="rate_limit_exceeded") from None
        except RuntimeError:
            self.cancel()
            raise APIError(503, "the server is shutting down") from None
        except ValueError as e:  # the context (checked before, so only as a last line of defence)
            self.cancel()
            raise APIError(400, str(e), code="context_length_exceeded") from None

    def cancel(self) -> None:
        for s in self.seqs:
            if s.finish_reason is None:
                self.engine.cancel(s)

    def usage(self) -> dict[str, int]:
        return usage(sum(len(s.prompt) for s in self.seqs), sum(len(s.generated) for s in self.seqs))

    async def events(self) -> AsyncIterator[tuple[int, Event]]:
        """Every event until each sequence has finished."""
        left = len(self.seqs)
        while left:
            i, ev = await self.queue.get()
            if ev.finish_reason is not None:
                left -= 1
            yield i, ev


def _sse(data: Any) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def create_app(engine: Engine, *, model_name: str, api_key: str | None = None, max_body: int = MAX_BODY) -> Starlette:
    """The ASGI application serving ``engine`` as model ``model_name`` (the engine is started and drained with it).

    Args:
        api_key: the key every ``/v1`` request must send as ``Authorization: Bearer KEY`` (None: none).
        max_body: the largest request body in bytes (413 beyond).
    """
    tok = engine.tokenizer
    vocab = engine.model.config.vocab_size
    stop_ids = list(getattr(tok, "stop_ids", None) or [])
    created = int(time.time())

    def check_key(request: Request) -> None:
        if api_key is None:
            return
        got = request.headers.get("authorization", "")
        scheme, _, token = got.partition(" ")
        if not got:
            raise APIError(401, "an API key is required: send the header 'Authorization: Bearer KEY'",
                           code="invalid_api_key")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
            raise APIError(401, "incorrect API key", code="invalid_api_key")

    too_big = APIError(413, f"the request body is larger than {max_body:,} bytes")

    async def body_of(request: Request) -> bytes:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_body:  # refused before reading it
            raise too_big
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > max_body:
                raise too_big
        return bytes(raw)

    def parse(raw: bytes, chat: bool) -> CompletionRequest:
        """The body checked and tokenized (in a worker thread: a big body must not stall the event loop)."""
        body = parse_json(raw)
        try:
            if chat:
                return parse_chat(body, tokenizer=tok, served=model_name, context=engine.context, stop_ids=stop_ids)
            return parse_completion(body, tokenizer=tok, served=model_name, context=engine.context, vocab=vocab,
                                    stop_ids=stop_ids)
        except UnicodeError as e:  # e.g. a lone surrogate escape ("\ud800") that no tokenizer can encode
            raise APIError(400, f"the request's text cannot be encoded as UTF-8: {e}") from None

    def check_room(n: int | None = None) -> None:
        """429 when the queue is full now; 400 for ``n`` sequences that could never fit in it."""
        if engine.max_queue is None:
            return
        if n is not None and n > engine.max_queue:
            raise APIError(400, f"{n} prompts in one request; this server queues at most {engine.max_queue} "
                           "sequences (--max-queue): split the request", param="prompt")
        if engine.queue_room() <= 0:
            raise APIError(429, f"the server is busy: {engine.max_queue} sequences are waiting; try again later",
                           code="rate_limit_exceeded")

    def model_card() -> dict[str, Any]:
        return {"id": model_name, "object": "model", "created": created, "owned_by": "tokennet",
                "max_model_len": engine.context}

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", **engine.status()})

    async def models(request: Request) -> Response:
        try:
            check_key(request)
        except APIError as e:
            return _error(e)
        return JSONResponse({"object": "list", "data": [model_card()]})

    async def model(request: Request) -> Response:
        try:
            check_key(request)
            if request.path_params["model"] != model_name:
                raise APIError(404, f"the model {request.path_params['model']!r} does not exist", param="model",
                               code="model_not_found")
        except APIError as e:
            return _error(e)
        return JSONResponse(model_card())

    async def handle(request: Request, chat: bool) -> Response:
        try:
            check_key(request)
            check_room()  # before reading and tokenizing what could not be queued anyway
            raw = await body_of(request)
            req = await asyncio.to_thread(parse, raw, chat)
            check_room(len(req.prompts))
            r = _Request(engine, req)
            r.submit()
        except APIError as e:
            return _error(e)
        if req.stream:
            return _SSE(_stream(r), r.cancel)
        return await _collect(request, r)

    async def completions(request: Request) -> Response:
        return await handle(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await handle(request, chat=True)

    async def on_http_error(request: Request, exc: HTTPException) -> Response:
        return _error(APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}"))

    async def on_error(request: Request, exc: Exception) -> Response:
        log.exception("internal error")
        return _error(APIError(500, f"internal error: {type(exc).__name__}"))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        engine.start()
        try:
            yield
        finally:
            engine.stop()

    routes = [Route("/health", health), Route("/v1/models", models), Route("/v1/models/{model:path}", model),
              Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat_completions, methods=["POST"])]
    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={HTTPException: on_http_error, Exception: on_error})


async def _collect(request: Request, r: _Request) -> Response:
    """A whole completion; a client that goes away meanwhile cancels it."""
    texts = [""] * len(r.seqs)
    reasons: list[str | None] = [None] * len(r.seqs)
    checked = time.monotonic()
    try:
        while None in reasons:
            try:
                i, ev = await asyncio.wait_for(r.queue.get(), timeout=DISCONNECT_POLL)
            except asyncio.TimeoutError:
                i, ev = -1, None
            if time.monotonic() - checked >= DISCONNECT_POLL:  # whether or not text keeps coming
                checked = time.monotonic()
                if await request.is_disconnected():
                    return Response(status_code=499)  # nobody reads it (the rows are freed below)
            if ev is None:
                continue
            texts[i] += ev.text
            if ev.finish_reason == "error":
                return _error(APIError(500, ev.error or "internal error"))
            if ev.finish_reason is not None:
                reasons[i] = ev.finish_reason
    finally:
        r.cancel()
    req = r.req
    if req.chat:
        return JSONResponse(chat_body(req, texts[0], reasons[0], r.usage()))
    return JSONResponse(completion_body(req, texts, reasons, r.usage()))


async def _stream(r: _Request) -> AsyncIterator[str]:
    req = r.req
    try:
        if req.chat:
            yield _sse(chat_chunk(req, {"role": "assistant", "content": ""}, None))
        async for i, ev in r.events():
            if ev.finish_reason == "error":
                yield _sse(error_body(APIError(500, ev.error or "internal error")))
                break
            if ev.text:
                yield _sse(chat_chunk(req, {"content": ev.text}, None) if req.chat
                           else completion_chunk(req, i, ev.text, None))
            if ev.finish_reason is not None:
                yield _sse(chat_chunk(req, {}, ev.finish_reason) if req.chat
                           else completion_chunk(req, i, "", ev.finish_reason))
        if req.include_usage:
            yield _sse(chat_chunk(req, None, None, r.usage()) if req.chat
                       else completion_chunk(req, -1, "", None, r.usage()))
        yield "data: [DONE]\n\n"
    finally:
        r.cancel()  # a client that went away: free its rows


def serving_mode(model, quantize: str = "auto") -> str:
    """The decoding copy ``tokennet serve`` uses: ``quantize`` itself, or for ``"auto"`` the fastest copy that keeps
    the model's quality for the engine's eager batched step: ``"int8"`` (per-channel weights, ~¼ of float32's bytes
    per token; for a run imported from a GGUF file, its Q4/Q8 blocks requantized) on the CPU, ``"none"`` elsewhere
    (cuBLAS' float32). Not ``"int4"``: outside a compiled step 4-bit blocks are dequantized at every forward
    (measured on SmolLM2-135M Q4_1, 4 streams: ~1 token/s against int8's tens)."""
    if quantize != "auto":
        return quantization.check_mode(quantize)
    return "int8" if next(model.parameters()).device.type == "cpu" else "none"


def engine_for_run(run, *, max_batch: int = 16, context: int | None = None, quantize: str = "auto",
                   max_queue: int | None = MAX_QUEUE, prefix_cache_mb: float = PREFIX_CACHE_MB) -> Engine:
    """An :class:`Engine` for a loaded language-model run; a RunError when the run is not one (``quantize``:
    see :func:`serving_mode`; ``prefix_cache_mb``: the prefix cache's bound, 0 = off)."""
    model = run.model
    if run.tokenizer is None or not hasattr(model, "forward_features") or not hasattr(model.config, "block_size"):
        raise RunError(f"{run.path} is a {run.task.name} run: tokennet serve serves language models with a "
                       "tokenizer")
    if context is not None and context < 2:
        raise RunError(f"the context must be at least 2 tokens, got {context}")
    template = getattr(run.tokenizer, "chat_template", None)
    if template and importlib.util.find_spec("jinja2") is not None:  # refused at start, not on every chat request
        check_chat_template(template, where=str(run.path))
    return Engine(model, run.tokenizer, max_batch=max_batch, context=context, quantize=serving_mode(model, quantize),
                  max_queue=max_queue, prefix_cache_mb=prefix_cache_mb)


def serve(run_dir: str | Path, *, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
          model_name: str | None = None, max_batch: int = 16, context: int | None = None, device: str = "cpu",
          log_level: str = "info", quantize: str = "auto", max_queue: int | None = MAX_QUEUE,
          max_body: int = MAX_BODY, prefix_cache_mb: float = PREFIX_CACHE_MB) -> None:
    """Serve a language-model run over HTTP until Ctrl-C (which lets the requests in flight finish).

    ``api_key`` is used as given (the CLI reads ``--api-key`` or ``TOKENNET_API_KEY``); ``max_queue``: the most
    sequences waiting for a row (429 beyond); ``max_body``: the largest request body in bytes; ``quantize``: the
    decoding copy (``"auto"``: :func:`serving_mode`); ``prefix_cache_mb``: the prefix cache's bound (0: off).
    """
    import uvicorn

    from ..run import load

    run = load(run_dir, device=device)
    engine = engine_for_run(run, max_batch=max_batch, context=context, quantize=quantize, max_queue=max_queue,
                            prefix_cache_mb=prefix_cache_mb)
    name = model_name or Path(run_dir).resolve().name
    app = create_app(engine, model_name=name, api_key=api_key, max_body=max_body)
    weights = {"none": "float32", "bf16": "bf16", "int8": "int8 per-channel",
               "int4": "4-bit blocks (a GGUF file's own, as they are)"}[engine.quantize]
    log.info("serving %s as model %r on http://%s:%d/v1 (batch %d, context %d, %s weights%s, prefix cache %s)",
             run_dir, name, host, port, max_batch, engine.context, weights,
             " chosen by --quantize auto" if quantize == "auto" else "",
             "off" if engine.prefix is None else f"{prefix_cache_mb:g} MiB")
    log.info("batched decoding runs eagerly: the compiled decoding step (tokennet generate's default) does not "
             "serve rows at their own lengths yet")
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=None)
