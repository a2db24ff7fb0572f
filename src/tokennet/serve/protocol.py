"""The OpenAI API's request fields, checked one by one, and its response bodies.

Every request field a client may send is either used (``model, prompt, messages, max_tokens,
max_completion_tokens, temperature, top_p, stop, stream, stream_options, seed, n=1, logprobs,
top_logprobs, echo, response_format, tools, tool_choice``, vLLM's ``top_k``, and tokennet's extensions
``speculative`` and ``draft_tokens``: :func:`speculation_fields`), accepted when it asks for nothing (``user``,
penalties of 0, ...), or
refused with a 400 that names it: a client must never believe a setting took effect when it did not.
Unknown fields are ignored, as the OpenAI API ignores them. An error body is OpenAI's::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens", "code": null}}
"""

from __future__ import annotations

import math
import numbers
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..jsonio import JSONTooDeep, loads
from ..speculative import SPECULATIVE_MODES
from .engine import SamplingParams
from .errors import APIError, error_body  # re-exported: their old home
from .tools import call_schema, check_tools, tool_messages

__all__ = ["APIError", "CompletionRequest", "MAX_PROMPTS", "parse_completion", "parse_chat", "error_body",
           "completion_body", "chat_body", "completion_chunk", "chat_chunk", "usage", "speculation_fields"]

MAX_STOP = 4
MAX_LOGPROBS = 20  # top_logprobs / logprobs at most (OpenAI's cap)
MAX_PROMPTS = 2048  # prompts in one completions request at most (OpenAI's limit)


@dataclass
class CompletionRequest:
    """A checked request: prompts as token ids, the sampling settings, streaming options."""

    prompts: list[list[int]]
    params: SamplingParams
    stream: bool = False
    include_usage: bool = False
    model: str = ""
    chat: bool = False
    logprobs: int | None = None  # None: off; k: each token's log probability and the k most likely tokens'
    echo: bool = False  # completions: the prompt comes back before the completion (with its logprobs)
    prompt_texts: list[str] = field(default_factory=list)  # what echo returns, one per prompt
    tools: bool = False  # chat: the reply is parsed for tool calls (:mod:`.tools`)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))


