"""A soak of `tokennet serve`: many streams of mixed requests for minutes, with bad requests and disconnects.

Two server processes (``python -m tokennet.cli serve``), on 127.0.0.1 only: a language-model run (completions,
chat, ``response_format``, ``tools``) and a text-embedding run (``/v1/embeddings``: a server serves one or the
other). Without ``--run`` / ``--encoder-run`` both are made on the fly with random weights (a gpt-mini over a
small byte-level BPE whose chat template takes tools; a one-layer text encoder): the soak measures the server,
not a model.

1. **Quiet answers**: one stream, before the load: every greedy case (completions and chat, temperature 0) and
   every embeddings case once; these are the expected answers.
2. **Soak**: ``--streams`` clients for ``--minutes``, each sending back to back (no new request after the
   deadline; each request is bounded by ``REQUEST_TIMEOUT_S``) a random mix of good requests — greedy (whole or
   streamed), sampled, structured output (``response_format`` JSON schema), tools (``tool_choice: required``),
   embeddings — and, in turn, probes: bad requests (malformed JSON, unknown fields beside fields of the wrong
   type, a negative ``max_tokens``, a schema no value satisfies, a body nested 10,000 levels deep, ``tools`` on
   ``/v1/completions``) and disconnects (a body shorter than its ``Content-Length``, then closed; a streamed
   completion closed after its first event).
3. **Checks**: a good request that gets no 200 answer (an error status, a closed connection, a timeout, a stream
   without ``[DONE]``) is *lost*; one whose answer is not right (a greedy text unequal to the quiet answer, a
   structured reply that does not validate, a forced tool call that is not one, an embedding unequal to the
   quiet one) is *wrong*. A bad request must get a 4xx: its 5xx and 2xx are counted apart. Every
   ``--sample-seconds``: each server's RSS (``VmRSS`` of ``/proc/PID/status``) and the prefix cache's bytes
   and bound (``/health``'s ``prefix_cache``). At the end no sequence may still hold a row (``/health``).

Verdicts: 0 lost, 0 wrong, no 5xx for a bad request, RSS growth <= 5% from the end of warm-up
(``--warmup-minutes``) to the end, the prefix cache within its bound at every sample, no row held at the end,
and each server's exit code 0 after Ctrl-C. The server's own log is scanned for internal errors.
The JSON records the command, the commit and the machine; ``tests/serve/test_soak.py`` runs the same code.

    python bench/serve_soak.py [--streams 16] [--minutes 10] [--run DIR] [--encoder-run DIR]
                               [--warmup-minutes 2] [--prefix-cache-mb 1] [--max-batch 16] [--threads 1]
                               [--quantize none] [--no-compile] [--seed 0] [--out bench/results/serve-soak.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import itertools
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/_record.py, bench/serve.py, also from a test
from _record import commit, machine  # noqa: E402
from serve import free_port, start_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REQUEST_TIMEOUT_S = 300.0  # a good request not answered by then is lost
MODEL = "bench"  # the name bench/serve.py's start_server gives the served model
PROMPTS = ["The history of the printing press", "def quicksort(items):", "In the beginning of the century",
           "A recipe for bread:", "The rules of chess are", "Photosynthesis is the process", "Dear diary, today",
           "The three laws of motion"]
EMBED_TEXTS = [["a man is playing a guitar"], ["someone plays the guitar", "the market fell sharply today"],
               ["bread, flour and water", "chess rules", "the river and the mountain"]]
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8}, "n": {"type": "integer", "minimum": 0, "maximum": 999},
    "tags": {"type": "array", "items": {"enum": ["a", "bb"]}, "maxItems": 3}, "ok": {"type": "boolean"}},
    "required": ["name", "n", "tags", "ok"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"], "additionalProperties": False}}}]
TEMPLATE = (  # Hermes-style, as tests/serve/test_tools.py: it reads `tools`, so tool requests are served
    "{%- if tools %}<|im_start|>system\nTools:\n{% for t in tools %}{{ t.function.name }}: "
    "{{ t.function.description }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# good request kinds and their weights in the mix; "probe" is the next bad request or disconnect in turn
MIX = {"greedy": 30, "sampled": 18, "structured": 12, "tools": 10, "embeddings": 10, "probe": 20}
GREEDY_TOKENS = 24


# -- the runs -----------------------------------------------------------------------------------------------------
def make_lm_run(path: Path) -> Path:
    """A random-weight gpt-mini (context 256) over a small byte-level BPE whose chat template takes tools."""
    sys.path.insert(0, str(ROOT / "src"))
    import tokenizers
    import torch

    from tokennet.models import create_model, save_pretrained
    from tokennet.run import save_tokenizer, write_run_info
    from tokennet.tokens.pretrained import PretrainedTokenizer

    bpe = tokenizers.ByteLevelBPETokenizer()
    corpus = PROMPTS + [json.dumps(SCHEMA), json.dumps(TOOLS), "system user assistant tool Paris London sunny"]
    bpe.train_from_iterator(corpus * 3, vocab_size=400, min_frequency=1, special_tokens=["<|im_start|>", "<|im_end|>"])
    engine = bpe._tokenizer
    tok = PretrainedTokenizer(engine, bos_id=engine.token_to_id("<|im_start|>"),
                              eos_id=engine.token_to_id("<|im_end|>"), chat_template=TEMPLATE)
    torch.manual_seed(0)
    model = create_model("gpt-mini", vocab_size=tok.vocab_size, block_size=256).eval()
    with torch.no_grad():  # spread-out logits: a greedy choice is not a near tie that rounding could flip
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
    save_pretrained(model, path)
    save_tokenizer(path, tok)
    write_run_info(path, recipe="gpt", model="gpt-mini", data=None, settings={})
    return path


def make_encoder_run(path: Path) -> Path:
    """A random-weight one-layer text encoder (a text-embedding run: what serves ``/v1/embeddings``)."""
    sys.path.insert(0, str(ROOT / "src"))
    import torch

    from tokennet.models.registry import model_from_config, save_pretrained
    from tokennet.models.text_encoder import TextEncoderConfig
    from tokennet.run import save_tokenizer, write_run_info
    from tokennet.tokens.text import CharTokenizer

    tok = CharTokenizer.train("abcdefghijklmnopqrstuvwxyz ,.:")
    torch.manual_seed(0)
    model = model_from_config(TextEncoderConfig(vocab_size=tok.vocab_size, max_len=128, dim=64, num_layers=1,
                                                num_heads=2, type_vocab_size=0))
    save_pretrained(model, path)
    save_tokenizer(path, tok)
    write_run_info(path, recipe="import", model="text-encoder", data=None, settings={})
    return path


# -- a minimal HTTP/1.1 client over asyncio streams (raw bytes: malformed bodies and cut connections too) ----------
@dataclass
class Reply:
    status: int
    body: bytes
    stream: bool = False  # text/event-stream
    events: list = field(default_factory=list)  # a stream's `data:` payloads, decoded ("[DONE]" kept as a str)


def _head(path: str, length: int) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def _dechunk(data: bytes) -> bytes:
    out, i = bytearray(), 0
    while True:
        j = data.index(b"\r\n", i)
        n = int(data[i:j].split(b";")[0], 16)
        if n == 0:
            return bytes(out)
        out += data[j + 2:j + 2 + n]
        i = j + 2 + n + 2


def _events(body: bytes) -> list:
    out = []
    for line in body.decode().split("\n"):
        if line.startswith("data: "):
            payload = line[6:]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


async def post(port: int, path: str, body: bytes | dict) -> Reply:
    """POST ``body`` (bytes sent as they are) and read the whole answer; a stream's events are parsed."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_head(path, len(raw)) + raw)
        await writer.drain()
        data = await reader.read()  # Connection: close: the answer ends where the connection does
    finally:
        writer.close()
    head, _, payload = data.partition(b"\r\n\r\n")
    if not head:
        raise ConnectionError("the server closed the connection without an answer")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    if headers.get("transfer-encoding") == "chunked":
        payload = _dechunk(payload)
    reply = Reply(int(lines[0].split()[1]), payload)
    if headers.get("content-type", "").startswith("text/event-stream"):
        reply.stream, reply.events = True, _events(payload)
    return reply


