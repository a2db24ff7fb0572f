"""The served model's tokenizer over HTTP: ``POST /tokenize``, ``POST /detokenize``, ``GET /tokenizer_info``.

vLLM's and llama.cpp's servers have these; lm-eval's ``local-completions`` backend looks for them
(``tokenizer_backend=auto`` → ``remote``) so that it can tokenize a (context, continuation) pair itself,
send the token ids as the prompt, and know which of the echoed log-probabilities are the continuation's
— with a tokenizer that has no Hugging Face counterpart (a run's own character or BPE vocabulary).

    POST /tokenize    {"prompt": "text"}     → {"tokens": [ids], "count": n, "max_model_len": context}
    POST /detokenize  {"tokens": [ids]}      → {"prompt": "text"}
    GET  /tokenizer_info                     → {"eos_token", "bos_token", "pad_token", "chat_template", ...}

The ids are those ``/v1/completions`` reads from a text prompt (the tokenizer's own ``encode``, with the
special tokens it adds itself). Behind the API key when the server has one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .protocol import APIError, parse_json

__all__ = ["tokenizer_routes"]


def _special(tok, name: str) -> str | None:
    """The text of a special token, when the tokenizer reads that text back as the token (else None)."""
    i = getattr(tok, name, None)
    if i is None:
        return None
    try:
        text = tok.decode([i], skip_special=False)
    except (TypeError, ValueError, IndexError):
        return None
    return text if text and tok.encode(text) == [i] else None


def tokenizer_routes(tok, *, context: int | None, vocab: int | None, check_key: Callable[[Request], None],
                     read_body: Callable[[Request], Awaitable[bytes]],
                     error: Callable[[APIError], Response]) -> list[Route]:
    """The three routes for the app's tokenizer ``tok``: ``check_key`` raises an APIError (401), ``read_body``
    reads a body within the server's size limit (413 beyond), ``error`` renders an APIError."""

    async def body(request: Request) -> dict[str, Any]:
        return parse_json(await read_body(request) or b"{}")  # bounded depth, as every body

    async def tokenize(request: Request) -> Response:
        try:
            check_key(request)
            text = (await body(request)).get("prompt")
            if not isinstance(text, str):
                raise APIError(400, "prompt must be a string", param="prompt")
            ids = tok.encode(text)
        except APIError as failure:
            return error(failure)
        except UnicodeError as failure:
            return error(APIError(400, f"the text cannot be encoded as UTF-8: {failure}", param="prompt"))
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": context})

    async def detokenize(request: Request) -> Response:
        try:
            check_key(request)
            ids = (await body(request)).get("tokens")
            if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                raise APIError(400, "tokens must be a list of token ids", param="tokens")
            if vocab is not None and any(not 0 <= i < vocab for i in ids):
                raise APIError(400, f"token ids must be in [0, {vocab})", param="tokens")
        except APIError as failure:
            return error(failure)
        return JSONResponse({"prompt": tok.decode(ids)})

    info: dict[str, Any] = {}  # made on the first request (creating the app tokenizes nothing)

    async def tokenizer_info(request: Request) -> Response:
        try:
            check_key(request)
        except APIError as failure:
            return error(failure)
        if not info:
            info.update({"eos_token": _special(tok, "eos_id"), "bos_token": _special(tok, "bos_id"),
                         "pad_token": _special(tok, "pad_id"), "chat_template": getattr(tok, "chat_template", None),
                         "vocab_size": tok.vocab_size, "max_model_len": context})
        return JSONResponse(info)

    return [Route("/tokenize", tokenize, methods=["POST"]), Route("/detokenize", detokenize, methods=["POST"]),
            Route("/tokenizer_info", tokenizer_info)]
