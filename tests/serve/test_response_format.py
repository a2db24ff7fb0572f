"""response_format json_object / json_schema: every sampled output parses and validates (constrained decoding)."""

import json

import pytest
from api_support import TOK, client, post, running, tiny_model

pytest.importorskip("uvicorn")
pytest.importorskip("openai")
pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")
from tokennet.serve.app import create_app  # noqa: E402
from tokennet.serve.engine import Engine  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "n": {"type": "integer", "minimum": 0, "maximum": 999},
    "tags": {"type": "array", "items": {"enum": ["a", "bb"]}, "maxItems": 3},
    "ok": {"type": "boolean"}},
    "required": ["name", "n", "tags", "ok"], "additionalProperties": False}


@pytest.fixture(scope="module")
def server():
    model = tiny_model(block_size=256, std=0.3)  # random: only the mask makes its text valid
    with running(create_app(Engine(model, TOK, max_batch=50), model_name="tiny")) as port:  # 50 rows: one batch
        yield {"port": port}


def test_fifty_samples_at_temperature_1_all_validate_against_the_schema(server):
    body = {"model": "tiny", "prompt": ["say:"] * 50, "max_tokens": 120, "temperature": 1.0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}}}
    status, out = post(server["port"], "/v1/completions", body)
    assert status == 200, out
    texts = [c["text"] for c in out["choices"]]
    assert len(texts) == 50 and all(c["finish_reason"] == "stop" for c in out["choices"])
    for t in texts:
        jsonschema.validate(json.loads(t), SCHEMA)
    assert len(set(texts)) > 40  # sampled, not one forced text


def test_json_object_mode_gives_objects(server):
    body = {"model": "tiny", "prompt": ["x"] * 20, "max_tokens": 200, "temperature": 1.0,
            "response_format": {"type": "json_object"}}
    status, out = post(server["port"], "/v1/completions", body)
    assert status == 200, out
    done = [c["text"] for c in out["choices"] if c["finish_reason"] == "stop"]
    assert len(done) >= 15  # a random model may still be inside a long string at 200 tokens
    for t in done:
        assert isinstance(json.loads(t), dict)


def test_chat_json_schema_through_the_openai_client(server):
    c = client(server["port"])
    r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "a record"}], max_tokens=120,
                                  temperature=0.8, seed=1,
                                  response_format={"type": "json_schema",
                                                   "json_schema": {"name": "rec", "schema": SCHEMA, "strict": True}})
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    parts = list(c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "a record"}],
                                           max_tokens=120, temperature=0.8, seed=1, stream=True,
                                           response_format={"type": "json_schema",
                                                            "json_schema": {"name": "rec", "schema": SCHEMA}}))
    assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == r.choices[0].message.content


@pytest.mark.parametrize("rf,words", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}, "foo"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nowhere"}}}, "nowhere"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "("}}}, "regex"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": 5, "maximum": 1}}, "required": ["a"]}}},
     "unsatisfiable"),
    ({"type": "yaml"}, "json_object"),
    ({"type": "json_schema", "json_schema": {"schema": 3}}, "schema"),
])
def test_a_schema_that_cannot_be_compiled_is_a_400_naming_the_problem(server, rf, words):
    status, out = post(server["port"], "/v1/completions", {"prompt": "a", "response_format": rf})
    assert status == 400 and out["error"]["param"] == "response_format", out
    assert words.lower() in out["error"]["message"].lower(), out["error"]["message"]


def _bpe_tokenizers():
    tokenizers = pytest.importorskip("tokenizers")
    from tokennet.tokens.pretrained import PretrainedTokenizer
    from tokennet.tokens.text import train_tokenizer

    text = json.dumps([{"name": "ab cd", "n": 12, "tags": ["a", "bb"], "ok": True}] * 3) + " héllo wörld ✓ " * 5
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator([text], vocab_size=300, min_frequency=1, special_tokens=["<s>", "</s>"])
    e = bpe._tokenizer
    return {"bpe": train_tokenizer("bpe", text, vocab_size=300),
            "pretrained": PretrainedTokenizer(e, bos_id=e.token_to_id("<s>"), eos_id=e.token_to_id("</s>"))}


