"""Bounded work: prompts per request, queued sequences, body size, tokenizing off the event loop, the API key from
the environment, and stop strings that end the text at the earliest match."""

import asyncio
import itertools
import json
import threading

import pytest
import torch

from tokennet.models import create_model
from tokennet.sampling import generate
from tokennet.serve.engine import Engine, QueueFull, SamplingParams, Sequence, first_stop, held_back
from tokennet.tokens.text import CharTokenizer

testclient = pytest.importorskip("starlette.testclient")
from tokennet.serve.app import create_app  # noqa: E402 - needs starlette, checked above

pytestmark = pytest.mark.usefixtures("one_thread")
TOK = CharTokenizer.train("abcdefghijklmnopqrstuvwxyz .,:?!<|>_\n")


def _model():
    torch.manual_seed(0)
    m = create_model("gpt-micro", vocab_size=TOK.vocab_size, block_size=64).eval()
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
    return m


MODEL = _model()


def _assert_error(r, status, type_=None, param=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"] == (type_ or err["type"]) and err["param"] == param
    return err


# -- queue and prompt caps (the engine is never started: what is queued stays queued) ----------------------------
def test_a_full_queue_answers_429_and_too_many_prompts_400():
    engine = Engine(MODEL, TOK, max_batch=2, max_queue=4)
    c = testclient.TestClient(create_app(engine, model_name="tiny"))  # no lifespan: the engine does not run
    engine.submit_all([Sequence([1], SamplingParams(max_tokens=2), lambda e: None) for _ in range(3)])
    r = c.post("/v1/completions", json={"prompt": ["a", "b"], "max_tokens": 2})  # 3 + 2 > 4: all or none
    err = _assert_error(r, 429, "rate_limit_error")
    assert err["code"] == "rate_limit_exceeded" and r.headers["retry-after"] == "1"
    assert engine.load["waiting"] == 3
    r = c.post("/v1/completions", json={"prompt": ["a"] * 5, "max_tokens": 2})  # could never fit
    _assert_error(r, 400, "invalid_request_error", "prompt")
    r = c.post("/v1/completions", json={"prompt": ["a"] * 20_000, "max_tokens": 2})
    assert "at most 2048" in _assert_error(r, 400, "invalid_request_error", "prompt")["message"]
    engine.submit(Sequence([1], SamplingParams(max_tokens=2), lambda e: None))
    r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})  # full: not parsed
    _assert_error(r, 429, "rate_limit_error")
    with pytest.raises(QueueFull):
        engine.submit(Sequence([1], SamplingParams(max_tokens=2), lambda e: None))
    engine.stop()
    assert engine.load == {"running": 0, "waiting": 0}  # the queued ones were answered


def test_twenty_thousand_prompts_are_refused_before_any_is_tokenized():
    calls = []

    class Counting:
        def __getattr__(self, name):
            return getattr(TOK, name)

        def encode(self, text, **kw):
            calls.append(text)
            return TOK.encode(text, **kw)

    engine = Engine(MODEL, Counting(), max_batch=2)
    c = testclient.TestClient(create_app(engine, model_name="tiny"))
    _assert_error(c.post("/v1/completions", json={"prompt": ["ab"] * 20_000}), 400, param="prompt")
    assert calls == []


def test_a_body_over_the_cap_is_413():
    engine = Engine(MODEL, TOK, max_batch=2)
    c = testclient.TestClient(create_app(engine, model_name="tiny", max_body=1000))
    _assert_error(c.post("/v1/completions", content=json.dumps({"prompt": "a" * 2000})), 413)

    def chunks():  # no Content-Length: counted while it is read
        yield b'{"prompt": "'
        for _ in range(20):
            yield b"a" * 100
        yield b'"}'

    _assert_error(c.post("/v1/completions", content=chunks()), 413)


def test_tokenizing_a_body_does_not_block_the_event_loop():
    """While a request's prompt is being tokenized (blocked here), the server answers another client."""
    entered, release, done = threading.Event(), threading.Event(), threading.Event()

    class Slow:
        def __getattr__(self, name):
            return getattr(TOK, name)

        def encode(self, text, **kw):
            if text == "slow":
                entered.set()
                release.wait(10)
                done.set()
            return TOK.encode(text, **kw)

    engine = Engine(MODEL, Slow(), max_batch=2)
    app = create_app(engine, model_name="tiny")

    async def go():  # two clients on one event loop, calling the ASGI app directly
        big = asyncio.create_task(_asgi(app, "POST", "/v1/completions", {"prompt": "slow", "max_tokens": 2}))
        assert await asyncio.to_thread(entered.wait, 10)
        health = await asyncio.wait_for(_asgi(app, "GET", "/health"), 20)
        answered_while_tokenizing = not done.is_set()
        release.set()
        return health, answered_while_tokenizing, await asyncio.wait_for(big, 30)

    engine.start()
    try:
        health, answered_while_tokenizing, big = asyncio.run(go())
    finally:
        release.set()
        engine.stop()
    assert health[0] == 200 and answered_while_tokenizing
    assert big[0] == 200 and big[1]["usage"]["completion_tokens"] == 2


