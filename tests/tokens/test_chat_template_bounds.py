"""One chat template render is bounded in time and in output (issue 44): a template's loops, recursion and string
building stop at ``MAX_RENDER_SECONDS`` / ``MAX_RENDER_CHARS`` with one line naming the template, instead of holding
a request's worker thread for minutes or filling memory. Each case runs under an alarm, so without the bound the
test fails instead of hanging."""

from __future__ import annotations

import pytest
from robustness.fuzzing import time_limit

from tokennet.errors import DataError
from tokennet.tokens import chat_template as ct
from tokennet.tokens.chat_template import render_chat_template

pytest.importorskip("jinja2")

CHAT = [{"role": "user", "content": "Hello!"}]


@pytest.fixture
def short_bound(monkeypatch):
    """A bound of half a second (the default's few seconds would only make the tests slower)."""
    monkeypatch.setattr(ct, "MAX_RENDER_SECONDS", 0.5)


def _refused(template: str) -> str:
    with time_limit(30), pytest.raises(DataError) as e:
        render_chat_template(template, CHAT, where="/models/evil/tokenizer_config.json")
    msg = str(e.value)
    assert "\n" not in msg and "/models/evil/tokenizer_config.json" in msg, msg
    return msg


@pytest.mark.parametrize("template", [
    # 10**9 iterations: range() alone is capped at 100,000 by the sandbox, nested loops are not
    "{% for i in range(100000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(10000) %}{{ '' }}{% endfor %}{% endfor %}",
    # no loop at all: a macro calling itself twice per level, 2**60 calls
    "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",
], ids=["nested loops", "nested loops with output", "doubling recursion"])
def test_a_render_past_the_time_bound_is_one_line(short_bound, template):
    assert "MAX_RENDER_SECONDS" in _refused(template)


@pytest.mark.parametrize("template", [
    "{% for i in range(100000) %}{{ 'x' * 9000000 }}{% endfor %}",
    # the text goes to a macro's buffer, never to the output, and is still counted
    "{% macro big() %}{% for i in range(100000) %}{{ 'x' * 9000000 }}{% endfor %}{% endmacro %}{% set s = big() %}",
    # literal text repeated by loops
    "{% for i in range(100000) %}{% for j in range(100) %}" + "y" * 100 + "{% endfor %}{% endfor %}",
], ids=["huge output", "huge macro text", "repeated literal"])
def test_a_render_past_the_output_bound_is_one_line(template):
    assert "MAX_RENDER_CHARS" in _refused(template)


@pytest.mark.parametrize("op", ["~", "+"])
def test_a_string_doubled_in_a_loop_is_refused(op):
    template = ("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s " + op + " ns.s %}"
                "{% endfor %}{{ ns.s | length }}")
    assert "builds a string or list" in _refused(template)


def test_the_output_bound_is_the_module_constant(monkeypatch):
    template = "{% for i in range(50) %}{{ 'abcd' }}{% endfor %}"
    assert render_chat_template(template, CHAT) == "abcd" * 50
    monkeypatch.setattr(ct, "MAX_RENDER_CHARS", 199)
    assert "199 characters" in _refused(template)


def test_loops_still_render_as_jinja_renders_them():
    """The loops are wrapped when compiled: `loop.length`, `else`, unpacking and filters on the iterable behave."""
    template = ("{% for m in messages %}{{ loop.index }}/{{ loop.length }}:{{ m.content }}{% endfor %}|"
                "{% for x in [] %}x{% else %}empty{% endfor %}|"
                "{% for k, v in {'a': 1, 'b': 2}.items() if v > 1 %}{{ k }}={{ v }}{% endfor %}|"
                "{% for c in 'abc' | reverse %}{{ c ~ loop.revindex }}{% endfor %}|{{ [1, 2] + [3] }}")
    chat = [*CHAT, {"role": "assistant", "content": "Hi"}]
    assert render_chat_template(template, chat) == "1/2:Hello!2/2:Hi|empty|b=2|c3b2a1|[1, 2, 3]"