@pytest.mark.parametrize("kind", ["bpe", "pretrained"])
def test_byte_level_vocabularies_are_read_and_constrained(kind):
    """Multi-byte tokens: the bytes the grammar sees are the bytes the tokenizer decodes to."""
    from tokennet.serve.constrained import token_bytes

    tok = _bpe_tokenizers()[kind]
    table, special = token_bytes(tok, tok.vocab_size + 3)  # an embedding padded past the tokenizer
    assert set(range(tok.vocab_size, tok.vocab_size + 3)) <= set(special) and tok.eos_id in special
    for i in range(tok.vocab_size):
        if i not in special:
            assert table[i].decode("utf-8", "replace") == tok.decode([i]), i
    model = tiny_model(vocab_size=tok.vocab_size, block_size=256, std=0.3)
    with running(create_app(Engine(model, tok, max_batch=10), model_name="tiny")) as port:
        body = {"prompt": ["a"] * 10, "max_tokens": 150, "temperature": 1.0,
                "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}}}
        status, out = post(port, "/v1/completions", body)
    assert status == 200, out
    for c in out["choices"]:
        assert c["finish_reason"] == "stop"
        jsonschema.validate(json.loads(c["text"]), SCHEMA)


def test_a_vocabulary_that_cannot_write_json_is_a_400_before_the_request_is_queued():
    from tokennet.tokens.text import CharTokenizer

    tok = CharTokenizer.train("abc ")  # no braces, no quotes
    with running(create_app(Engine(tiny_model(vocab_size=tok.vocab_size), tok, max_batch=2), model_name="t")) as port:
        status, out = post(port, "/v1/completions", {"prompt": "a", "response_format": {"type": "json_object"}})
        assert status == 400 and out["error"]["param"] == "response_format", out
        assert "vocabulary" in out["error"]["message"] and "\n" not in out["error"]["message"], out
        assert post(port, "/v1/completions", {"prompt": "a", "max_tokens": 3})[0] == 200  # the server goes on


SELF_REF = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}  # issue 44: a 500 at the first token


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_schema_whose_only_definition_refers_to_itself_is_a_400_before_it_is_queued(server, path, stream):
    base = {"prompt": "a"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "a"}]}
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": SELF_REF}}
    status, out = post(server["port"], path, {**base, "max_tokens": 5, "stream": stream, "response_format": rf})
    assert status == 400 and out["error"]["param"] == "response_format", out
    assert "refers to itself" in out["error"]["message"] and "\n" not in out["error"]["message"], out


def _events(port, body):
    import http.client

    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    text = r.read().decode()
    c.close()
    return r.status, [line[6:] for line in text.splitlines() if line.startswith("data: ")]


def test_a_schema_the_vocabulary_cannot_finish_ends_that_request_with_a_400_not_a_500(server):
    """The schema's first tokens can be written ('{"a":"'), its constant cannot (no 'Ω' in the vocabulary): the
    request is the one at fault, answered 400 (in a stream: an invalid_request_error event, then [DONE])."""
    schema = {"type": "object", "properties": {"a": {"const": "Ω"}}, "required": ["a"]}
    body = {"messages": [{"role": "user", "content": "a"}], "max_tokens": 40,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    status, out = post(server["port"], "/v1/chat/completions", body)
    assert status == 400 and out["error"]["type"] == "invalid_request_error", out
    assert "can continue" in out["error"]["message"], out
    status, events = _events(server["port"], {**body, "stream": True})
    assert status == 200 and events[-1] == "[DONE]", events
    errors = [json.loads(e)["error"] for e in events[:-1] if "error" in json.loads(e)]
    assert len(errors) == 1 and errors[0]["type"] == "invalid_request_error", events
    assert post(server["port"], "/v1/completions", {"prompt": "a", "max_tokens": 3})[0] == 200