async def get_json(port: int, path: str) -> dict:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        data = await reader.read()
    finally:
        writer.close()
    head, _, payload = data.partition(b"\r\n\r\n")
    if b"chunked" in head.lower():
        payload = _dechunk(payload)
    return json.loads(payload)


async def partial_body(port: int) -> None:
    """Disconnect: a Content-Length of 4,096 bytes, 100 of them sent, then the connection closed."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_head("/v1/completions", 4096) + b'{"prompt": "' + b"x" * 88)
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.close()


async def cut_stream(port: int, prompt: str) -> str:
    """Disconnect: a streamed completion (of up to 150 tokens) closed after its first event."""
    raw = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 150, "temperature": 0.8,
                      "stream": True}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_head("/v1/completions", len(raw)) + raw)
        await writer.drain()
        status = (await reader.readline()).decode("latin-1").strip()
        while line := await reader.readline():
            if line.startswith(b"data: "):
                return "closed after the first event"
        return f"no event: {status}"
    finally:
        writer.close()


# -- good requests and what makes their answers right ---------------------------------------------------------------
class Lost(Exception):
    """A good request without a 200 answer (an error status, an error event, a stream cut short, no answer)."""


class Wrong(Exception):
    """A good request answered, but not rightly."""


def greedy_cases() -> list[tuple[str, str, dict]]:
    """(case id, path, body): each prompt as a completion and as a chat, greedy, ``GREEDY_TOKENS`` tokens."""
    cases = []
    for i, prompt in enumerate(PROMPTS):
        cases.append((f"completion-{i}", "/v1/completions",
                      {"model": MODEL, "prompt": prompt, "max_tokens": GREEDY_TOKENS, "temperature": 0}))
        cases.append((f"chat-{i}", "/v1/chat/completions",
                      {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
                       "max_tokens": GREEDY_TOKENS, "temperature": 0}))
    return cases


def read_answer(reply: Reply, chat: bool) -> tuple[str, str | None, dict]:
    """The text, the finish reason and (whole chat) the message of one choice; Lost when there is none."""
    if reply.status != 200:
        raise Lost(f"status {reply.status}: {reply.body[:160]!r}")
    if not reply.stream:
        choice = json.loads(reply.body)["choices"][0]
        if chat:
            return choice["message"].get("content") or "", choice["finish_reason"], choice["message"]
        return choice["text"], choice["finish_reason"], {}
    if not reply.events or reply.events[-1] != "[DONE]":
        raise Lost(f"a stream without [DONE] ({len(reply.events)} events)")
    text, finish = "", None
    for ev in reply.events[:-1]:
        if "error" in ev:
            raise Lost(f"error event: {str(ev['error'])[:160]}")
        for choice in ev.get("choices") or []:
            text += (choice.get("delta", {}).get("content") or "") if chat else choice.get("text", "")
            finish = choice.get("finish_reason") or finish
    return text, finish, {}


def noisy_prompt(rng: random.Random) -> str:
    """A prompt of 20-70 tokens whose tail is new: the prefix cache keeps storing blocks, so it fills and evicts."""
    return " ".join(rng.choice(PROMPTS) for _ in range(rng.randint(1, 4))) + f" ({rng.randrange(10**9)})"


async def greedy(lm: int, rng: random.Random, expected: dict) -> str:
    case, path, body = rng.choice(greedy_cases())
    stream = rng.random() < 0.5
    text, finish, _ = read_answer(await post(lm, path, {**body, "stream": stream}), "chat" in case)
    if [text, finish] != expected[case]:
        raise Wrong(f"{case} (stream={stream}): {text!r} ({finish}), quiet: {expected[case][0]!r} "
                    f"({expected[case][1]})")
    return "stream" if stream else "whole"


async def sampled(lm: int, rng: random.Random, expected: dict) -> str:
    n = rng.randint(8, 48)
    chat = rng.random() < 0.5
    body = {"model": MODEL, "max_tokens": n, "temperature": 0.8, "top_p": 0.95}
    if rng.random() < 0.5:
        body["seed"] = rng.randrange(1000)
    if chat:
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": noisy_prompt(rng)}]
    else:
        path, body["prompt"] = "/v1/completions", noisy_prompt(rng)
    reply = await post(lm, path, body)
    _, finish, _ = read_answer(reply, chat)
    used = json.loads(reply.body)["usage"]["completion_tokens"]
    if finish not in ("stop", "length") or (finish == "length" and used != n) or used > n:
        raise Wrong(f"finish_reason {finish!r} with {used} of {n} tokens")
    return "chat" if chat else "completion"


async def structured(lm: int, rng: random.Random, expected: dict) -> str:
    rf = {"type": "json_schema", "json_schema": {"name": "record", "schema": SCHEMA}}
    body = {"model": MODEL, "prompt": noisy_prompt(rng), "max_tokens": 120, "temperature": 1.0, "response_format": rf}
    text, finish, _ = read_answer(await post(lm, "/v1/completions", body), chat=False)
    if finish == "length":
        return "cut"  # valid so far; a random model may still be inside a string at max_tokens
    try:
        validate(json.loads(text), SCHEMA)
    except ValueError as e:
        raise Wrong(f"finish_reason {finish!r}, {text!r}: {e}") from None
    return "valid"


async def tools(lm: int, rng: random.Random, expected: dict) -> str:
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"weather? {noisy_prompt(rng)}"}],
            "tools": TOOLS, "tool_choice": "required", "max_tokens": 60, "temperature": 0.7}
    _, finish, message = read_answer(await post(lm, "/v1/chat/completions", body), chat=True)
    if finish == "length":
        return "cut"
    calls = message.get("tool_calls") or []
    try:
        if finish != "tool_calls" or len(calls) != 1 or calls[0]["function"]["name"] != "get_weather":
            raise ValueError(f"not one get_weather call: {message}")
        validate(json.loads(calls[0]["function"]["arguments"]), TOOLS[0]["function"]["parameters"])
    except ValueError as e:
        raise Wrong(f"finish_reason {finish!r}: {e}") from None
    return "call"


async def embeddings(enc: int, rng: random.Random, expected: dict) -> str:
    i = rng.randrange(len(EMBED_TEXTS))
    reply = await post(enc, "/v1/embeddings", {"model": MODEL, "input": EMBED_TEXTS[i], "encoding_format": "float"})
    if reply.status != 200:
        raise Lost(f"status {reply.status}: {reply.body[:160]!r}")
    got = [d["embedding"] for d in sorted(json.loads(reply.body)["data"], key=lambda d: d["index"])]
    want = expected[f"embeddings-{i}"]
    worst = max((abs(a - b) for u, v in zip(got, want) for a, b in zip(u, v)), default=math.inf)
    if len(got) != len(want) or any(len(u) != len(v) for u, v in zip(got, want)) or worst > 1e-6:
        raise Wrong(f"embeddings-{i}: max |difference| {worst} from the quiet answer")
    return f"{len(got)} input(s)"


def validate(value, schema: dict) -> None:
    """``jsonschema.validate`` (a ValueError when the value does not satisfy the schema)."""
    import jsonschema

    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as e:
        raise ValueError(e.message) from None


GOOD = {"greedy": greedy, "sampled": sampled, "structured": structured, "tools": tools, "embeddings": embeddings}


# -- probes: bad requests (each must get a 4xx) and disconnects, sent in turn ---------------------------------------
UNSATISFIABLE = {"type": "json_schema", "json_schema": {"name": "none", "schema": {
    "type": "object", "properties": {"n": {"type": "integer", "minimum": 10, "maximum": 1}}, "required": ["n"]}}}
BAD = {  # name: (path, body)
    "malformed_json": ("/v1/completions", b'{"model": "bench", "prompt": "x", "max_tokens": 4'),
    "unknown_fields_wrong_types": ("/v1/completions", {"model": MODEL, "prompt": "x", "frobnicate": {"a": [1, None]},
                                                       "max_tokens": "eight", "temperature": "hot"}),
    "negative_max_tokens": ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": -5}),
    "unsatisfiable_schema": ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 16,
                                                 "response_format": UNSATISFIABLE}),
    "nested_10000": ("/v1/completions", b'{"model": "bench", "prompt": "x", "extra": ' + b"[" * 10_000
                     + b"]" * 10_000 + b"}"),
    "tools_on_completions": ("/v1/completions", {"model": MODEL, "prompt": "x", "tools": TOOLS}),
}
DISCONNECTS = ("partial_body", "cut_stream")
PROBES = tuple(BAD) + DISCONNECTS


async def probe(name: str, lm: int, rng: random.Random) -> str:
    """Send one probe: a bad request's status as a string, or what a disconnect did."""
    if name == "partial_body":
        await partial_body(lm)
        return "closed"
    if name == "cut_stream":
        return await cut_stream(lm, noisy_prompt(rng))
    path, body = BAD[name]
    return str((await post(lm, path, body)).status)


