"""tools / tool_calls in the OpenAI format where the run's chat template takes tools; otherwise a 400."""

import json

import pytest
import torch
from api_support import TOK, client, post, running, tiny_model

pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")
jsonschema = pytest.importorskip("jsonschema")
from tokennet.data.chats import render_chat  # noqa: E402
from tokennet.serve.app import create_app  # noqa: E402
from tokennet.serve.engine import Engine  # noqa: E402
from tokennet.serve.tools import parse_tool_calls, template_takes_tools  # noqa: E402
from tokennet.tokens.pretrained import PretrainedTokenizer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:\n{% for t in tools %}{{ t.function.name }}: "
    "{{ t.function.description }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.tool_calls %}{% for c in m.tool_calls %}"
    "<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}"
    "</tool_call>{% endfor %}{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
ASK = [{"role": "user", "content": "weather in Paris?"}]
REPLY = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def _tokenizer(template=TEMPLATE):
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator([REPLY, "Tools: get_weather: the weather in a city", "weather in Paris? system user "
                             "assistant tool sunny"] * 3, vocab_size=300, min_frequency=1,
                            special_tokens=["<|im_start|>", "<|im_end|>"])
    e = bpe._tokenizer
    return PretrainedTokenizer(e, bos_id=e.token_to_id("<|im_start|>"), eos_id=e.token_to_id("<|im_end|>"),
                               chat_template=template)


@pytest.fixture(scope="module")
def server():
    """A tiny model taught (a few hundred steps on one conversation) to answer with a tool call."""
    tok = _tokenizer()
    prompt = tok.encode(render_chat(tok, ASK, tools=TOOLS))
    reply = tok.encode(REPLY) + [tok.eos_id]
    model = tiny_model(vocab_size=tok.vocab_size, block_size=256, std=0.02).train()
    ids = torch.tensor([prompt + reply])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(300):
        logits = model(ids[:, :-1]).logits  # (1, T-1, V)
        loss = torch.nn.functional.cross_entropy(logits[0, len(prompt) - 1:], ids[0, len(prompt):])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.01:
            break
    model.eval()
    with running(create_app(Engine(model, tok, max_batch=2), model_name="tools")) as port:
        yield {"port": port}


def test_a_tool_call_comes_back_in_the_openai_format(server):
    c = client(server["port"])
    r = c.chat.completions.create(model="tools", messages=ASK, tools=TOOLS, temperature=0, max_tokens=60)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content is None
    (call,) = ch.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    parts = list(c.chat.completions.create(model="tools", messages=ASK, tools=TOOLS, temperature=0, max_tokens=60,
                                           stream=True))
    deltas = [p.choices[0].delta for p in parts if p.choices]
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert len(calls) == 1 and calls[0].function.name == "get_weather" and calls[0].index == 0
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert parts[-1].choices[0].finish_reason == "tool_calls"
    plain = c.chat.completions.create(model="tools", messages=ASK, tools=TOOLS, tool_choice="none", temperature=0,
                                      max_tokens=60)
    assert plain.choices[0].message.tool_calls is None and "<tool_call>" in plain.choices[0].message.content


def test_a_conversation_with_a_call_and_its_result_renders(server):
    c = client(server["port"])
    msgs = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    r = c.chat.completions.create(model="tools", messages=msgs, tools=TOOLS, temperature=0, max_tokens=5)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    tok = _tokenizer()
    from tokennet.serve.tools import tool_messages

    text = render_chat(tok, tool_messages([{"role": m["role"], "content": m["content"] or ""} for m in msgs], msgs),
                       tools=TOOLS)
    assert REPLY in text  # the JSON arguments reached the template as an object


def test_tools_without_a_template_that_takes_them_are_a_400():
    no_tools = _tokenizer("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")
    assert template_takes_tools(_tokenizer()) and not template_takes_tools(no_tools)
    assert not template_takes_tools(TOK)
    for tok, words in ((no_tools, "does not take tools"), (TOK, "no chat template")):
        model = tiny_model(vocab_size=tok.vocab_size)
        with running(create_app(Engine(model, tok, max_batch=1), model_name="m")) as port:
            with pytest.raises(openai.BadRequestError) as e:
                client(port).chat.completions.create(model="m", messages=ASK, tools=TOOLS)
            assert e.value.body["param"] == "tools" and words in e.value.body["message"]
            status, out = post(port, "/v1/chat/completions", {"messages": ASK, "tools": TOOLS,
                                                               "tool_choice": "required"})
            assert status == 400 and out["error"]["param"] == "tools" and words in out["error"]["message"]
            assert post(port, "/v1/completions", {"prompt": "a", "tools": TOOLS})[0] == 400


