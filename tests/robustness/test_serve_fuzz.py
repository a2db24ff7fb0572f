"""Random bodies to the server's endpoints: every answer is a 200 or a 4xx with an OpenAI-style error body — never a
500, a traceback or a hang — and the server answers a good request afterwards. Random types for every known field,
random extra fields, truncated JSON, bytes that are not JSON, huge numbers, NaN, lone surrogates and nested garbage;
structured output (response_format schemas, self-referring ones too), tools and tool_choice, logprobs and
top_logprobs, the embeddings fields, bodies nested thousands of levels deep, and clients that hang up mid-body or
mid-stream (logged as one line at most, never as an error), through the ASGI app in-process.
TOKENNET_FUZZ_EXAMPLES sets the examples a test (40 by default), as for the other fuzz tests."""

import asyncio
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from tokennet.models import create_model
from tokennet.tokens.text import CharTokenizer

hypothesis = pytest.importorskip("hypothesis")
testclient = pytest.importorskip("starlette.testclient")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tokennet.serve.app import create_app  # noqa: E402 - needs starlette, checked above
from tokennet.serve.engine import Engine  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
TOK = CharTokenizer.train("abcdefghijklmnopqrstuvwxyz .,:?!<|>_\n")
KEY = "sk-fuzz"
SETTINGS = settings(max_examples=int(os.environ.get("TOKENNET_FUZZ_EXAMPLES", "40")), deadline=None,
                    derandomize=not os.environ.get("TOKENNET_FUZZ_RANDOM"), database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])
FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
          "stop", "stream", "stream_options", "seed", "n", "logprobs", "top_logprobs", "echo", "best_of",
          "presence_penalty", "frequency_penalty", "logit_bias", "user", "tools", "functions", "response_format",
          "suffix"]

text = st.text(alphabet="abc xyz<|>\n\u00e9\u4e2d", max_size=12) | st.sampled_from(["\ud800", "x\udfff", "", "tiny"])
numbers = (st.integers(-(10**30), 10**30) | st.integers(-3, 70) | st.floats(allow_nan=True, allow_infinity=True)
           | st.sampled_from([2**63, -(2**63) - 1, 1e308, 5e-324, 1e-40, -0.0]))
json_values = st.recursive(st.none() | st.booleans() | numbers | text,
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=3),
                           max_leaves=8)
plausible = {  # values that often pass the checks, so generation runs too
    "model": st.just("tiny"),
    "prompt": text | st.lists(text, max_size=3) | st.lists(st.integers(-2, 60), max_size=5),
    "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool",
                                                                         "developer", "robot"]),
                                                "content": text}), max_size=3),
    "max_tokens": st.integers(-2, 8), "max_completion_tokens": st.integers(-2, 8),
    "temperature": st.floats(0, 2), "top_p": st.floats(0, 1), "top_k": st.integers(-2, 100),
    "stop": text | st.lists(text, max_size=5), "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}), "seed": st.integers(-(2**64), 2**64),
}


@st.composite
def bodies(draw):
    body = {}
    for name in draw(st.lists(st.sampled_from(FIELDS), unique=True, max_size=8)):
        body[name] = draw(plausible[name] | json_values if name in plausible else json_values)
    for name in draw(st.lists(text, max_size=2)):  # unknown fields are ignored
        body.setdefault(name, draw(json_values))
    return body


@st.composite
def raw_bodies(draw):
    """Bytes that are not a well-formed JSON object: truncated, not JSON at all, or JSON of another type."""
    kind = draw(st.sampled_from(["truncated", "bytes", "other"]))
    if kind == "truncated":
        full = json.dumps(draw(bodies())).encode()
        return full[: draw(st.integers(0, max(0, len(full) - 1)))]
    if kind == "bytes":
        return draw(st.binary(max_size=40))
    return json.dumps(draw(json_values)).encode()


def _model():
    torch.manual_seed(0)
    m = create_model("gpt-micro", vocab_size=TOK.vocab_size, block_size=48).eval()
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
    return m


@pytest.fixture(scope="module")
def client():
    with testclient.TestClient(create_app(Engine(_model(), TOK, max_batch=4, max_queue=16), model_name="tiny",
                                          api_key=KEY)) as c, ThreadPoolExecutor(1) as pool:
        yield c, pool


def _send(client, method, path, content=None):
    c, pool = client
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    return pool.submit(c.request, method, path, content=content, headers=headers).result(timeout=60)  # no hang


def _check(r):
    assert r.status_code == 200 or 400 <= r.status_code < 500, (r.status_code, r.text[:500])
    if r.status_code == 200:
        if r.headers["content-type"].startswith("text/event-stream"):
            events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]" and all("error" not in json.loads(e) for e in events[:-1]), r.text[:500]
        else:
            assert "error" not in r.json()
        return
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str)
    assert "Traceback" not in err["message"]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@SETTINGS
