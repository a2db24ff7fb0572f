"""tokennet serve over HTTP: the openai client works unchanged; bad input is a 4xx and the server keeps serving."""

import http.client
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from tokennet.models import create_model, save_pretrained
from tokennet.run import save_tokenizer, write_run_info
from tokennet.sampling import generate
from tokennet.tokens.text import CharTokenizer

uvicorn = pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
from tokennet.serve.app import create_app  # noqa: E402 - needs starlette, checked above
from tokennet.serve.engine import Engine  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
KEY = "sk-test-key"
TOK = CharTokenizer.train("abcdefghijklmnopqrstuvwxyz .,:?!<|>_\n")


def _model(block_size=128):
    torch.manual_seed(0)
    m = create_model("gpt-micro", vocab_size=TOK.vocab_size, block_size=block_size).eval()
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
    return m


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    model = _model()
    engine = Engine(model, TOK, max_batch=4)
    app = create_app(engine, model_name="tiny", api_key=KEY)
    port = _free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    deadline = time.time() + 20
    while not srv.started:
        assert time.time() < deadline and t.is_alive(), "the server did not start"
        time.sleep(0.02)
    yield {"port": port, "engine": engine, "model": model}
    srv.should_exit = True
    t.join(10)


def _client(server, key=KEY):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server['port']}/v1", api_key=key, max_retries=0, timeout=30)


def _http(server, method, path, body=None, *, key=KEY):
    c = http.client.HTTPConnection("127.0.0.1", server["port"], timeout=30)
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    c.request(method, path, body=body, headers=headers)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, json.loads(data) if data else None


def test_openai_client_completions_chat_and_models(server):
    c = _client(server)
    assert [m.id for m in c.models.list().data] == ["tiny"]
    r = c.completions.create(model="tiny", prompt="hello", max_tokens=12, temperature=0)
    ids = generate(server["model"], torch.tensor([TOK.encode("hello")]), 12, temperature=0)[0, 5:]
    assert r.choices[0].text == TOK.decode(ids) and r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (5, 12)
    chat = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                     temperature=0)
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens <= 8
    assert chat.choices[0].finish_reason in ("stop", "length")


def test_streaming_gives_the_same_text_as_a_whole_completion(server):
    c = _client(server)
    whole = c.completions.create(model="tiny", prompt="abc", max_tokens=20, temperature=0).choices[0].text
    chunks = list(c.completions.create(model="tiny", prompt="abc", max_tokens=20, temperature=0, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == whole and chunks[-1].choices[0].finish_reason == "length"
    msgs = [{"role": "user", "content": "hello"}]
    whole = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=15, temperature=0)
    parts = list(c.chat.completions.create(model="tiny", messages=msgs, max_tokens=15, temperature=0, stream=True,
                                           stream_options={"include_usage": True}))
    text = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
    assert text == whole.choices[0].message.content
    assert parts[0].choices[0].delta.role == "assistant" and parts[-1].usage.total_tokens == whole.usage.total_tokens


def test_concurrent_requests_decode_together_and_match_alone(server):
    c = _client(server)
    prompts = ["the", "quick brown", "fox", "jumps over", "a", "lazy dog", "zz", "hello world"]

    def one(p):
        return c.completions.create(model="tiny", prompt=p, max_tokens=25, temperature=0).choices[0].text

    engine = server["engine"]
    before = len(engine.batch_sizes)
    with ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(one, prompts))
    for p, t in zip(prompts, texts):
        ids = generate(server["model"], torch.tensor([TOK.encode(p)]), 25, temperature=0)[0, len(p):]
        assert t == TOK.decode(ids), p
    assert max(engine.batch_sizes[before:]) >= 3  # they shared decoding steps