# -- the soak -------------------------------------------------------------------------------------------------------
async def quiet_answers(lm: int, enc: int) -> dict:
    """The expected answers: every greedy case and every embeddings case once, one at a time, before the load."""
    out = {}
    for case, path, body in greedy_cases():
        text, finish, _ = read_answer(await post(lm, path, body), "chat" in case)
        out[case] = [text, finish]
    for i, texts in enumerate(EMBED_TEXTS):
        reply = await post(enc, "/v1/embeddings", {"model": MODEL, "input": texts, "encoding_format": "float"})
        if reply.status != 200:
            raise Lost(f"the quiet embeddings request got {reply.status}: {reply.body[:200]!r}")
        out[f"embeddings-{i}"] = [d["embedding"] for d in sorted(json.loads(reply.body)["data"],
                                                                 key=lambda d: d["index"])]
    return out


def rss_kb(pid: int) -> int | None:
    """``VmRSS`` of ``/proc/PID/status`` in KiB (None where there is no /proc or no such process)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return None


async def sample(t0: float, lm: int, pids: dict) -> dict:
    """One sample: seconds since the start, each server's RSS, the engine's rows and the prefix cache."""
    row = {"t_s": round(time.monotonic() - t0, 1), **{f"rss_kb_{k}": rss_kb(pid) for k, pid in pids.items()}}
    try:
        h = await asyncio.wait_for(get_json(lm, "/health"), 30)
    except (OSError, ValueError, asyncio.TimeoutError) as e:
        return {**row, "health_error": f"{type(e).__name__}: {e}"}
    cache = h.get("prefix_cache") or {}
    return {**row, "running": h.get("running"), "waiting": h.get("waiting"), "cache_bytes": cache.get("bytes"),
            "cache_budget_bytes": cache.get("budget_bytes"), "cache_blocks": cache.get("blocks")}


def new_tally() -> dict:
    return {"good": {k: {"sent": 0, "ok": 0, "lost": 0, "wrong": 0, "outcomes": {}} for k in GOOD},
            "probes": {k: {"sent": 0, "outcomes": {}} for k in PROBES}, "examples": []}


async def one_request(kind: str, ports: dict, rng: random.Random, expected: dict, tally: dict, turn) -> None:
    """Send one request of ``kind`` (a probe: the next in turn) and count its outcome."""
    if kind == "probe":
        name = PROBES[next(turn) % len(PROBES)]
        try:
            outcome = await asyncio.wait_for(probe(name, ports["lm"], rng), REQUEST_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - a cut connection, a timeout, an answer that is not HTTP
            outcome = f"no answer ({type(e).__name__})"
        rec = tally["probes"][name]
        rec["sent"] += 1
        rec["outcomes"][outcome] = rec["outcomes"].get(outcome, 0) + 1
        return
    rec = tally["good"][kind]
    rec["sent"] += 1
    port = ports["enc"] if kind == "embeddings" else ports["lm"]
    try:
        outcome = await asyncio.wait_for(GOOD[kind](port, rng, expected), REQUEST_TIMEOUT_S)
        rec["ok"] += 1
    except Wrong as e:
        rec["wrong"] += 1
        outcome = "wrong"
        tally["examples"].append(f"{kind}: wrong: {e}"[:400])
    except Exception as e:  # noqa: BLE001 - an error status, a cut connection, a timeout, an answer of another shape
        rec["lost"] += 1
        outcome = "lost"
        tally["examples"].append(f"{kind}: lost: {type(e).__name__}: {e}"[:400])
    rec["outcomes"][outcome] = rec["outcomes"].get(outcome, 0) + 1


def progress(tally: dict, row: dict) -> str:
    """One line: the requests so far, the lost and wrong ones, the probes, and the latest sample."""
    sent, lost, wrong = (sum(r[k] for r in tally["good"].values()) for k in ("sent", "lost", "wrong"))
    probes = sum(r["sent"] for r in tally["probes"].values())
    return f"  {row['t_s']:6.0f} s: {sent} good requests ({lost} lost, {wrong} wrong), {probes} probes; {row}"


async def soak(ports: dict, pids: dict, *, streams: int, seconds: float, sample_s: float, seed: int,
               expected: dict, progress_s: float | None = None) -> dict:
    """``streams`` clients sending the mix back to back for ``seconds``; samples every ``sample_s`` seconds (and a
    line of progress every ``progress_s``)."""
    tally, turn, samples = new_tally(), itertools.count(), []
    t0 = time.monotonic()
    deadline = t0 + seconds

    async def client(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        while time.monotonic() < deadline:
            kind = rng.choices(list(MIX), weights=list(MIX.values()))[0]
            await one_request(kind, ports, rng, expected, tally, turn)

    async def sampler() -> None:
        said = 0.0
        while True:
            samples.append(await sample(t0, ports["lm"], pids))
            if progress_s and samples[-1]["t_s"] >= said + progress_s:
                said = samples[-1]["t_s"]
                print(progress(tally, samples[-1]), flush=True)
            await asyncio.sleep(sample_s)

    sampling = asyncio.create_task(sampler())
    await asyncio.gather(*(client(i) for i in range(streams)))
    sampling.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sampling
    wall = time.monotonic() - t0
    samples.append(await sample(t0, ports["lm"], pids))
    return {**tally, "seconds": round(wall, 1), "samples": samples, "after": await settled(ports["lm"], t0, pids)}


async def settled(lm: int, t0: float, pids: dict, wait_s: float = 15.0) -> dict:
    """The server's state once the load is over: a sample taken when no row is held (or after ``wait_s``)."""
    deadline = time.monotonic() + wait_s
    while True:
        row = await sample(t0, lm, pids)
        if (row.get("running"), row.get("waiting")) == (0, 0) or time.monotonic() > deadline:
            return row
        await asyncio.sleep(0.5)