@given(body=bodies())
def test_random_json_bodies_are_answered_200_or_4xx(client, path, body):
    _check(_send(client, "POST", path, json.dumps(body).encode()))


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@SETTINGS
@given(raw=raw_bodies())
def test_bodies_that_are_not_a_json_object_are_400(client, path, raw):
    r = _send(client, "POST", path, raw)
    _check(r)
    try:
        ok = isinstance(json.loads(raw), dict)
    except (ValueError, UnicodeDecodeError):
        ok = False
    assert ok or r.status_code == 400


@SETTINGS
@given(method=st.sampled_from(["GET", "POST", "DELETE"]), name=text, body=st.none() | bodies())
def test_the_models_routes_answer_200_or_4xx(client, method, name, body):
    content = None if body is None else json.dumps(body).encode()
    _check(_send(client, method, "/v1/models", content))
    _check(_send(client, method, "/v1/models/" + ("".join(ch for ch in name if ch.isalnum()) or "x"), content))


EXTREMES = [10**30, -(10**30), 2**63, -(2**63) - 1, 2**31, 1e308, 5e-324, 1e-40, float("nan"), float("inf"),
            float("-inf"), -0.0, True, "7", [3], {"a": 1}]
NUMERIC = ["max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "n", "logprobs",
           "top_logprobs", "best_of", "presence_penalty", "frequency_penalty"]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("field", NUMERIC)
def test_extreme_values_in_each_numeric_field_of_a_valid_request(client, path, field):
    """A request that would succeed, with one field at an extreme: 200 (decoded) or 4xx, never a failed decode."""
    base = {"prompt": "ab"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "ab"}]}
    for value in EXTREMES:
        for stream in (False, True):
            _check(_send(client, "POST", path, json.dumps({**base, "max_tokens": 3, "stream": stream,
                                                           field: value}).encode()))


def _alive(client, path="/v1/completions", body=None):
    """The server still answers a good request."""
    r = _send(client, "POST", path, json.dumps(body or {"prompt": "ab", "max_tokens": 2}).encode())
    assert r.status_code == 200, r.text[:500]


# -- structured output, tools, logprobs ----------------------------------------------------------------------------
SELF_REF = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}  # issue 44: a 500 at the first token
names = st.sampled_from(["get_weather", "f", "", "x y"]) | text
schemas = st.recursive(
    st.sampled_from([{"type": t} for t in ("string", "integer", "number", "boolean", "null", "object", "array")])
    | st.sampled_from([SELF_REF, {"$ref": "#"}, {"$ref": "#/nowhere"}, {"enum": ["a", 1, None]}, {"const": "\u03a9"},
                       {"const": "ab"}, {"type": "string", "pattern": "("}, {"type": "string", "pattern": "a+"},
                       {"type": "integer", "minimum": 5, "maximum": 1}, {"not": {}}, {}, {"type": "wat"}]),
    lambda inner: st.fixed_dictionaries({"type": st.just("array"), "items": inner})
    | st.fixed_dictionaries({"type": st.just("object"),
                             "properties": st.dictionaries(st.sampled_from(["a", "b", "\u00e9"]), inner, max_size=3)},
                            optional={"required": st.lists(st.sampled_from(["a", "b", "c"]), max_size=3),
                                      "additionalProperties": st.booleans()})
    | st.builds(lambda xs: {"anyOf": xs}, st.lists(inner, min_size=1, max_size=3))
    | st.builds(lambda d, r: {"$defs": {"a": d}, **r}, inner, st.sampled_from([{"$ref": "#/$defs/a"}, {}])),
    max_leaves=6)
response_formats = (st.sampled_from([{"type": "text"}, {"type": "json_object"}, {"type": "yaml"}])
                    | st.builds(lambda s: {"type": "json_schema", "json_schema": {"name": "x", "schema": s}}, schemas)
                    | json_values)
tool_lists = st.lists(st.builds(lambda n, p: {"type": "function", "function": {"name": n, "parameters": p}},
                                names, schemas | json_values), max_size=3) | json_values
tool_choices = (st.sampled_from(["none", "auto", "required"])
                | st.builds(lambda n: {"type": "function", "function": {"name": n}}, names) | json_values)
DEEP_ARGS = ["[" * 5000 + "]" * 5000, '{"a":' * 3000 + "1" + "}" * 3000]  # JSON text nested deep, inside a string
calls = st.lists(st.builds(lambda n, a: {"id": "c1", "type": "function", "function": {"name": n, "arguments": a}},
                           names, st.sampled_from(['{"city": "Paris"}', "not json", *DEEP_ARGS]) | text), max_size=2)