def parse_json(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object, parsed through :func:`tokennet.jsonio.loads` (at most
    :data:`~tokennet.jsonio.MAX_JSON_DEPTH` levels deep, so nothing that walks it later recurses without bound);
    a 400 for anything else."""
    try:
        body = loads(raw, what="the request body")
    except JSONTooDeep as error:
        raise APIError(400, str(error)) from None
    except (ValueError, UnicodeDecodeError) as error:
        raise APIError(400, f"the request body is not valid JSON: {error}") from None
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    return body


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


def _number(body, name, default, lo, hi, *, lo_open=False):
    v = body.get(name)
    if v is None:
        return default
    if not _is_num(v) or v > hi or v < lo or (lo_open and v == lo):
        where = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise APIError(400, f"{name} must be a number in {where}, got {v!r}", param=name)
    return float(v)


def _refuse_unless(body, name, allowed: tuple, what: str) -> None:
    v = body.get(name)
    if v is not None and v not in allowed:
        raise APIError(400, f"{name}={v!r} is not supported by this server ({what})", param=name)


def check_model(model: Any, served: str | list[str], any_model: bool = False) -> str:
    """The model name a response carries: the one the client sent when it is served (any, with
    ``any_model``), else the first served name; a 404 naming the served names for any other."""
    names = [served] if isinstance(served, str) else list(served)
    if model is None:
        return names[0]
    if not isinstance(model, str):
        raise APIError(400, f"model must be a string, got {type(model).__name__}", param="model")
    if model not in names and not any_model:
        listed = ", ".join(repr(n) for n in names)
        raise APIError(404, f"the model {model!r} does not exist; this server serves {listed} (or start it with "
                       "--model-name NAME, or --any-model-name to accept any name)", param="model",
                       code="model_not_found")
    return model


def _logprobs(body: dict[str, Any], chat: bool) -> int | None:
    """How many top tokens each token's log probability comes with (None: no log probabilities).

    Chat: ``logprobs: true`` and ``top_logprobs: k``; completions: ``logprobs: k``. At most
    :data:`MAX_LOGPROBS`.
    """
    wanted, top = body.get("logprobs"), body.get("top_logprobs")
    if chat:
        if wanted is not None and not isinstance(wanted, bool):
            raise APIError(400, f"logprobs must be true or false, got {wanted!r}", param="logprobs")
        if top is not None and (not _is_int(top) or not 0 <= top <= MAX_LOGPROBS):
            raise APIError(400, f"top_logprobs must be an integer in [0, {MAX_LOGPROBS}], got {top!r}",
                           param="top_logprobs")
        if top and not wanted:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        return int(top or 0) if wanted else None
    if top not in (None, 0):
        raise APIError(400, "top_logprobs is a chat completions field; completions take logprobs: k",
                       param="top_logprobs")
    if wanted is None or wanted is False:
        return None
    if not _is_int(wanted) or not 0 <= wanted <= MAX_LOGPROBS:
        raise APIError(400, f"logprobs must be an integer in [0, {MAX_LOGPROBS}] (the most likely tokens "
                       f"returned beside each token), got {wanted!r}", param="logprobs")
    return int(wanted)


def _response_format(body: dict[str, Any], constraints) -> Any:
    """``response_format``: None (text), or the compiled grammar of ``json_object`` / ``json_schema``.

    ``{"type": "json_object"}``: any JSON object; ``{"type": "json_schema", "json_schema": {"name": ...,
    "schema": {...}}}``: JSON valid under the schema (no schema: any JSON value). A schema the decoder cannot
    compile is a 400 naming the problem (:mod:`.constrained`).
    """
    requested = body.get("response_format")
    if requested is None:
        return None
    if not isinstance(requested, dict) or requested.get("type") not in ("text", "json_object", "json_schema"):
        raise APIError(400, "response_format must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                       "{\"type\": \"json_schema\", \"json_schema\": {\"name\": ..., \"schema\": {...}}}",
                       param="response_format")
    if requested["type"] == "text":
        return None
    if constraints is None:
        raise APIError(400, "response_format is not supported by this server (constrained decoding needs the "
                       "llguidance package: pip install 'tokennet[serve]')", param="response_format")
    schema = None
    if requested["type"] == "json_schema":
        json_schema = requested.get("json_schema")
        if not isinstance(json_schema, dict) or not isinstance(json_schema.get("schema", {}), dict):
            raise APIError(400, "response_format.json_schema must be an object with a \"schema\" object",
                           param="response_format")
        schema = json_schema.get("schema", {})
    try:
        return constraints.compile(schema)
    except ValueError as error:
        raise APIError(400, f"response_format: the JSON schema cannot be used for constrained decoding: {error}",
                       param="response_format") from None


def speculation_fields(body: dict[str, Any], speculation, context: int) -> tuple[str | None, int | None]:
    """A request's speculative decoding (tokennet's extension fields): ``"speculative": "off" | "ngram" | "draft"``
    (None: the server's mode) and ``"draft_tokens": K`` (1 to the context − 1; None: the server's).

    ``speculation``: the engine's :class:`~tokennet.serve.engine.Speculation` (None: a server without one);
    ``"draft"`` is a 400 on a server without a draft run (``tokennet serve --draft RUN``).
    """
    mode, k = body.get("speculative"), body.get("draft_tokens")
    if mode is not None and mode not in SPECULATIVE_MODES:
        raise APIError(400, f"speculative must be one of {', '.join(map(repr, SPECULATIVE_MODES))}, got {mode!r}",
                       param="speculative")
    if mode == "draft" and (speculation is None or speculation.draft is None):
        raise APIError(400, "speculative 'draft' needs a draft model, and this server has none (tokennet serve "
                       "--draft RUN gives one); 'ngram' drafts from the text itself", param="speculative")
    if k is not None and (not _is_int(k) or not 1 <= k < context):
        raise APIError(400, f"draft_tokens must be an integer from 1 to {context - 1} (the context of {context} "
                       f"tokens less the one being continued), got {k!r}", param="draft_tokens")
    return mode, None if k is None else int(k)


def _common(body: dict[str, Any], served: str | list[str], *, default_max: int | None, context: int,
            prompt_len: int, stop_ids: list[int], extra_stop: list[str],
            prompt_param: str, any_model: bool = False, chat: bool = False,
            zero_max: bool = False, constraints=None, speculation=None) -> tuple[SamplingParams, bool, bool, str]:
    served = check_model(body.get("model"), served, any_model)
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise APIError(400, f"stream must be true or false, got {stream!r}", param="stream")
    opts = body.get("stream_options")
    include_usage = False
    if opts is not None:
        if not isinstance(opts, dict) or not isinstance(opts.get("include_usage", False), bool):
            raise APIError(400, "stream_options must be an object like {\"include_usage\": true}",
                           param="stream_options")
        include_usage = bool(opts.get("include_usage", False))
    n = body.get("n")
    if n is not None and (not _is_int(n) or n != 1):
        raise APIError(400, f"n must be 1 (one choice per prompt), got {n!r}", param="n")
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True)
    top_k = body.get("top_k")
    if top_k is not None and (not _is_int(top_k) or top_k < -1):
        raise APIError(400, f"top_k must be an integer >= -1 (-1 or 0: off), got {top_k!r}", param="top_k")
    for name in ("presence_penalty", "frequency_penalty"):
        v = body.get(name)
        if v is not None and (not _is_num(v) or v != 0):
            raise APIError(400, f"{name} must be 0 (penalties are not supported by this server), got {v!r}",
                           param=name)
    logprobs = _logprobs(body, chat)
    _refuse_unless(body, "best_of", (1,), "one candidate")
    if chat and body.get("echo") not in (None, False):  # completions only: a chat reply never repeats its prompt
        raise APIError(400, "echo is a completions field (the prompt before its completion); chat completions do "
                       "not take it", param="echo")
    for name in ("logit_bias", "functions", "suffix") + (() if chat else ("tools",)):
        v = body.get(name)
        if v not in (None, {}, []):
            raise APIError(400, f"{name} is not supported by this server", param=name)
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise APIError(400, f"user must be a string, got {type(user).__name__}", param="user")
    seed = body.get("seed")
    if seed is not None and (not _is_int(seed) or not -(2**63) <= seed < 2**63):
        raise APIError(400, f"seed must be an integer, got {seed!r}", param="seed")
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or len(stop) > MAX_STOP or not all(
            isinstance(item, str) and item for item in stop):
        raise APIError(400, f"stop must be a non-empty string or a list of at most {MAX_STOP} of them",
                       param="stop")
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(name)
    room = context - prompt_len
    if room < 1 and not (zero_max and room == 0 and max_tokens == 0):
        raise APIError(400, f"the prompt is {prompt_len} tokens; this model's context is {context} tokens, so "
                       "there is no room for a reply: shorten the prompt", param=prompt_param,
                       code="context_length_exceeded")
    if max_tokens is None:
        max_tokens = room if default_max is None else min(default_max, room)
    elif not _is_int(max_tokens) or max_tokens < (0 if zero_max else 1):
        what = "a non-negative integer (0 with echo: the prompt's log probabilities only)" if zero_max else \
            "a positive integer"
        raise APIError(400, f"{name} must be {what}, got {max_tokens!r}", param=name)
    elif max_tokens > room:
        raise APIError(400, f"this model's context is {context} tokens; the prompt is {prompt_len} tokens and "
                       f"{name}={max_tokens} asks for {prompt_len + max_tokens}: lower {name} to at most {room} "
                       "or shorten the prompt", param=name, code="context_length_exceeded")
    params = SamplingParams(max_tokens=int(max_tokens), temperature=temperature, top_p=top_p,
                            top_k=min(max(0, int(top_k or 0)), 2**31 - 1),  # past the vocabulary = off
                            stop=list(stop) + list(extra_stop or []),
                            stop_ids=list(stop_ids), seed=None if seed is None else int(seed),
                            logprobs=logprobs, constraint=_response_format(body, constraints))
    params.speculative, params.draft_tokens = speculation_fields(body, speculation, context)
    return params, stream, include_usage, served


def _prompts(body: dict[str, Any], tokenizer, vocab: int) -> list[list[int]]:
    given = body.get("prompt")
    if given is None:
        raise APIError(400, "prompt is required: a string, a list of strings, or token ids", param="prompt")
    if isinstance(given, str):
        items = [given]
    elif isinstance(given, list) and given and all(_is_int(t) for t in given):
        items = [given]
    elif isinstance(given, list) and given and all(isinstance(x, str) or (isinstance(x, list) and x and all(_is_int(t)
                                                                                         for t in x)) for x in given):
        items = given
    else:
        raise APIError(400, "prompt must be a string, a list of strings, a list of token ids, or a list of lists "
                       "of token ids", param="prompt")
    if len(items) > MAX_PROMPTS:  # before tokenizing any of them
        raise APIError(400, f"{len(items)} prompts in one request; at most {MAX_PROMPTS}", param="prompt")
    out = []
    for x in items:
        if isinstance(x, str):
            ids = tokenizer.encode(x) or [tokenizer.bos_id]
        else:
            if any(not 0 <= t < vocab for t in x):
                raise APIError(400, f"prompt token ids must be in [0, {vocab})", param="prompt")
            ids = list(x)
        out.append(ids)
    return out


def parse_completion(body: dict[str, Any], *, tokenizer, served: str | list[str], context: int, vocab: int,
                     stop_ids: list[int], any_model: bool = False, constraints=None,
                     speculation=None) -> CompletionRequest:
    """``POST /v1/completions``: one sequence per prompt (OpenAI's default ``max_tokens`` is 16).

    ``echo: true`` returns each prompt before its completion; with ``logprobs: k`` also the prompt tokens'
    log probabilities (the first token's is null), so ``max_tokens: 0, echo: true, logprobs: 1`` scores a
    text, as ``lm-eval``'s ``local-completions`` backend does.
    """
    echo = body.get("echo")
    if echo is not None and not isinstance(echo, bool):
        raise APIError(400, f"echo must be true or false, got {echo!r}", param="echo")
    prompts = _prompts(body, tokenizer, vocab)
    longest = max(len(ids) for ids in prompts)
    params, stream, include_usage, model = _common(body, served, default_max=16, context=context,
                                                   prompt_len=longest, stop_ids=stop_ids, extra_stop=[],
                                                   prompt_param="prompt", any_model=any_model, zero_max=bool(echo),
                                                   constraints=constraints, speculation=speculation)
    params.prompt_logprobs = bool(echo) and params.logprobs is not None
    texts = []
    if echo:
        given = body["prompt"]
        items = [given] if isinstance(given, str) or (given and _is_int(given[0])) else given
        texts = [x if isinstance(x, str) else tokenizer.decode(x, skip_special=False) for x in items]
    return CompletionRequest(prompts, params, stream, include_usage, model, logprobs=params.logprobs,
                             echo=bool(echo), prompt_texts=texts)


def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise APIError(400, "messages must be a non-empty list of {role, content} objects", param="messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise APIError(400, f"messages[{i}] must be an object", param="messages")
        role = m.get("role")
        if role == "developer":  # OpenAI's newer name for the system role
            role = "system"
        if role not in ("system", "user", "assistant", "tool"):
            raise APIError(400, f"messages[{i}].role must be system, developer, user, assistant or tool, got "
                           f"{role!r}", param="messages")
        content = m.get("content")
        if content is None and role == "assistant":
            content = ""
        if isinstance(content, list):  # content parts: text only
            if not all(isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
                       for part in content):
                raise APIError(400, f"messages[{i}].content: only text parts are supported", param="messages")
            content = "".join(part["text"] for part in content)
        if not isinstance(content, str):
            raise APIError(400, f"messages[{i}].content must be a string, got {type(content).__name__}",
                           param="messages")
        out.append({"role": role, "content": content})
    return out


def parse_chat(body: dict[str, Any], *, tokenizer, served: str | list[str], context: int, stop_ids: list[int],
               any_model: bool = False, constraints=None, speculation=None) -> CompletionRequest:
    """``POST /v1/chat/completions``: the conversation rendered with the run's chat template, one reply."""
    from ..data.chats import chat_stop_strings, render_chat
    from ..errors import DataError

    messages = tool_messages(_messages(body), body["messages"])
    name = served if isinstance(served, str) else served[0]
    tools, choice = check_tools(body, tokenizer, where=f"model {name!r}")
    extra = {} if tools is None else {"tools": tools}
    forced = None
    if choice == "required" or isinstance(choice, dict):  # the reply is held to a call's JSON schema
        what = "required" if choice == "required" else f"the function {choice['name']!r}"
        if constraints is None:
            raise APIError(400, f"tool_choice {what} needs constrained decoding, which needs the llguidance package "
                           "on the server (pip install 'tokennet[serve]'); \"auto\" lets the model decide",
                           param="tool_choice")
        if body.get("response_format") not in (None, {"type": "text"}):
            raise APIError(400, f"tool_choice {what} and response_format both constrain the reply: give one",
                           param="tool_choice")
        try:
            forced = constraints.compile(call_schema(tools, choice))
        except ValueError as error:
            raise APIError(400, f"tool_choice {what}: the tools' parameters schema cannot be used for constrained "
                           f"decoding: {error}", param="tools") from None
    try:
        prompt = render_chat(tokenizer, messages, add_generation_prompt=True, where=f"model {name!r}", **extra)
    except DataError as error:
        raise APIError(400, f"the conversation cannot be rendered with this model's chat template: {error}",
                       param="messages") from None
    except Exception as error:  # noqa: BLE001 - a template raising on these messages (jinja2 errors) is the request's
        raise APIError(400, f"the chat template refused these messages: {error}", param="messages") from None
    ids = tokenizer.encode(prompt) or [tokenizer.bos_id]
    params, stream, include_usage, model = _common(body, served, default_max=None, context=context,
                                                   prompt_len=len(ids), stop_ids=stop_ids,
                                                   extra_stop=chat_stop_strings(tokenizer), prompt_param="messages",
                                                   any_model=any_model, chat=True, constraints=constraints,
                                                   speculation=speculation)
    if forced is not None:
        params.constraint = forced
    return CompletionRequest([ids], params, stream, include_usage, model, chat=True, logprobs=params.logprobs,
                             tools=choice != "none")


# -- responses ---------------------------------------------------------------------------------------
def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class TokenText:
    """Each token id's text (``decode([id])``, special tokens included), remembered."""

    def __init__(self, tokenizer):
        self.tokenizer, self.memo = tokenizer, {}

    def __call__(self, token: int) -> str:
        t = self.memo.get(token)
        if t is None:
            t = self.memo[token] = self.tokenizer.decode_continuation([token], skip_special=False)
        return t


def completion_logprobs(text_of: TokenText, entries: list, *, first: int | None = None,
                        offset: int = 0) -> dict[str, Any]:
    """Completions' ``logprobs`` object: ``tokens, token_logprobs, top_logprobs, text_offset``.

    ``entries`` are :class:`~tokennet.serve.engine.TokenLogprob`; ``first``: a token before them with no
    log probability (an echoed prompt's first token: null, as OpenAI's). ``text_offset`` counts characters of
    the returned text from ``offset``.
    """
    tokens, lps, tops, offsets = [], [], [], []
    position = offset
    if first is not None:
        tokens.append(text_of(first))
        lps.append(None)
        tops.append(None)
        offsets.append(position)
        position += len(tokens[-1])
    for entry in entries:
        tokens.append(text_of(entry.token))
        lps.append(entry.logprob)
        top: dict[str, float] = {}
        for t, logprob in entry.top:  # two ids with one text: the likelier one's
            top.setdefault(text_of(t), logprob)
        tops.append(top)
        offsets.append(position)
        position += len(tokens[-1])
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(text_of: TokenText, entries: list) -> dict[str, Any]:
    """Chat's ``logprobs`` object: ``{"content": [{token, logprob, bytes, top_logprobs}], "refusal": null}``."""

    def one(t: int, lp: float) -> dict[str, Any]:
        text = text_of(t)
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8", "surrogatepass"))}

    return {"content": [{**one(entry.token, entry.logprob),
                         "top_logprobs": [one(t, logprob) for t, logprob in entry.top]}
                        for entry in entries], "refusal": None}


def completion_body(req: CompletionRequest, texts: list[str], reasons: list[str], use: dict,
                    logprobs: list | None = None) -> dict[str, Any]:
    return {"id": f"cmpl-{req.id}", "object": "text_completion", "created": req.created, "model": req.model,
            "choices": [{"index": i, "text": text, "logprobs": None if logprobs is None else logprobs[i],
                         "finish_reason": reason}
                        for i, (text, reason) in enumerate(zip(texts, reasons))], "usage": use}


def chat_body(req: CompletionRequest, text: str, reason: str, use: dict, logprobs: dict | None = None,
              message: dict | None = None) -> dict[str, Any]:
    msg = message or {"role": "assistant", "content": text}
    return {"id": f"chatcmpl-{req.id}", "object": "chat.completion", "created": req.created, "model": req.model,
            "choices": [{"index": 0, "message": msg, "logprobs": logprobs,
                         "finish_reason": reason}], "usage": use}


def completion_chunk(req: CompletionRequest, index: int, text: str, reason: str | None,
                     use: dict | None = None, logprobs: dict | None = None) -> dict[str, Any]:
    choices = [] if index < 0 else [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}]
    out = {"id": f"cmpl-{req.id}", "object": "text_completion", "created": req.created, "model": req.model,
           "choices": choices}
    if use is not None or req.include_usage:
        out["usage"] = use
    return out


def chat_chunk(req: CompletionRequest, delta: dict[str, Any] | None, reason: str | None,
               use: dict | None = None, logprobs: dict | None = None) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": reason}]
    out = {"id": f"chatcmpl-{req.id}", "object": "chat.completion.chunk", "created": req.created,
           "model": req.model, "choices": choices}
    if use is not None or req.include_usage:
        out["usage"] = use
    return out