async def _asgi(app, method, path, body=None):
    """One HTTP request to an ASGI app: (status, JSON body)."""
    raw = b"" if body is None else json.dumps(body).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    answered, out, read = asyncio.Event(), {"status": None, "body": b""}, False

    async def receive():
        nonlocal read
        if not read:
            read = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await answered.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.start":
            out["status"] = message["status"]
        elif message["type"] == "http.response.body":
            out["body"] += message.get("body", b"")
            if not message.get("more_body"):
                answered.set()

    await app(scope, receive, send)
    return out["status"], json.loads(out["body"])


# -- the API key from the environment ------------------------------------------------------------------------
@pytest.fixture
def served(monkeypatch):
    import tokennet.serve.app as app_module

    got = {}
    monkeypatch.setattr(app_module, "serve", lambda run_dir, **kw: got.update(kw))
    monkeypatch.delenv("TOKENNET_API_KEY", raising=False)
    return got


def test_the_api_key_comes_from_the_environment_and_the_flag_wins(served, monkeypatch, capsys):
    from tokennet.cli import main

    assert main(["serve", "RUN"]) == 0 and served["api_key"] is None and served["max_queue"] == 256
    monkeypatch.setenv("TOKENNET_API_KEY", "sk-env")
    assert main(["serve", "RUN", "--max-queue", "9"]) == 0
    assert served["api_key"] == "sk-env" and served["max_queue"] == 9
    assert main(["serve", "RUN", "--api-key", "sk-flag"]) == 0 and served["api_key"] == "sk-flag"
    monkeypatch.setenv("TOKENNET_API_KEY", " ")
    assert main(["serve", "RUN"]) == 2
    err = capsys.readouterr().err.strip()
    assert "TOKENNET_API_KEY is empty" in err and "\n" not in err
    assert main(["serve", "RUN", "--max-queue", "0"]) == 2


# -- stop strings --------------------------------------------------------------------------------------------
def _stream(text, stops, cuts):
    """What the engine's rule emits for ``text`` arriving in pieces cut at ``cuts``: (emitted, final text)."""
    sent, out, bounds = 0, "", [*cuts, len(text)]
    for end in bounds:
        now = text[:end]
        at = first_stop(now, stops, sent)
        if at >= 0:
            return out + now[sent:at], now[:at]
        upto = held_back(now, sent, stops)
        out, sent = out + now[sent:upto], max(sent, upto)
    return out + text[sent:], text


@pytest.mark.parametrize("stops", [["cd", "bcd"], ["bcd", "cd"], ["de", "bcd", "cd"]])
def test_overlapping_stop_strings_end_at_the_earliest_match_across_chunk_boundaries(stops):
    text = "abcde"
    assert first_stop(text, stops) == 1
    for k in range(len(text)):  # every way of cutting "abcde" into pieces
        for cuts in itertools.combinations(range(1, len(text)), k):
            assert _stream(text, stops, list(cuts)) == ("a", "a"), cuts


def test_the_engine_ends_at_the_earliest_of_overlapping_stop_strings():
    ids = TOK.encode("hello")
    text = TOK.decode(generate(MODEL, torch.tensor([ids]), 30, temperature=0)[0, len(ids):].tolist())
    i = next(i for i in range(2, 20) if text.find(text[i + 1 : i + 3]) == i + 1 and text.find(text[i:i + 3]) == i)
    stops = [text[i + 1 : i + 3], text[i : i + 3]]  # the first listed matches later than the second
    pieces = []
    done = threading.Event()
    seq = Sequence(ids, SamplingParams(max_tokens=30, temperature=0, stop=stops),
                   lambda e: (pieces.append(e.text), done.set() if e.finish_reason else None))
    engine = Engine(MODEL, TOK, max_batch=2).start()
    try:
        engine.submit(seq)
        assert done.wait(30)
    finally:
        engine.stop()
    assert seq.finish_reason == "stop" and "".join(pieces) == text[:i]


# -- fair rows ---------------------------------------------------------------------------------------------
def test_a_small_request_gets_the_next_free_row_before_a_huge_request_s_other_prompts():
    engine = Engine(MODEL, TOK, max_batch=2)
    order, done = [], threading.Semaphore(0)
    ff = engine.net.forward_features

    def recording(*a, **kw):
        if engine.caches.mode == "prefill":
            order.append(engine.feeding[0].group)
        return ff(*a, **kw)

    engine.net.forward_features = recording
    emit = lambda e: done.release() if e.finish_reason else None  # noqa: E731
    huge = [Sequence(TOK.encode(f"prompt {i}"), SamplingParams(max_tokens=5, temperature=0), emit, group="huge")
            for i in range(6)]
    small = Sequence(TOK.encode("hi"), SamplingParams(max_tokens=5, temperature=0), emit, group="small")
    engine.submit_all(huge)
    engine.submit(small)  # queued behind the huge request's six prompts
    engine.start()
    try:
        for _ in range(7):
            assert done.acquire(timeout=30)
    finally:
        engine.stop()
    assert order == ["huge", "small", "huge", "huge", "huge", "huge", "huge"]  # a row while the huge one holds one
    alone = generate(MODEL, torch.tensor([TOK.encode("hi")]), 5, temperature=0)[0, 2:].tolist()
    assert small.generated == alone