BAD = [
    ("POST", "/v1/completions", b"{not json", 400, None),
    ("POST", "/v1/completions", b"[1, 2]", 400, None),
    ("POST", "/v1/completions", b"", 400, None),
    ("POST", "/v1/completions", json.dumps({"prompt": 42}), 400, "prompt"),
    ("POST", "/v1/completions", json.dumps({"prompt": "a", "max_tokens": "10"}), 400, "max_tokens"),
    ("POST", "/v1/completions", json.dumps({"prompt": "a", "max_tokens": 10**9}), 400, "max_tokens"),
    ("POST", "/v1/completions", json.dumps({"prompt": "a", "max_tokens": 1e9}), 400, "max_tokens"),
    ("POST", "/v1/completions", json.dumps({"prompt": "a", "max_tokens": -5}), 400, "max_tokens"),
    ("POST", "/v1/completions", json.dumps({"prompt": "a", "max_tokens": 0}), 400, "max_tokens"),
    ("POST", "/v1/completions", json.dumps({"prompt": "a" * 140}), 400, "prompt"),
    ("POST", "/v1/completions", json.dumps({"prompt": [1, 2, 99999]}), 400, "prompt"),
    ("POST", "/v1/completions", json.dumps({"prompt": "a", "temperature": "hot"}), 400, "temperature"),
    ("POST", "/v1/completions", json.dumps({"prompt": "a", "temperature": -1}), 400, "temperature"),
    ("POST", "/v1/completions", json.dumps({"prompt": "a", "top_p": 0}), 400, "top_p"),
    ("POST", "/v1/completions", json.dumps({"prompt": "a", "stream": "yes"}), 400, "stream"),
    ("POST", "/v1/completions", json.dumps({"prompt": "a", "stop": 5}), 400, "stop"),
    ("POST", "/v1/completions", json.dumps({"prompt": "a", "n": 3}), 400, "n"),
    ("POST", "/v1/completions", json.dumps({"prompt": "a", "seed": 1.5}), 400, "seed"),
    ("POST", "/v1/completions", json.dumps({"prompt": "a", "logprobs": 21}), 400, "logprobs"),
    ("POST", "/v1/completions", json.dumps({"prompt": "a", "model": "gpt-4"}), 404, "model"),
    ("POST", "/v1/completions", json.dumps({"prompt": "a", "user": ["me"]}), 400, "user"),
    ("POST", "/v1/completions", json.dumps({"prompt": "a", "stream_options": "usage"}), 400, "stream_options"),
    ("POST", "/v1/completions", json.dumps({"prompt": "a", "max_tokens": True}), 400, "max_tokens"),
    ("POST", "/v1/completions", json.dumps({"prompt": "a", "model": 7}), 400, "model"),
    ("POST", "/v1/chat/completions", json.dumps({"messages": "hi"}), 400, "messages"),
    ("POST", "/v1/chat/completions", json.dumps({"messages": [{"role": "robot", "content": "x"}]}), 400, "messages"),
    ("POST", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": 3}]}), 400, "messages"),
    ("POST", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "a" * 140}]}), 400,
     "messages"),
    ("POST", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "a"}],
                                                  "max_completion_tokens": 10**9}), 400, "max_completion_tokens"),
    ("POST", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "a"}], "echo": True}), 400,
     "echo"),
    ("POST", "/v1/completions", b"[" * 40000 + b"]" * 40000, 400, None),  # issue 44: a RecursionError, a 500
    ("POST", "/v1/chat/completions", b'{"a":' * 40000 + b"1" + b"}" * 40000, 400, None),
    ("POST", "/tokenize", b'{"prompt":' * 40000 + b'"a"' + b"}" * 40000, 400, None),
    ("POST", "/detokenize", b"[" * 40000 + b"]" * 40000, 400, None),
    ("GET", "/v1/completions", None, 405, None),
    ("GET", "/v1/nothing", None, 404, None),
    ("GET", "/v1/models/gpt-4", None, 404, "model"),
]