def test_parse_tool_calls_formats():
    content, calls = parse_tool_calls('Let me check.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
                                      '<tool_call>{"name": "g", "arguments": {}}</tool_call>')
    assert content == "Let me check." and [c["function"]["name"] for c in calls] == ["f", "g"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"x": 1}
    content, calls = parse_tool_calls('{"name": "f", "parameters": {"x": 2}}')  # Llama 3.1's
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"x": 2}
    assert parse_tool_calls("<tool_call>{not json</tool_call>") == ("<tool_call>{not json</tool_call>", [])
    assert parse_tool_calls('{"a": 1}') == ('{"a": 1}', [])
    assert parse_tool_calls("hello") == ("hello", [])


TWO = TOOLS + [{"type": "function", "function": {
    "name": "get_time", "description": "the time in a zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 12},
                                                    "hours": {"type": "integer", "minimum": 0, "maximum": 23}},
                   "required": ["zone", "hours"], "additionalProperties": False}}}]


def _check_call(choice, names):
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name in names
    schema = next(t["function"]["parameters"] for t in TWO if t["function"]["name"] == call.function.name)
    jsonschema.validate(json.loads(call.function.arguments), schema)
    return call.function.name


def test_tool_choice_required_and_named_always_give_a_valid_call(server):
    """Constrained decoding: every sampled reply (temperature 1, a model that knows no such call) is a call of
    an allowed tool whose arguments validate against its parameters."""
    pytest.importorskip("llguidance")
    c = client(server["port"])
    named = {"type": "function", "function": {"name": "get_time"}}
    for seed in range(6):
        r = c.chat.completions.create(model="tools", messages=ASK, tools=TWO, tool_choice=named, temperature=1.0,
                                      seed=seed, max_tokens=80)
        assert _check_call(r.choices[0], {"get_time"}) == "get_time"
        r = c.chat.completions.create(model="tools", messages=ASK, tools=TWO, tool_choice="required",
                                      temperature=1.0, seed=seed, max_tokens=80)
        _check_call(r.choices[0], {"get_weather", "get_time"})
    # greedy, the model's own answer (get_weather, Paris) is the one call "required" allows it to keep
    r = c.chat.completions.create(model="tools", messages=ASK, tools=TWO, tool_choice="required", temperature=0,
                                  max_tokens=80)
    assert _check_call(r.choices[0], {"get_weather"}) == "get_weather"
    parts = list(c.chat.completions.create(model="tools", messages=ASK, tools=TWO, tool_choice=named, temperature=0,
                                           max_tokens=80, stream=True))
    calls = [tc for p in parts if p.choices for tc in (p.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].function.name == "get_time"
    jsonschema.validate(json.loads(calls[0].function.arguments), TWO[1]["function"]["parameters"])


@pytest.mark.parametrize("extra,param,words", [
    ({"tool_choice": {"type": "function", "function": {"name": "get_news"}}}, "tool_choice", "not among"),
    ({"tool_choice": {"type": "function"}}, "tool_choice", "must be"),
    ({"tool_choice": "always"}, "tool_choice", "must be"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice", "both constrain"),
    ({"tool_choice": "required", "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string", "pattern": "("}}}}}]},
     "tools", "cannot be used for constrained decoding"),
    ({"tool_choice": "required", "tools": []}, "tool_choice", "needs tools"),
])
def test_tool_choice_that_cannot_be_forced_is_a_400_saying_why(server, extra, param, words):
    pytest.importorskip("llguidance")
    status, out = post(server["port"], "/v1/chat/completions", {"messages": ASK, "tools": TWO, **extra})
    assert status == 400 and out["error"]["param"] == param and words in out["error"]["message"], out


def test_tool_choice_required_without_llguidance_is_a_400_saying_so(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llguidance" else real(name, *a))
    tok = _tokenizer()
    with running(create_app(Engine(tiny_model(vocab_size=tok.vocab_size), tok, max_batch=1), model_name="m")) as port:
        status, out = post(port, "/v1/chat/completions", {"messages": ASK, "tools": TOOLS, "tool_choice": "required"})
        assert status == 400 and out["error"]["param"] == "tool_choice" and "llguidance" in out["error"]["message"]
        assert post(port, "/v1/chat/completions", {"messages": ASK, "tools": TOOLS, "max_tokens": 2})[0] == 200
