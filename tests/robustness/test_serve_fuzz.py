"""Random bodies to the server's endpoints: every answer is a 200 or a 4xx with an OpenAI-style error body — never a
500, a traceback or a hang. Random types for every known field, random extra fields, truncated JSON, bytes that are
not JSON, huge numbers, NaN, lone surrogates and nested garbage, through the ASGI app in-process."""

import json
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
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
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
