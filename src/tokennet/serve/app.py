"""The HTTP side: an ASGI application (Starlette) in the OpenAI format, and :func:`serve` (uvicorn).

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (``stream: true`` as server-sent events,
``data: {chunk}`` lines ending with ``data: [DONE]``), ``GET /v1/models``, ``GET /v1/models/{id}`` and
``GET /health`` (no key needed). With an API key every ``/v1`` route needs ``Authorization: Bearer KEY``.

Every request becomes one engine :class:`~tokennet.serve.engine.Sequence` per prompt; the engine's
thread hands each new piece of text to the request's asyncio queue (``call_soon_threadsafe``), so the
event loop never waits on the model. A client that disconnects — mid-stream or while waiting for a whole
completion — cancels its sequences, and their rows go to the next requests. On Ctrl-C (SIGINT) or SIGTERM
uvicorn stops accepting connections, lets the requests in flight finish, then the engine's thread ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
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
from .engine import Engine, Event, Sequence
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

__all__ = ["create_app", "serve", "engine_for_run"]

log = logging.getLogger(__name__)
MAX_BODY = 8 << 20  # bytes of a request body at most
DISCONNECT_POLL = 0.25  # seconds between checks that a client waiting for a whole completion is still there


def _error(e: APIError) -> JSONResponse:
    return JSONResponse(error_body(e), status_code=e.status)


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
        self.seqs = [Sequence(p, req.params, self._emitter(i)) for i, p in enumerate(req.prompts)]

    def _emitter(self, i: int):
        def emit(ev: Event) -> None:
            try:
                self.loop.call_soon_threadsafe(self.queue.put_nowait, (i, ev))
            except RuntimeError:  # the event loop is closed: nobody is listening any more
                pass
        return emit

    def submit(self) -> None:
        try:
            for s in self.seqs:
                self.engine.submit(s)
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


def create_app(engine: Engine, *, model_name: str, api_key: str | None = None) -> Starlette:
    """The ASGI application serving ``engine`` as model ``model_name`` (the engine is started and drained with it)."""
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

    async def body_of(request: Request) -> dict[str, Any]:
        raw = b""
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > MAX_BODY:
                raise APIError(413, f"the request body is larger than {MAX_BODY >> 20} MiB")
        return parse_json(raw)

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
            body = await body_of(request)
            if chat:
                req = parse_chat(body, tokenizer=tok, served=model_name, context=engine.context, stop_ids=stop_ids)
            else:
                req = parse_completion(body, tokenizer=tok, served=model_name, context=engine.context,
                                       vocab=vocab, stop_ids=stop_ids)
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


def engine_for_run(run, *, max_batch: int = 16, context: int | None = None, quantize: str = "none") -> Engine:
    """An :class:`Engine` for a loaded language-model run; a RunError when the run is not one."""
    model = run.model
    if run.tokenizer is None or not hasattr(model, "forward_features") or not hasattr(model.config, "block_size"):
        raise RunError(f"{run.path} is a {run.task.name} run: tokennet serve serves language models with a "
                       "tokenizer")
    if context is not None and context < 2:
        raise RunError(f"the context must be at least 2 tokens, got {context}")
    return Engine(model, run.tokenizer, max_batch=max_batch, context=context, quantize=quantize)


def serve(run_dir: str | Path, *, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
          model_name: str | None = None, max_batch: int = 16, context: int | None = None, device: str = "cpu",
          log_level: str = "info", quantize: str = "none") -> None:
    """Serve a language-model run over HTTP until Ctrl-C (which lets the requests in flight finish)."""
    import uvicorn

    from ..run import load

    run = load(run_dir, device=device)
    engine = engine_for_run(run, max_batch=max_batch, context=context, quantize=quantize)
    name = model_name or Path(run_dir).resolve().name
    app = create_app(engine, model_name=name, api_key=api_key)
    log.info("serving %s as model %r on http://%s:%d/v1 (batch %d, context %d%s)", run_dir, name, host, port,
             max_batch, engine.context, "" if quantize == "none" else f", {quantize} weights")
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=None)