# -- the servers ----------------------------------------------------------------------------------------------------
class Servers:
    """The server processes: each stopped with Ctrl-C at the end (killed after 60 s), its exit code and log read."""

    def __init__(self):
        self.procs: dict[str, subprocess.Popen] = {}
        self.ports: dict[str, int] = {}
        self.stopped: dict[str, dict] = {}

    def start(self, name: str, run: Path, *, threads: int, max_batch: int, extra: list[str],
              quantize: str = "auto") -> None:
        port = free_port()
        self.procs[name] = start_server(run, port, threads, max_batch, quantize, extra)
        self.ports[name] = port

    def pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in self.procs.items()}

    def stop(self) -> None:
        for name, proc in self.procs.items():
            proc.send_signal(signal.SIGINT)  # Ctrl-C: the requests in flight finish, then it exits
            try:
                code = proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = None
            proc.log.seek(0)  # the server has exited: its log is whole
            self.stopped[name] = {"exit_code": code, **log_errors(proc.log.read().decode(errors="replace"))}
        self.procs.clear()


def log_errors(text: str) -> dict:
    """What a server's log says went wrong: tracebacks, 'internal error' lines, the distinct exception lines."""
    exc = [ln.strip() for ln in text.splitlines() if ln and not ln[0].isspace()
           and ln.split(":")[0].split(".")[-1].endswith(("Error", "Exception", "Disconnect"))]
    return {"tracebacks": text.count("Traceback (most recent call last)"),
            "internal_error_lines": text.count("internal error"),
            "exceptions": {e: exc.count(e) for e in dict.fromkeys(x[:200] for x in exc[:2000])}}