@pytest.mark.parametrize("method, path, body, status, param", BAD)
def test_bad_input_is_a_4xx_with_an_openai_error_and_the_server_keeps_serving(server, method, path, body, status,
                                                                              param):
    code, out = _http(server, method, path, body)
    assert code == status, out
    err = out["error"]
    assert err["message"] and err["type"] and err["param"] == param
    assert _http(server, "GET", "/health")[0] == 200
    code, ok = _http(server, "POST", "/v1/completions", json.dumps({"prompt": "ab", "max_tokens": 2}))
    assert code == 200 and ok["choices"][0]["finish_reason"] == "length"


def test_missing_or_wrong_api_key(server):
    for key in (None, "sk-wrong"):
        code, out = _http(server, "POST", "/v1/completions", json.dumps({"prompt": "a"}), key=key)
        assert code == 401 and out["error"]["code"] == "invalid_api_key"
    assert _http(server, "GET", "/v1/models", key="sk-wrong")[0] == 401
    assert _http(server, "GET", "/health", key=None)[0] == 200  # health needs no key
    with pytest.raises(openai.AuthenticationError):
        _client(server, key="sk-wrong").completions.create(model="tiny", prompt="a")


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_disconnects_frees_its_row(server, monkeypatch, stream):
    engine = server["engine"]
    head = engine.net.forward_head

    def slow_head(h):  # 20 ms a step: the 100 tokens asked for would take 2 s
        time.sleep(0.02)
        return head(h)

    monkeypatch.setattr(engine.net, "forward_head", slow_head)
    cancelled = engine.finished["cancelled"]
    s = socket.create_connection(("127.0.0.1", server["port"]))
    body = json.dumps({"prompt": "a", "max_tokens": 100, "stream": stream}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    got = b""
    while stream and b"data:" not in got:  # the stream has started
        chunk = s.recv(4096)
        assert chunk, got
        got += chunk
    while not stream and not engine.load["running"]:  # the completion is being decoded
        time.sleep(0.01)
    s.close()
    t0 = time.time()
    while engine.load["running"] or engine.load["waiting"]:
        assert time.time() < t0 + 10, engine.load
        time.sleep(0.01)
    assert engine.finished["cancelled"] == cancelled + 1 and time.time() - t0 < 1.5  # freed, not run to the end
    assert _http(server, "POST", "/v1/completions", json.dumps({"prompt": "b", "max_tokens": 3}))[0] == 200


def _cut(server, path, body: bytes, *, declared: int | None = None, until: bytes = b"") -> None:
    """Send ``body`` (declaring ``declared`` bytes), read until ``until`` has come back, and hang up."""
    s = socket.create_connection(("127.0.0.1", server["port"]))
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer {KEY}"
              f"\r\nContent-Length: {declared or len(body)}\r\n\r\n".encode() + body)
    got = b""
    while until and until not in got:
        chunk = s.recv(4096)
        assert chunk, got
        got += chunk
    s.close()


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize"])
def test_a_client_that_hangs_up_mid_body_is_one_line_in_the_log_never_an_internal_error(server, caplog, path):
    with caplog.at_level("INFO", logger="tokennet"):
        _cut(server, path, b'{"prompt": "ab', declared=500)
        t0 = time.time()
        while not any("before its body was whole" in r.getMessage() for r in caplog.records):
            assert time.time() < t0 + 60, caplog.text
            time.sleep(0.02)
        assert _http(server, "POST", "/v1/completions", json.dumps({"prompt": "b", "max_tokens": 2}))[0] == 200
    mine = [r for r in caplog.records if "before its body was whole" in r.getMessage()]
    assert len(mine) == 1 and mine[0].levelname == "INFO" and mine[0].exc_info is None
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info], caplog.text


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_client_that_hangs_up_mid_stream_logs_nothing_above_info(server, caplog, path):
    body = {"prompt": "a"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "a"}]}
    engine = server["engine"]
    with caplog.at_level("INFO"):
        _cut(server, path, json.dumps({**body, "max_tokens": 60, "stream": True}).encode(), until=b"data:")
        t0 = time.time()
        while engine.load["running"] or engine.load["waiting"]:
            assert time.time() < t0 + 60, engine.load
            time.sleep(0.01)
        assert _http(server, "POST", "/v1/completions", json.dumps({"prompt": "b", "max_tokens": 2}))[0] == 200
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info], caplog.text


