"""The HTTP side: an ASGI application (Starlette) in the OpenAI format, and :func:`serve` (uvicorn).

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (``stream: true`` as server-sent events,
``data: {chunk}`` lines ending with ``data: [DONE]``), ``GET /v1/models``, ``GET /v1/models/{id}`` and
``GET /health`` (no key needed). A text-embedding run (an imported sentence encoder) serves
``POST /v1/embeddings`` instead of the completions (:mod:`.embeddings`); each route on the other kind of run
is a 400 that says which runs serve it. With an API key every ``/v1`` route needs ``Authorization: Bearer KEY``.
``GET /`` is a chat page for a language model (:mod:`.chat_page`); ``POST /tokenize``, ``POST /detokenize`` and
``GET /tokenizer_info`` expose the tokenizer, as lm-eval's ``local-completions`` reads it (:mod:`.tokenizer_routes`).

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
answers its request with an error body (in a stream: an ``error`` event, then ``[DONE]``) whose status says
whose failure it is: 400 for what the request asked (a JSON schema no text can continue), 503 while the server
shuts down, 500 ``server_error`` for the server's own; the other requests are not affected (:mod:`.engine`).
Every body is parsed through :func:`tokennet.jsonio.loads` (nested at most 128 levels: 400 beyond). A client
that hangs up — mid-body or mid-stream — is its own doing: at most one line in the log, never an internal error.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import importlib.util
import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import torch
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .. import step_store
from ..errors import ConfigError, RunError
from ..layers import int8dot
from ..layers import quantize as quantization
from ..tokens.chat_template import check_chat_template
from . import prebuild
from .chat_page import chat_page_route
from .drafting import check_speculation
from .embeddings import Embedder, embeddings_body, parse_embeddings
from .engine import PREFIX_CACHE_MB, Engine, Event, QueueFull, Sequence
from .protocol import (
    APIError,
    CompletionRequest,
    TokenText,
    chat_body,
    chat_chunk,
    chat_logprobs,
    check_model,
    completion_body,
    completion_chunk,
    completion_logprobs,
    error_body,
    parse_chat,
    parse_completion,
    parse_json,
    usage,
)
from .tokenizer_routes import tokenizer_routes
from .tools import parse_tool_calls

__all__ = ["create_app", "serve", "engine_for_run", "serving_mode", "serving_threads"]

log = logging.getLogger(__name__)
MAX_BODY = 8 << 20  # bytes of a request body at most
MAX_QUEUE = 256  # sequences waiting for a row at most (tokennet serve --max-queue)
DISCONNECT_POLL = 0.25  # seconds between checks that a client waiting for a whole completion is still there


class JSON(JSONResponse):
    """A JSON answer; a lone surrogate in it (a request's ``"\\ud800"``, echoed back) is escaped, as JSON allows,
    where UTF-8 cannot carry it (starlette's own rendering raises: a 500)."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, allow_nan=False, separators=(",", ":")).encode()


def _error(e: APIError) -> JSON:
    headers = {"Retry-After": "1"} if e.status == 429 else None
    return JSON(error_body(e), status_code=e.status, headers=headers)


FAULT_STATUS = {"request": 400, "unavailable": 503}  # an engine error's status by whose it is (else 500)


def _failed(ev: Event) -> APIError:
    """The answer to a sequence that ended with an error: 400 for what its request asked (a schema no text can
    continue), 503 while the engine shuts down or after it stopped, 500 for the server's own failure."""
    return APIError(FAULT_STATUS.get(ev.fault, 500), ev.error or "internal error")


async def _one_loop_turn_each(chunks: AsyncIterator[str]) -> AsyncIterator[str]:
    """``chunks``, giving the event loop a turn after each: when a client hangs up, the failed write schedules the
    connection's loss for the loop's next turn, and tokens already queued would otherwise be written to the lost
    socket back to back until asyncio logs a warning (at its fifth such write)."""
    async for chunk in chunks:
        yield chunk
        await asyncio.sleep(0)


class _SSE(StreamingResponse):
    """Server-sent events that always notice a client going away (and then close the stream, freeing its rows)."""

    def __init__(self, content: AsyncIterator[str], on_close):
        super().__init__(_one_loop_turn_each(content), media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache"})
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        import anyio

        try:
            async with anyio.create_task_group() as task_group:
                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:  # the client went away while we were sending
                        pass
                    task_group.cancel_scope.cancel()

                task_group.start_soon(stream)
                await self.listen_for_disconnect(receive)
                task_group.cancel_scope.cancel()
        finally:
            self._on_close()


class _Request:
    """One HTTP request's sequences and the queue their events arrive on: ``(index, Event)``."""

    def __init__(self, engine: Engine, req: CompletionRequest):
        self.engine, self.req = engine, req
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.seqs = [Sequence(prompt, req.params, self._emitter(i), group=self) for i, prompt in enumerate(req.prompts)]

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
        except QueueFull as error:
            raise APIError(429, f"the server is busy: {error}", code="rate_limit_exceeded") from None
        except RuntimeError:
            self.cancel()
            raise APIError(503, "the server is shutting down") from None
        except ValueError as error:  # the context (checked before, so only as a last line of defence)
            self.cancel()
            raise APIError(400, str(error), code="context_length_exceeded") from None

    def cancel(self) -> None:
        for seq in self.seqs:
            if seq.finish_reason is None:
                self.engine.cancel(seq)

    def usage(self) -> dict[str, int]:
        return usage(sum(len(seq.prompt) for seq in self.seqs), sum(len(seq.generated) for seq in self.seqs))

    async def events(self) -> AsyncIterator[tuple[int, Event]]:
        """Every event until each sequence has finished."""
        left = len(self.seqs)
        while left:
            i, event = await self.queue.get()
            if event.finish_reason is not None:
                left -= 1
            yield i, event


def _sse(data: Any) -> str:
    text = json.dumps(data, ensure_ascii=False)
    try:
        text.encode()
    except UnicodeEncodeError:  # a lone surrogate (a request's "\ud800", echoed back): escaped, as JSON allows
        text = json.dumps(data)
    return f"data: {text}\n\n"


class _Served:
    """What a server answers with: the model's names, its tokenizer, its engine or embedder, and the request limits.
    Its methods are the routes and the checks they share (vLLM's ``OpenAIServing`` classes are the anchor)."""

    def __init__(self, engine: Engine | None, embedder: Embedder | None, names: list[str], *, api_key: str | None,
                 max_body: int, any_model_name: bool):
        self.engine, self.embedder, self.names = engine, embedder, names
        self.api_key, self.max_body, self.any_model_name = api_key, max_body, any_model_name
        self.tokenizer = engine.tokenizer if engine is not None else embedder.tokenizer
        self.text_of = TokenText(self.tokenizer)
        self.vocab = engine.model.config.vocab_size if engine is not None else None
        self.stop_ids = list(getattr(self.tokenizer, "stop_ids", None) or [])
        self.context = engine.context if engine is not None else embedder.context
        self.constraints = None
        if engine is not None and importlib.util.find_spec("llguidance") is not None:
            from .constrained import Constraints

            self.constraints = Constraints(self.tokenizer, self.vocab)
        self.created = int(time.time())
        self.too_big = APIError(413, f"the request body is larger than {max_body:,} bytes")

    def check_key(self, request: Request) -> None:
        if self.api_key is None:
            return
        got = request.headers.get("authorization", "")
        scheme, _, token = got.partition(" ")
        if not got:
            raise APIError(401, "an API key is required: send the header 'Authorization: Bearer KEY'",
                           code="invalid_api_key")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise APIError(401, "incorrect API key", code="invalid_api_key")

    async def body_of(self, request: Request) -> bytes:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body:  # refused before reading it
            raise self.too_big
        raw = bytearray()
        try:
            async for chunk in request.stream():
                raw += chunk
                if len(raw) > self.max_body:
                    raise self.too_big
        except ClientDisconnect:  # the client hung up mid-body: its own doing, one line, answered to nobody
            log.info("%s %s: the client closed the connection before its body was whole (%d bytes read)",
                     request.method, request.url.path, len(raw))
            raise APIError(499, "the client closed the connection while sending the request body") from None
        return bytes(raw)

    def parse(self, raw: bytes, chat: bool) -> CompletionRequest:
        """The body checked and tokenized (in a worker thread: a big body must not stall the event loop)."""
        body = parse_json(raw)
        shared = dict(tokenizer=self.tokenizer, served=self.names, context=self.engine.context,
                      stop_ids=self.stop_ids, any_model=self.any_model_name, constraints=self.constraints,
                      speculation=self.engine.speculation)
        try:
            if chat:
                return parse_chat(body, **shared)
            return parse_completion(body, vocab=self.vocab, **shared)
        except UnicodeError as error:  # e.g. a lone surrogate escape ("\ud800") that no tokenizer can encode
            raise APIError(400, f"the request's text cannot be encoded as UTF-8: {error}") from None

    def check_room(self, n: int | None = None) -> None:
        """429 when the queue is full now; 400 for ``n`` sequences that could never fit in it."""
        engine = self.engine
        if engine is None:
            raise APIError(400, f"this server serves the text-embedding model {self.names[0]!r}: it answers "
                           "POST /v1/embeddings only; completions and chat are served for language-model runs")
        if engine.max_queue is None:
            return
        if n is not None and n > engine.max_queue:
            raise APIError(400, f"{n} prompts in one request; this server queues at most {engine.max_queue} "
                           "sequences (--max-queue): split the request", param="prompt")
        if engine.queue_room() <= 0:
            raise APIError(429, f"the server is busy: {engine.max_queue} sequences are waiting; try again later",
                           code="rate_limit_exceeded")

    def model_card(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": self.created, "owned_by": "tokennet",
                "max_model_len": self.context}

    async def health(self, request: Request) -> Response:
        if self.engine is None:
            return JSON({"status": "ok", "embeddings": True, "dim": self.embedder.dim, "context": self.context})
        return JSON({"status": "ok", **self.engine.status()})

    async def models(self, request: Request) -> Response:
        try:
            self.check_key(request)
        except APIError as error:
            return _error(error)
        return JSON({"object": "list", "data": [self.model_card(name) for name in self.names]})

    async def model(self, request: Request) -> Response:
        try:
            self.check_key(request)
            name = check_model(request.path_params["model"], self.names, self.any_model_name)
        except APIError as error:
            return _error(error)
        return JSON(self.model_card(name))

    async def handle(self, request: Request, chat: bool) -> Response:
        try:
            self.check_key(request)
            self.check_room()  # before reading and tokenizing what could not be queued anyway
            raw = await self.body_of(request)
            req = await asyncio.to_thread(self.parse, raw, chat)
            self.check_room(len(req.prompts))
            pending = _Request(self.engine, req)
            pending.submit()
        except APIError as error:
            return _error(error)
        if req.stream:
            return _SSE(_stream(pending, self.text_of), pending.cancel)
        return await _collect(request, pending, self.text_of)

    async def completions(self, request: Request) -> Response:
        return await self.handle(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self.handle(request, chat=True)

    async def embeddings(self, request: Request) -> Response:
        try:
            self.check_key(request)
            if self.embedder is None:
                raise APIError(400, f"this server serves the language model {self.names[0]!r}: /v1/embeddings is "
                               "served for text-embedding runs (a sentence encoder imported with tokennet import, "
                               "e.g. MiniLM); use /v1/completions or /v1/chat/completions", param="model")
            body = parse_json(await self.body_of(request))
            texts, fmt, name = parse_embeddings(body, served=self.names, any_model=self.any_model_name,
                                                dim=self.embedder.dim)
            vecs, tokens = await asyncio.to_thread(self.embedder.embed, texts)
        except APIError as error:
            return _error(error)
        return JSON(embeddings_body(vecs, fmt, name, tokens))

    def routes(self) -> list[Route]:
        routes = [Route("/health", self.health), Route("/v1/models", self.models),
                  Route("/v1/models/{model:path}", self.model),
                  Route("/v1/completions", self.completions, methods=["POST"]),
                  Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                  Route("/v1/embeddings", self.embeddings, methods=["POST"])]
        if self.engine is not None:  # GET /: the chat page (a language model; an embedding run has nothing to chat)
            routes.append(chat_page_route(self.names[0], self.engine.context))
        routes += tokenizer_routes(self.tokenizer, context=self.engine.context if self.engine is not None else None,
                                   vocab=self.vocab, check_key=self.check_key, read_body=self.body_of,
                                   error=_error)  # lm-eval's remote tokenizer
        return routes


async def _on_http_error(request: Request, exc: HTTPException) -> Response:
    return _error(APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}"))


async def _on_error(request: Request, exc: Exception) -> Response:
    log.exception("internal error")
    return _error(APIError(500, f"internal error: {type(exc).__name__}"))


def _lifespan(engine: Engine | None):
    """The application's lifespan: the engine started with it and drained when it stops."""
    @contextlib.asynccontextmanager
    async def lifespan(app):
        if engine is not None:
            engine.start()
        try:
            yield
        finally:
            if engine is not None:
                engine.stop()
    return lifespan


def create_app(engine: Engine | None, *, model_name: str | list[str], api_key: str | None = None,
               max_body: int = MAX_BODY, any_model_name: bool = False, embedder: Embedder | None = None) -> Starlette:
    """The ASGI application serving ``engine`` as model ``model_name`` (the engine is started and drained with it).

    Args:
        engine: the language model's engine; None for a text-embedding run, served by ``embedder``.
        model_name: the name, or the names (aliases, ``--model-name`` repeated), a request's ``model`` may
            give; the first is the one ``/v1/models`` lists first. Another name is a 404 naming them, unless
            ``any_model_name``: then any name is accepted (and echoed back), as a client's default name.
        api_key: the key every ``/v1`` request must send as ``Authorization: Bearer KEY`` (None: none).
        max_body: the largest request body in bytes (413 beyond).
    """
    names = [model_name] if isinstance(model_name, str) else list(dict.fromkeys(model_name))
    if not names:
        raise ValueError("at least one model name is needed")
    if any(not isinstance(name, str) or not name.strip() for name in names):
        raise ConfigError(f"a model name must be a non-blank string, got {names!r}")
    if (engine is None) == (embedder is None):
        raise ValueError("give an engine (a language model) or an embedder (a text-embedding run)")
    served = _Served(engine, embedder, names, api_key=api_key, max_body=max_body, any_model_name=any_model_name)
    return Starlette(routes=served.routes(), lifespan=_lifespan(engine),
                     exception_handlers={HTTPException: _on_http_error, Exception: _on_error})


def _echo(r: _Request, i: int, text_of: TokenText) -> tuple[str, dict | None]:
    """An echoed prompt's text and (with logprobs) its completions ``logprobs`` object."""
    req, seq = r.req, r.seqs[i]
    logprobs = None
    if req.logprobs is not None:
        logprobs = completion_logprobs(text_of, seq.prompt_logprobs, first=seq.prompt[0])
    return req.prompt_texts[i], logprobs


def _join(a: dict | None, b: dict) -> dict:
    """Two completions ``logprobs`` objects, ``b``'s offsets moved past ``a``'s text."""
    if a is None:
        return b
    end = sum(len(t) for t in a["tokens"])
    return {"tokens": a["tokens"] + b["tokens"], "token_logprobs": a["token_logprobs"] + b["token_logprobs"],
            "top_logprobs": a["top_logprobs"] + b["top_logprobs"],
            "text_offset": a["text_offset"] + [offset + end for offset in b["text_offset"]]}


async def _collect(request: Request, r: _Request, text_of: TokenText) -> Response:
    """A whole completion; a client that goes away meanwhile cancels it."""
    entries: list[list] = [[] for _ in r.seqs]
    texts = [""] * len(r.seqs)
    reasons: list[str | None] = [None] * len(r.seqs)
    checked = time.monotonic()
    try:
        while None in reasons:
            try:
                i, event = await asyncio.wait_for(r.queue.get(), timeout=DISCONNECT_POLL)
            except asyncio.TimeoutError:
                i, event = -1, None
            if time.monotonic() - checked >= DISCONNECT_POLL:  # whether or not text keeps coming
                checked = time.monotonic()
                if await request.is_disconnected():
                    return Response(status_code=499)  # nobody reads it (the rows are freed below)
            if event is None:
                continue
            texts[i] += event.text
            entries[i] += event.logprobs
            if event.finish_reason == "error":
                return _error(_failed(event))
            if event.finish_reason is not None:
                reasons[i] = event.finish_reason
    finally:
        r.cancel()
    req = r.req
    if req.chat:
        logprobs = None if req.logprobs is None else chat_logprobs(text_of, entries[0])
        message, reason = _reply(req, texts[0], reasons[0])
        return JSON(chat_body(req, texts[0], reason, r.usage(), logprobs, message=message))
    lps = None
    if req.logprobs is not None:
        lps = [completion_logprobs(text_of, entry) for entry in entries]
    if req.echo:
        for i in range(len(texts)):
            head, head_lp = _echo(r, i, text_of)
            texts[i] = head + texts[i]
            if lps is not None:
                lps[i] = _join(head_lp, lps[i])
    return JSON(completion_body(req, texts, reasons, r.usage(), lps))


def _reply(req: CompletionRequest, text: str, reason: str) -> tuple[dict[str, Any], str]:
    """A chat reply's message and finish reason: its tool calls parsed when the request has tools."""
    if req.tools:
        content, calls = parse_tool_calls(text)
        if calls:
            return {"role": "assistant", "content": content, "tool_calls": calls}, "tool_calls"
    return {"role": "assistant", "content": text}, reason


async def _stream(r: _Request, text_of: TokenText) -> AsyncIterator[str]:
    req = r.req
    echoed: set[int] = set()
    held = ""  # a reply that may be tool calls is sent when complete
    try:
        if req.chat:
            yield _sse(chat_chunk(req, {"role": "assistant", "content": ""}, None))
        async for i, event in r.events():
            if event.finish_reason == "error":
                yield _sse(error_body(_failed(event)))
                break
            if req.echo and i not in echoed:  # the prompt's text (and logprobs) first: it is prefilled by now
                echoed.add(i)
                head, head_lp = _echo(r, i, text_of)
                yield _sse(completion_chunk(req, i, head, None, logprobs=head_lp))
            if req.tools:
                held += event.text
                if event.finish_reason is None:
                    continue
                message, reason = _reply(req, held, event.finish_reason)
                delta = {k: v for k, v in message.items() if k != "role"}
                if "tool_calls" in delta:
                    delta["tool_calls"] = [{"index": j, **call} for j, call in enumerate(delta["tool_calls"])]
                yield _sse(chat_chunk(req, delta, None))
                yield _sse(chat_chunk(req, {}, reason))
                continue
            if event.text or event.logprobs:
                if req.chat:
                    logprobs = None if req.logprobs is None else chat_logprobs(text_of, event.logprobs)
                    yield _sse(chat_chunk(req, {"content": event.text}, None, logprobs=logprobs))
                else:
                    logprobs = None if req.logprobs is None else completion_logprobs(text_of, event.logprobs)
                    yield _sse(completion_chunk(req, i, event.text, None, logprobs=logprobs))
            if event.finish_reason is not None:
                yield _sse(chat_chunk(req, {}, event.finish_reason) if req.chat
                           else completion_chunk(req, i, "", event.finish_reason))
        if req.include_usage:
            yield _sse(chat_chunk(req, None, None, r.usage()) if req.chat
                       else completion_chunk(req, -1, "", None, r.usage()))
        yield "data: [DONE]\n\n"
    finally:
        r.cancel()  # a client that went away: free its rows


def _speculation_shown(engine: Engine) -> str:
    """The start log's words for the server's speculative decoding (``GET /health``'s ``speculative`` says it too)."""
    spec = engine.speculation
    if spec.mode == "off":
        return "off" + (f" (requests may ask for drafts from {spec.draft})" if spec.draft else "")
    source = "n-gram drafts" if spec.mode == "ngram" else f"drafts from {spec.draft}"
    return f"{spec.mode}: {source}, up to {spec.draft_tokens} a round"


def serving_mode(model, quantize: str = "auto") -> str:
    """The decoding copy ``tokennet serve`` uses: ``quantize`` itself, or for ``"auto"`` the fastest copy that keeps
    the model's quality, in eager batched steps as in compiled ones: on the CPU, ``"int4"`` for a model whose
    linear layers all hold GGUF Q8_0/Q4_0/Q4_1 blocks (an imported file's: its own blocks, multiplied by
    :mod:`tokennet.layers.int8dot`'s block kernel, where :func:`~tokennet.layers.int8dot.blocks_available`),
    otherwise ``"int8"`` (per-channel weights, ~¼ of float32's bytes per token; another run holding blocks has them
    requantized: without the block kernel, or in other formats, its blocks would be dequantized at every eager
    forward, measured ~1 token/s at 4 streams on SmolLM2-135M Q4_1); ``"none"`` elsewhere (cuBLAS' float32)."""
    if quantize != "auto":
        return quantization.check_mode(quantize)
    if next(model.parameters()).device.type != "cpu":
        return "none"
    return "int4" if quantization.holds_file_blocks(model) else "int8"


def serving_threads(threads: int | None = None, device: str = "cpu") -> int | None:
    """The intra-op threads ``tokennet serve`` decodes with on the CPU: ``threads`` as given, or by default all but
    one of the threads torch would use (``OMP_NUM_THREADS``, else the cores), at least 1; None off the CPU.

    The core left over runs the HTTP server's event loop (and, on a machine that also runs them, its clients).
    A decoding step is ~150 small parallel regions; with every core in its thread team, each region waits for a
    thread that the event loop or a client has just taken the core from. On 2 cores with the streaming ``openai``
    client on the same machine, the 2-thread step served SmolLM2 several times slower at one stream than the 1-thread
    one (``bench/results/serve-vs-llamacpp.json``: this default against llama.cpp's server; ``bench/serve.py
    --threads`` sets both servers' ``OMP_NUM_THREADS``)."""
    if device != "cpu":
        return None
    if threads is None:
        return max(1, torch.get_num_threads() - 1)
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise RunError(f"threads must be a whole number >= 1, got {threads!r}")
    return threads


def engine_for_run(run, *, max_batch: int = 16, context: int | None = None, quantize: str = "auto",
                   max_queue: int | None = MAX_QUEUE, prefix_cache_mb: float = PREFIX_CACHE_MB,
                   compile: bool | None = None, speculative: str = "off", draft=None, draft_tokens: int = 8) -> Engine:
    """An :class:`Engine` for a loaded language-model run; a RunError when the run is not one (``quantize``:
    see :func:`serving_mode`; ``prefix_cache_mb``: the prefix cache's bound, 0 = off; ``compile``: the compiled
    decoding step, None = on unless ``TOKENNET_COMPILE=0``). ``speculative``, ``draft`` (a run directory or a loaded
    run; alone it implies ``"draft"``) and ``draft_tokens``: the server's speculative decoding, checked as ``tokennet
    generate`` checks it (:func:`~tokennet.serve.drafting.check_speculation`: a draft run with another tokenizer is
    refused, naming both)."""
    model = run.model
    if run.tokenizer is None or not hasattr(model, "forward_features") or not hasattr(model.config, "block_size"):
        raise RunError(f"{run.path} is {run.task.a_name} run: tokennet serve serves language models with a "
                       "tokenizer (completions, chat) and text-embedding runs (/v1/embeddings)")
    if context is not None and not 2 <= context <= model.config.block_size:  # never clamped silently
        raise RunError(f"the context must be 2 to the model's {model.config.block_size} tokens, got {context}")
    template = getattr(run.tokenizer, "chat_template", None)
    if template and importlib.util.find_spec("jinja2") is not None:  # refused at start, not on every chat request
        check_chat_template(template, where=str(run.path))
    helper, mode = None, speculative
    if speculative != "off" or draft is not None:
        helper = check_speculation(run, speculative, draft, draft_tokens)
        mode = "draft" if helper is not None else speculative
    return Engine(model, run.tokenizer, max_batch=max_batch, context=context, quantize=serving_mode(model, quantize),
                  max_queue=max_queue, prefix_cache_mb=prefix_cache_mb, compile=compile, speculative=mode,
                  draft_model=None if helper is None else helper.model, draft_tokens=draft_tokens,
                  draft_name=None if helper is None else str(helper.path))


def serve(run_dir: str | Path, *, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
          model_name: str | list[str] | None = None, any_model_name: bool = False, max_batch: int = 16,
          context: int | None = None, device: str = "cpu",
          log_level: str = "info", quantize: str = "auto", max_queue: int | None = MAX_QUEUE,
          max_body: int = MAX_BODY, prefix_cache_mb: float = PREFIX_CACHE_MB, compile: bool | None = None,
          threads: int | None = None, speculative: str = "off", draft: str | Path | None = None,
          draft_tokens: int = 8) -> None:
    """Serve a language-model run over HTTP until Ctrl-C (which lets the requests in flight finish).

    ``api_key`` is used as given (the CLI reads ``--api-key`` or ``TOKENNET_API_KEY``); ``max_queue``: the most
    sequences waiting for a row (429 beyond); ``max_body``: the largest request body in bytes; ``quantize``: the
    decoding copy (``"auto"``: :func:`serving_mode`); ``prefix_cache_mb``: the prefix cache's bound (0: off);
    ``compile``: decode with the compiled step (None: on unless ``TOKENNET_COMPILE=0``), compiled in the background
    while the first requests are decoded eagerly (:meth:`Engine.warm_up_in_background`; a later start loads it from
    Inductor's on-disk cache); ``threads``: the CPU
    threads a decoding step uses (:func:`serving_threads`; set before anything is compiled, whose kernels keep it);
    ``speculative``, ``draft``, ``draft_tokens``: the speculative decoding of requests that do not choose theirs
    (:func:`engine_for_run`; a request's ``"speculative"`` and ``"draft_tokens"`` fields choose per request).
    """
    import uvicorn

    from ..run import load

    n_threads = serving_threads(threads, torch.device(device).type)
    if n_threads is not None:
        torch.set_num_threads(n_threads)
    run = load(run_dir, device=device)
    name = ([model_name] if isinstance(model_name, str) else list(model_name or [])) or [Path(run_dir).resolve().name]
    shown = " / ".join(map(repr, name)) + (" (any name accepted)" if any_model_name else "")
    if getattr(run.task, "kind", None) == "text-embedding":  # a sentence encoder: POST /v1/embeddings
        app = create_app(None, embedder=Embedder(run), model_name=name, api_key=api_key, max_body=max_body,
                         any_model_name=any_model_name)
        log.info("serving %s (text embeddings) as model %s on http://%s:%d/v1", run_dir, shown, host, port)
    else:
        engine = engine_for_run(run, max_batch=max_batch, context=context, quantize=quantize, max_queue=max_queue,
                                prefix_cache_mb=prefix_cache_mb, compile=compile, speculative=speculative, draft=draft,
                                draft_tokens=draft_tokens)
        if engine.step is not None:  # requests are answered at once, eagerly, until the compiled step is ready
            engine.warm_up_in_background(functools.partial(prebuild.spawn, run_dir, "rows", engine.quantize))
            log.info("the batched decoding step is loaded from %s, or built there once per machine by a process at the "
                     "lowest priority; requests are decoded eagerly until it is ready (--no-compile: always eager)",
                     step_store.store_dir())
        app = create_app(engine, model_name=name, api_key=api_key, max_body=max_body, any_model_name=any_model_name)
        int8 = "int8 per-channel" + (" × int8 activations (integer dot products)" if int8dot.available() else "")
        int4 = "4-bit blocks (a GGUF file's own, as they are)" + (
            " × int8 activations (integer dot products)" if int8dot.blocks_available() else "")
        weights = {"none": "float32", "bf16": "bf16", "int8": int8, "int4": int4}[engine.quantize]
        log.info("serving %s as model %s on http://%s:%d/v1 (batch %d, context %d, %s weights%s, prefix cache %s, "
                 "speculative %s)", run_dir, shown, host, port, max_batch, engine.context, weights,
                 " chosen by --quantize auto" if quantize == "auto" else "",
                 "off" if engine.prefix is None else f"{prefix_cache_mb:g} MiB", _speculation_shown(engine))
        if engine.step is None:
            log.info("batched decoding runs eagerly (--no-compile or TOKENNET_COMPILE=0)")
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=None)