@contextlib.contextmanager
def serving(lm_run: Path, enc_run: Path, *, threads: int = 1, max_batch: int = 16, prefix_cache_mb: float = 1.0,
            no_compile: bool = False, quantize: str = "none"):
    """The language-model server and the embeddings server, always stopped on the way out (also on Ctrl-C).

    ``quantize``: the language-model server's ``--quantize``. ``"none"`` (float32) by default: its greedy tokens do
    not depend on which rows decode together, so a greedy answer under load must equal the quiet one. With int8
    activations (``auto`` on a CPU with the integer-dot kernel) rows decoded together may round a near-tie into
    another greedy token (``tests/serve/test_engine.py``), so there the greedy check counts those too.
    """
    srv = Servers()
    try:
        srv.start("lm", lm_run, threads=threads, max_batch=max_batch, quantize=quantize,
                  extra=["--prefix-cache-mb", f"{prefix_cache_mb:g}"] + ["--no-compile"] * no_compile)
        srv.start("enc", enc_run, threads=threads, max_batch=max_batch, extra=[])
        yield srv
    finally:
        srv.stop()


def run_soak(lm_run: Path, enc_run: Path, *, streams: int, seconds: float, warmup_s: float, sample_s: float,
             seed: int = 0, threads: int = 1, max_batch: int = 16, prefix_cache_mb: float = 1.0,
             no_compile: bool = False, quantize: str = "none", progress_s: float | None = None) -> dict:
    """Start both servers, take the quiet answers, soak, stop the servers; the counts, samples and verdicts."""
    with serving(lm_run, enc_run, threads=threads, max_batch=max_batch, prefix_cache_mb=prefix_cache_mb,
                 no_compile=no_compile, quantize=quantize) as srv:
        async def go() -> tuple[dict, dict]:
            expected = await quiet_answers(srv.ports["lm"], srv.ports["enc"])
            return expected, await soak(srv.ports, srv.pids(), streams=streams, seconds=seconds, sample_s=sample_s,
                                        seed=seed, expected=expected, progress_s=progress_s)

        expected, out = asyncio.run(go())
    out.update(servers=srv.stopped, warmup_s=warmup_s, streams=streams,
               quiet_greedy_answers={k: v for k, v in expected.items() if not k.startswith("embeddings")})
    out["memory"] = memory(out["samples"], warmup_s)
    out["verdicts"] = verdicts(out)
    return out