def test_engine_errors_answer_the_status_their_cause_deserves():
    """The request's fault is a 400, an engine shutting down a 503, the server's own failure a 500."""
    from tokennet.serve.app import _failed
    from tokennet.serve.engine import Event, SamplingParams, Sequence

    engine = Engine(_model(), TOK, max_batch=1, compile=False)  # never started: stopping it answers what it holds
    got = []
    engine.submit(Sequence(TOK.encode("a"), SamplingParams(max_tokens=2), got.append))
    engine.stop()
    assert got[-1].finish_reason == "error" and got[-1].fault == "unavailable"
    assert (_failed(got[-1]).status, _failed(got[-1]).type) == (503, "server_error")
    assert _failed(Event(finish_reason="error", error="x", fault="request")).status == 400
    assert _failed(Event(finish_reason="error", error="internal error: boom")).status == 500


def test_ctrl_c_drains_the_requests_in_flight_and_exits(tmp_path):
    run = tmp_path / "run"
    torch.manual_seed(0)
    save_pretrained(create_model("gpt-mini", vocab_size=TOK.vocab_size, block_size=512), run)
    save_tokenizer(run, TOK)
    write_run_info(run, recipe="gpt-char", model="gpt-micro", data=None, settings={})
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "tokennet.cli", "serve", str(run), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.time() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    proc.kill()  # before reading its output: a live server's pipe never ends
                    raise AssertionError(f"the server did not start: {proc.communicate()[0].decode()}") from None
                time.sleep(0.1)
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=60)
        stream = c.completions.create(model="run", prompt="a", max_tokens=500, temperature=0, stream=True,
                                      stream_options={"include_usage": True})
        next(iter(stream))
        proc.send_signal(signal.SIGINT)  # Ctrl-C while the request is being decoded
        rest = list(stream)
        assert rest[-2].choices[0].finish_reason == "length"  # it was finished, not cut
        assert rest[-1].usage.completion_tokens == 500
        assert proc.wait(30) == 0
        log = proc.stdout.read().decode()
        assert "Waiting for connections to close" in log  # the request was still running when Ctrl-C came
    finally:
        if proc.poll() is None:
            proc.kill()


def test_serve_refuses_a_run_that_is_not_a_language_model(tmp_path, capsys):
    from tokennet.cli import main

    save_pretrained(create_model("vit-micro"), tmp_path / "vit")
    assert main(["serve", str(tmp_path / "vit"), "--port", str(_free_port())]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tokennet: error:") and "serves language models" in err and "\n" not in err


@pytest.mark.parametrize("flags, words", [
    (["--context", "1000000000"], "the model's 64 tokens"),  # issue 44: served, silently clamped to 64
    (["--context", "0"], "at least 2"),
    (["--context", "-3"], "at least 2"),
    (["--model-name", ""], "blank"),  # issue 44: served a model named ''
    (["--model-name", "tiny", "--model-name", "  "], "blank"),
])
def test_serve_refuses_a_context_past_the_model_and_a_blank_model_name_in_one_line(tmp_path, capsys, flags, words):
    from tokennet.cli import main

    run = tmp_path / "run"
    save_pretrained(create_model("gpt-micro", vocab_size=TOK.vocab_size, block_size=64), run)
    save_tokenizer(run, TOK)
    write_run_info(run, recipe="gpt-char", model="gpt-micro", data=None, settings={})
    assert main(["serve", str(run), "--port", str(_free_port()), "--no-compile", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tokennet: error:") and words in err and "\n" not in err, err