tool_turns = st.lists(st.fixed_dictionaries({"role": st.just("assistant"), "content": st.none() | text,
                                             "tool_calls": calls | json_values})
                      | st.fixed_dictionaries({"role": st.just("tool"), "tool_call_id": st.just("c1"),
                                               "content": text}), max_size=2)
STRUCTURED = {"response_format": response_formats, "tools": tool_lists, "tool_choice": tool_choices,
              "logprobs": st.booleans() | st.integers(-3, 25) | json_values,
              "top_logprobs": st.integers(-3, 25) | json_values, "echo": st.booleans() | json_values}


@st.composite
def structured(draw, chat: bool):
    """A request that would be served, with some of the structured-output, tools and logprobs fields drawn."""
    if chat:
        body = {"messages": [{"role": "user", "content": draw(text)}] + draw(tool_turns)}
    else:
        body = {"prompt": draw(text | st.lists(text, min_size=1, max_size=3))}
    body.update(max_tokens=draw(st.integers(1, 6)), stream=draw(st.booleans()), temperature=draw(st.floats(0, 2)))
    for name in draw(st.lists(st.sampled_from(sorted(STRUCTURED)), unique=True, max_size=4)):
        body[name] = draw(STRUCTURED[name])
    return body


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@SETTINGS
@given(data=st.data())
def test_structured_output_tools_and_logprobs_are_answered_200_or_4xx(client, path, data):
    body = data.draw(structured(path.endswith("chat/completions")))
    _check(_send(client, "POST", path, json.dumps(body).encode()))
    _alive(client)


TEMPLATE = (  # a chat template that reads `tools` (transformers' convention), as tests/serve/test_tools.py's
    "{%- if tools %}<|im_start|>system\nTools:\n{% for t in tools %}{{ t.function.name }}\n{% endfor %}<|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.tool_calls %}{% for c in m.tool_calls %}"
    "<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}"
    "</tool_call>{% endfor %}{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tools_client():
    """A random model whose (byte-level) tokenizer's chat template takes tools: tool_choice is enforced for real."""
    tokenizers = pytest.importorskip("tokenizers")
    pytest.importorskip("jinja2")
    pytest.importorskip("llguidance")
    from tokennet.tokens.pretrained import PretrainedTokenizer

    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(['<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'] * 3,
                            vocab_size=300, min_frequency=1, special_tokens=["<|im_start|>", "<|im_end|>"])
    e = bpe._tokenizer
    tok = PretrainedTokenizer(e, bos_id=e.token_to_id("<|im_start|>"), eos_id=e.token_to_id("<|im_end|>"),
                              chat_template=TEMPLATE)
    torch.manual_seed(0)
    model = create_model("gpt-micro", vocab_size=tok.vocab_size, block_size=512).eval()
    with testclient.TestClient(create_app(Engine(model, tok, max_batch=4, max_queue=16), model_name="tiny",
                                          api_key=KEY)) as c, ThreadPoolExecutor(1) as pool:
        yield c, pool


@SETTINGS
@given(data=st.data())
def test_tools_and_tool_choice_on_a_template_that_takes_them_are_answered_200_or_4xx(tools_client, data):
    body = data.draw(structured(chat=True))
    body.setdefault("tools", data.draw(tool_lists))
    _check(_send(tools_client, "POST", "/v1/chat/completions", json.dumps(body).encode()))
    _alive(tools_client, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})


# -- embeddings ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def embed_client(tmp_path_factory):
    """A random one-layer text encoder: a text-embedding run, served on /v1/embeddings."""
    import tokennet
    from tokennet.models.registry import model_from_config, save_pretrained
    from tokennet.models.text_encoder import TextEncoderConfig
    from tokennet.run import save_tokenizer, write_run_info
    from tokennet.serve.embeddings import Embedder

    path = tmp_path_factory.mktemp("encoder") / "run"
    torch.manual_seed(0)
    save_pretrained(model_from_config(TextEncoderConfig(vocab_size=TOK.vocab_size, max_len=64, dim=32, num_layers=1,
                                                        num_heads=2, type_vocab_size=0)), path)
    save_tokenizer(path, TOK)
    write_run_info(path, recipe="import", model="text-encoder", data=None, settings={})
    app = create_app(None, embedder=Embedder(tokennet.load(path)), model_name="tiny", api_key=KEY)
    with testclient.TestClient(app) as c, ThreadPoolExecutor(1) as pool:
        yield c, pool


EMBED = {"model": st.just("tiny") | json_values, "input": text | st.lists(text, max_size=4) | json_values
         | st.lists(st.integers(-2, 60), max_size=4), "encoding_format": st.sampled_from(["float", "base64"])
         | json_values, "dimensions": st.sampled_from([32, 0, -1, 2**63]) | json_values, "user": text | json_values}