# -- verdicts and the table -----------------------------------------------------------------------------------------
RSS_GROWTH_LIMIT = 0.05


def memory(samples: list[dict], warmup_s: float) -> dict:
    """Per server: RSS (KiB) at the first sample after warm-up, at the end, the most after warm-up, and the growth."""
    out = {}
    for key in [k for k in (samples[0] if samples else {}) if k.startswith("rss_kb_")]:
        after = [s[key] for s in samples if s["t_s"] >= warmup_s and s[key] is not None]
        if len(after) < 2:
            out[key[7:]] = {"samples_after_warmup": len(after)}
            continue
        out[key[7:]] = {"samples_after_warmup": len(after), "warm_kb": after[0], "end_kb": after[-1],
                        "max_kb": max(after), "growth": after[-1] / after[0] - 1}
    return out


def bad_statuses(result: dict, first: str) -> dict[str, int]:
    """Per bad request: how many answers had a status starting with ``first`` ("5": server errors)."""
    return {name: sum(n for k, n in result["probes"][name]["outcomes"].items() if k.startswith(first))
            for name in BAD}


def verdicts(result: dict) -> dict:
    """Each check: True (holds), False (fails) or None (not measured: e.g. no sample after warm-up)."""
    good = result["good"].values()
    cache = [s for s in result["samples"] if s.get("cache_budget_bytes") is not None]
    growth = [m.get("growth") for m in result["memory"].values()]
    after = result["after"]
    return {
        "every_good_request_answered": sum(r["lost"] for r in good) == 0,
        "no_wrong_answer": sum(r["wrong"] for r in good) == 0,
        "no_5xx_for_bad_requests": sum(bad_statuses(result, "5").values()) == 0,
        "every_bad_request_4xx": all(k.startswith("4") for name in BAD for k in result["probes"][name]["outcomes"]),
        "rss_flat_after_warmup": None if None in growth or not growth else max(growth) <= RSS_GROWTH_LIMIT,
        "prefix_cache_within_bound": bool(cache) and all(s["cache_bytes"] <= s["cache_budget_bytes"] for s in cache),
        "no_row_held_at_end": (after.get("running"), after.get("waiting")) == (0, 0),
        "servers_exit_0": all(s["exit_code"] == 0 for s in result["servers"].values()),
    }


def table(result: dict) -> str:
    lines = ["| request | sent | answered rightly | lost | wrong | outcomes |",
             "| --- | ---: | ---: | ---: | ---: | --- |"]
    for kind, r in result["good"].items():
        lines.append(f"| {kind} | {r['sent']} | {r['ok']} | {r['lost']} | {r['wrong']} | {r['outcomes']} |")
    lines += ["", "| probe | sent | outcomes (status or what happened) |", "| --- | ---: | --- |"]
    for name, r in result["probes"].items():
        lines.append(f"| {name} | {r['sent']} | {r['outcomes']} |")
    lines += ["", f"| server | RSS MiB after warm-up ({result['warmup_s']:.0f} s) | at the end | most | growth |",
              "| --- | ---: | ---: | ---: | ---: |"]
    for name, m in result["memory"].items():
        if "growth" in m:
            mib = [f"{m[k] / 1024:.1f}" for k in ("warm_kb", "end_kb", "max_kb")]
            lines.append(f"| {name} | {' | '.join(mib)} | {100 * m['growth']:+.2f}% |")
    cache = [s for s in result["samples"] if s.get("cache_budget_bytes") is not None]
    if cache:
        most = max(s["cache_bytes"] for s in cache)
        lines.append(f"\nprefix cache: at most {most:,} of {cache[0]['cache_budget_bytes']:,} bytes "
                     f"({max(s['cache_blocks'] for s in cache)} blocks at most) over {len(cache)} samples")
    lines.append(f"after the load: {result['after']}")
    for name, s in result["servers"].items():
        lines.append(f"server {name}: exit code {s['exit_code']}, {s['tracebacks']} tracebacks in its log, "
                     f"exceptions {s['exceptions']}")
    lines += ["", *(f"{k}: {v}" for k, v in result["verdicts"].items())]
    lines += [f"  e.g. {x}" for x in result["examples"][:10]]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=16, help="concurrent clients")
    ap.add_argument("--minutes", type=float, default=10.0, help="how long the load lasts")
    ap.add_argument("--warmup-minutes", type=float, default=2.0, help="RSS growth is measured from here to the end")
    ap.add_argument("--sample-seconds", type=float, default=5.0, help="seconds between RSS and prefix-cache samples")
    ap.add_argument("--run", type=Path, default=None, help="a language-model run (default: a random gpt-mini)")
    ap.add_argument("--encoder-run", type=Path, default=None,
                    help="a text-embedding run for /v1/embeddings (default: a random one-layer text encoder)")
    ap.add_argument("--prefix-cache-mb", type=float, default=1.0,
                    help="the server's --prefix-cache-mb (small, so the cache fills and evicts during the soak)")
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1, help="OMP threads of each server")
    ap.add_argument("--no-compile", action="store_true", help="the server's --no-compile")
    ap.add_argument("--quantize", default="none", choices=["none", "auto", "bf16", "int8", "int4"],
                    help="the language-model server's --quantize (default none: float32, whose greedy tokens do not "
                    "depend on the batch)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "serve-soak.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        lm_run = args.run or make_lm_run(Path(tmp) / "lm")
        enc_run = args.encoder_run or make_encoder_run(Path(tmp) / "encoder")
        print(f"soak: {args.streams} streams for {args.minutes:g} min against {lm_run} and {enc_run}; load average "
              f"{os.getloadavg()[0]:.2f}", flush=True)
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        results = {"benchmark": "serve-soak", "command": " ".join(["python", "bench/serve_soak.py", *sys.argv[1:]]),
                   "commit": commit(), "date": now,
                   "machine": machine(), "run": str(args.run or "random gpt-mini, byte-level BPE (made on the fly)"),
                   "encoder_run": str(args.encoder_run or "random one-layer text encoder (made on the fly)"),
                   "threads": args.threads, "max_batch": args.max_batch, "prefix_cache_mb": args.prefix_cache_mb,
                   "quantize": args.quantize, "no_compile": args.no_compile,
                   "mix": MIX, "load_before": os.getloadavg()}
        results.update(run_soak(lm_run, enc_run, streams=args.streams, seconds=60 * args.minutes,
                                warmup_s=60 * args.warmup_minutes, sample_s=args.sample_seconds, seed=args.seed,
                                threads=args.threads, max_batch=args.max_batch, prefix_cache_mb=args.prefix_cache_mb,
                                no_compile=args.no_compile, quantize=args.quantize, progress_s=60))
    results["load_after"] = os.getloadavg()
    print(table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    # A SIGTERM (kill, timeout) unwinds like Ctrl-C, so the finally blocks stop the servers this script started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    main()