@SETTINGS
@given(fields=st.lists(st.sampled_from(sorted(EMBED)), unique=True), data=st.data(),
       deep=st.none() | st.integers(129, 5000))
def test_the_embeddings_fields_are_answered_200_or_4xx(embed_client, fields, data, deep):
    body = {name: data.draw(EMBED[name]) for name in fields}
    raw = json.dumps(body).encode()
    if deep is not None:  # the input nested deep: a 400 before anything walks it
        raw = b'{"input": ' + b"[" * deep + b'"a"' + b"]" * deep + b"}"
    r = _send(embed_client, "POST", "/v1/embeddings", raw)
    _check(r)
    assert deep is None or r.status_code == 400
    _alive(embed_client, "/v1/embeddings", {"input": "ab"})


# -- bodies nested deep --------------------------------------------------------------------------------------------
POSTS = ["/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/tokenize", "/detokenize"]


@SETTINGS
@given(path=st.sampled_from(POSTS), depth=st.integers(129, 60000), where=st.sampled_from(["array", "object", "field"]))
def test_a_body_nested_past_the_bound_is_a_400_on_every_route(client, path, depth, where):
    """issue 44: 40,000 levels were a RecursionError, a 500; past 128 levels a body is a 400 before it is walked."""
    if where == "array":
        raw = b"[" * depth + b"]" * depth
    elif where == "object":
        raw = b'{"a":' * depth + b"1" + b"}" * depth
    else:  # a good request whose one field is nested deep
        raw = b'{"prompt": "ab", "messages": [{"role": "user", "content": "a"}], "response_format": ' \
              + b"[" * depth + b"]" * depth + b"}"
    r = _send(client, "POST", path, raw)
    _check(r)
    assert r.status_code == 400
    _alive(client)


# -- clients that hang up ------------------------------------------------------------------------------------------
async def _drive(app, path: str, raw: bytes, cut: str, at: int) -> int | None:
    """One request to the ASGI app from a client that hangs up: ``mid_body`` after ``at`` of its bytes (declaring
    them all), ``after_body`` as soon as the body is sent, ``mid_stream`` after ``at`` response chunks. The status
    the app answered (None: none), which nobody reads."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()),
                         (b"authorization", f"Bearer {KEY}".encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    gone, out = asyncio.Event(), {"status": None, "chunks": 0}
    parts = [raw[:at], raw[at:]] if cut == "mid_body" else [raw]

    async def receive():
        if parts:
            part = parts.pop(0)
            if cut == "mid_body" and not parts:  # the rest never comes: the client hung up
                gone.set()
            else:
                return {"type": "http.request", "body": part, "more_body": bool(parts)}
        if cut != "mid_stream":
            gone.set()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if gone.is_set():
            return  # what uvicorn's send does on a closed connection
        if message["type"] == "http.response.start":
            out["status"] = message["status"]
        elif message["type"] == "http.response.body":
            out["chunks"] += 1
            if out["chunks"] > at or not message.get("more_body"):
                gone.set()

    await asyncio.wait_for(app(scope, receive, send), timeout=60)
    return out["status"]


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize"])
@SETTINGS
@given(data=st.data(), cut=st.sampled_from(["mid_body", "after_body", "mid_stream"]), at=st.integers(0, 6))
def test_a_client_that_hangs_up_is_never_an_internal_error(client, path, data, cut, at):
    """issue 44: a body cut short was logged as 'internal error' with a ClientDisconnect traceback; a hang-up
    mid-body or mid-stream is at most one line in the log, at INFO, and the server goes on."""
    body = data.draw(structured(path.endswith("chat/completions")) if path != "/tokenize"
                     else st.fixed_dictionaries({"prompt": text}))
    raw = json.dumps(body).encode()
    at_byte = min(len(raw) - 1, at * max(1, len(raw) // 6))
    c, pool = client
    seen = _Records()
    root = logging.getLogger()
    level, root.level = root.level, logging.DEBUG
    root.addHandler(seen)
    try:
        status = pool.submit(c.portal.call, _drive, c.app, path, raw, cut,
                             at_byte if cut == "mid_body" else at).result(timeout=90)
    finally:
        root.removeHandler(seen)
        root.setLevel(level)
    assert status is None or status < 500, status
    bad = [r for r in seen.records if r.levelno >= logging.WARNING or r.exc_info or "internal error" in r.getMessage()]
    assert not bad, [r.getMessage() for r in bad]
    assert len([r for r in seen.records if "closed the connection" in r.getMessage()]) <= 1
    _alive(client)
