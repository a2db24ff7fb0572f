"""Chat templates rendered as ``transformers``' ``apply_chat_template`` renders them, inside jinja2's sandbox.

A chat template comes inside a checkpoint someone else wrote (a GGUF file's ``tokenizer.chat_template``, an HF
directory's ``tokenizer_config.json`` or ``chat_template.jinja``): it is untrusted code. A plain
``jinja2.Environment`` lets ``{{ cycler.__init__.__globals__.os.system(...) }}`` run a shell command (the bug
class of llama-cpp-python's CVE-2024-34359). Here it renders as transformers does
(``utils/chat_template_utils.py``), so a prompt equals what the model was trained on:

- ``jinja2.sandbox.ImmutableSandboxedEnvironment`` (no Python internals, no mutation of the inputs) with
  ``trim_blocks`` and ``lstrip_blocks`` (a block tag's newline and indentation are not output) and the
  ``loopcontrols`` extension (``{% break %}``, ``{% continue %}``), ``{% generation %}`` accepted;
- transformers' ``tojson`` filter (``json.dumps``, no HTML escaping, ``indent`` / ``separators`` / ``sort_keys``),
  the globals ``raise_exception(message)``, ``strftime_now(format)``, ``dict`` and a ``namespace`` that refuses
  underscore names;
- the variables ``messages``, ``tools``, ``documents``, ``add_generation_prompt`` and the tokenizer's special
  tokens (``bos_token``, ``eos_token``, ``unk_token``, ``pad_token``, … where it has them); an unknown variable is
  jinja's default undefined (empty, false), as in transformers. Message keys whose value is None are dropped and
  ``reasoning_content`` is filled from ``thinking`` / ``reasoning``, as transformers does.

Stricter than transformers: a template that reads a Python internal (``__globals__``, ``__class__``,
``__subclasses__``, ``mro``, ``|attr('__…')``) or other templates (``include``, ``import``, ``extends``) is
refused when it is compiled, before anything renders, even in a branch the conversation would not reach; an
unsafe attribute reached at render time (a name built from pieces) is an error, where jinja would render it
empty; ``*``, ``**``, ``+`` and ``~`` that would build a huge string, list or number are errors. One render is
bounded (it runs in a request's worker thread): it may take at most :data:`MAX_RENDER_SECONDS` and output at most
:data:`MAX_RENDER_CHARS` characters, counted wherever a template outputs (a macro's or ``{% set %}`` block's text
too). The time is checked at every loop iteration, every call and every output (the template's loops are wrapped
when it is compiled), so nested loops or a macro recursing twice per level stop at the bound instead of running for
minutes. Every failure is one :class:`~tokennet.errors.DataError` line naming the template. Templates are compiled
once per text (a server renders one per request).
"""

from __future__ import annotations

import contextvars
import functools
import json
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ..errors import DataError, one_line

__all__ = ["render_chat_template", "check_chat_template", "MAX_RENDER_SECONDS", "MAX_RENDER_CHARS"]

MAX_RENDER_SECONDS = 5.0
"""The longest one render may take: a published template renders a conversation in milliseconds; a few seconds
leave room for a long conversation on a busy machine and still free the request's worker thread."""
MAX_RENDER_CHARS = 4_000_000
"""The most characters one render may output: about a million tokens, more than any model's context (the longest
tokennet imports hold 128k tokens), so a longer prompt could not be used anyway; a request body is at most 8 MiB."""

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # transformers' names for a message's reasoning
# Names no chat template needs: Python's dunders and the internals jinja's sandbox hides (is_internal_attribute).
_INTERNAL = frozenset({"mro", "func_globals", "func_code", "func_closure", "im_func", "im_self", "im_class",
                       "gi_frame", "gi_code", "gi_yieldfrom", "cr_frame", "cr_code", "cr_await", "ag_frame",
                       "ag_code", "ag_await", "f_globals", "f_locals", "f_builtins", "f_back", "f_code",
                       "tb_frame", "tb_next", "co_code"})
_MAX_SIZE = 10_000_000  # the longest string or list a template's `*` may build
_MAX_BITS = 1_000_000  # the largest integer (in bits) a template's `**` may build
_BY_NAME = ("attr", "selectattr", "rejectattr", "groupby")  # filters whose first argument names an attribute
_MIN_JINJA = (3, 1, 6)  # older jinja2 releases have known sandbox escapes (CVE-2024-56326, CVE-2025-27516)


def _is_internal(name: Any, *, dunder_only: bool = False) -> bool:
    return isinstance(name, str) and (name.startswith("__") or (not dunder_only and name in _INTERNAL))


class _Raised(Exception):
    """``raise_exception(message)`` in a template: the template refuses the conversation."""


class _OverBudget(Exception):
    """A render ran past :data:`MAX_RENDER_SECONDS` or output more than :data:`MAX_RENDER_CHARS`."""


class _Budget:
    """One render's allowance of time and output; the sandbox's hooks read it from :data:`_BUDGET`."""

    def __init__(self, seconds: float, chars: int):
        self.seconds, self.chars = seconds, chars
        self.deadline, self.left = time.monotonic() + seconds, chars

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise _OverBudget(f"rendering ran past its bound of {self.seconds:g} s (MAX_RENDER_SECONDS)")

    def output(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise _OverBudget(f"it output more than its bound of {self.chars:,} characters (MAX_RENDER_CHARS)")
        self.tick()


# The budget of the render running in this thread (a server renders in several worker threads at once).
_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("chat_template_budget", default=None)


def _tick() -> None:
    budget = _BUDGET.get()
    if budget is not None:
        budget.tick()


def _import_jinja():
    """jinja2, when a release without known sandbox escapes is installed (it is optional: imported on first use)."""
    try:
        import jinja2
    except ImportError:
        raise DataError("chat templates need the jinja2 package: pip install 'jinja2>=3.1.6'") from None
    version = tuple(int(part) for part in jinja2.__version__.split(".")[:3] if part.isdigit())
    if version < _MIN_JINJA:
        raise DataError(f"chat templates need jinja2 >= 3.1.6 (older releases have sandbox escapes); this is "
                        f"{jinja2.__version__}: pip install -U jinja2")
    return jinja2


def _sandbox_class():
    """jinja's immutable sandbox that also refuses huge ``*``, ``**`` and ``+`` and ticks the budget at every call."""
    from jinja2.exceptions import SecurityError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Sandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "+"})

        def unsafe_undefined(self, obj, attribute):
            # jinja returns an undefined that fails only when used; refuse at once, so nothing renders past it
            raise SecurityError(f"it reads {attribute!r} of a {type(obj).__name__!r} object (a template may not "
                                "reach Python internals or change its inputs)")

        def call_binop(self, context, operator, left, right):
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > _MAX_SIZE:
                        raise SecurityError(f"it repeats a {type(seq).__name__} of length {len(seq)} {n} times")
            elif operator == "+":
                if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
                    _check_size(len(left) + len(right))
            elif isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
                if right * abs(left).bit_length() > _MAX_BITS:
                    raise SecurityError(f"it computes {left} ** {right}, a number too large to build")
            return super().call_binop(context, operator, left, right)

        def call(self, context, obj, /, *args, **kwargs):
            _tick()  # a macro that calls itself twice per level loops without a `for`
            return super().call(context, obj, *args, **kwargs)

    return Sandbox


def _generation_extension():
    from jinja2 import nodes
    from jinja2.ext import Extension

    class Generation(Extension):
        """``{% generation %}…{% endgeneration %}`` (transformers marks the assistant's text with it): its body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    return Generation


def _namespace_class():
    """jinja's ``namespace``, refusing underscore names."""
    from jinja2.exceptions import SecurityError
    from jinja2.utils import Namespace

    def check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"it stores {name!r} on a namespace (underscore names are refused)")

    class TemplateNamespace(Namespace):
        def __init__(*args, **kwargs):  # jinja's signature trick: `namespace(self=...)` still works
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                check_name(name)
            Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            check_name(name)
            Namespace.__setitem__(self, name, value)

    return TemplateNamespace


class TemplateDict:
    """``dict(...)`` and ``dict.fromkeys(...)`` without the type itself (its attributes lead to internals)."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


def _raise_exception(message):
    raise _Raised(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' own: jinja's tojson escapes <, >, & and ' for HTML, which a prompt must not
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format):
    return datetime.now().strftime(format)


@functools.lru_cache(maxsize=1)
def _environment():
    """The one sandboxed environment every template compiles in (built on first use: jinja2 is optional)."""
    _import_jinja()
    from jinja2.ext import loopcontrols

    env = _sandbox_class()(trim_blocks=True, lstrip_blocks=True, extensions=[_generation_extension(), loopcontrols])
    env.filters["tojson"] = _tojson
    env.filters.update({_LOOP: _bounded_loop, _EMIT: _counted_output, _JOINED: _joined})
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, dict=TemplateDict(),
                       namespace=_namespace_class())
    return env


_LOOP, _EMIT, _JOINED = "_tokennet_loop", "_tokennet_output", "_tokennet_joined"  # wrapped in by _bound


def _check_size(n: int) -> None:
    if n > _MAX_SIZE:
        from jinja2.exceptions import SecurityError

        raise SecurityError(f"it builds a string or list of {n:,} items (at most {_MAX_SIZE:,})")


def _pass_context(fn):
    # a filter that takes the context is never evaluated when the template is compiled (jinja folds constants)
    from jinja2 import pass_context

    return pass_context(fn)


@_pass_context
def _bounded_loop(context, iterable):
    """A `for` loop's iterable, its time checked at every iteration."""
    for item in iterable:
        _tick()
        yield item


@_pass_context
def _counted_output(context, value):
    """An output's value, unchanged, its characters counted against the render's bound."""
    budget = _BUDGET.get()
    if budget is not None:
        budget.output(len(value) if isinstance(value, str) else len(str(value)))
    return value


@_pass_context
def _joined(context, value):
    """The result of ``~``, refused when it is huge (doubling a string in a loop grows it exponentially)."""
    if isinstance(value, str):
        _check_size(len(value))
    return value


def _bound(ast):
    """The parsed template with every loop's iterable, every output and every ``~`` wrapped in the filters that
    bound a render (see the module docstring)."""
    from jinja2 import nodes
    from jinja2.visitor import NodeTransformer

    def wrap(node, name):
        return nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)

    class Bound(NodeTransformer):
        def visit_For(self, node):
            node = self.generic_visit(node)
            node.iter = wrap(node.iter, _LOOP)
            return node

        def visit_Output(self, node):
            node = self.generic_visit(node)
            node.nodes = [wrap(child, _EMIT) for child in node.nodes]
            return node

        def visit_Concat(self, node):
            return wrap(self.generic_visit(node), _JOINED)

    return Bound().visit(ast)


def _refusal(ast) -> str | None:
    """Why a parsed template is refused before it renders (see the module docstring), or None."""
    from jinja2 import nodes

    for node in ast.find_all((nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends)):
        return (f"it reads another template ({type(node).__name__.lower()}, line {node.lineno}), which a chat "
                "template cannot")
    for node in ast.find_all((nodes.Getattr, nodes.Getitem, nodes.Filter)):
        if isinstance(node, nodes.Getattr):
            names, dunder_only = [node.attr], False
        elif isinstance(node, nodes.Getitem):  # a dict key may be any text but a dunder: `m['mro']` is fine
            names, dunder_only = [node.arg.value] if isinstance(node.arg, nodes.Const) else [], True
        else:  # the filters that read an attribute by name: |attr('__class__'), |map(attribute=...)
            names = [k.value.value for k in node.kwargs if k.key == "attribute" and isinstance(k.value, nodes.Const)]
            if node.name in _BY_NAME and node.args and isinstance(node.args[0], nodes.Const):
                names.append(node.args[0].value)
            dunder_only = node.name != "attr"
        for name in names:
            if _is_internal(name, dunder_only=dunder_only):
                return (f"it reads {name!r} (line {node.lineno}), a Python internal (a template may read only its "
                        "messages and settings)")
    return None


@functools.lru_cache(maxsize=64)
def _compile(template: str):
    """``(compiled template, None)`` or ``(None, why it is refused)``; cached by the template's text."""
    from jinja2.exceptions import TemplateSyntaxError

    env = _environment()
    try:
        ast = env.parse(template)
    except TemplateSyntaxError as error:
        return None, f"is not a valid Jinja template: {one_line(error.message)} (line {error.lineno})"
    why = _refusal(ast)
    if why:
        return None, f"is refused: {why}; nothing was run"
    try:
        return env.from_string(_bound(ast)), None
    except Exception as error:  # noqa: BLE001 - jinja's compiler may raise anything on an odd tree; the template's fault
        return None, f"is not a valid Jinja template: {one_line(error)}"


def check_chat_template(template: str, where: str = "this tokenizer") -> None:
    """Compile ``template`` (cached); a syntax error or a refused template is a one-line DataError naming ``where``."""
    if not isinstance(template, str):
        raise DataError(f"the chat template of {where} is not text (got {type(template).__name__})")
    compiled, why = _compile(template)
    if compiled is None:
        raise DataError(f"the chat template of {where} {why}")


def _plain(value: Any, where: str) -> Any:
    """The template's inputs as plain JSON data (str, int, float, bool, None, lists, dicts): no object a template
    could call methods of; subclasses (enums, numpy scalars) are cut back to their base type."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k, where): _plain(v, where) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, where) for v in value]
    raise DataError(f"the chat template of {where} was given a {type(value).__name__}; a conversation, its tools "
                    "and documents must be JSON data")


def _message(m: Any, where: str) -> dict[str, Any]:
    if not isinstance(m, dict):
        raise DataError(f"the chat template of {where} was given a message that is not an object: {m!r:.60}")
    m = {k: v for k, v in m.items() if v is not None}  # `content: null` renders as a missing key, not "None"
    reasoning = next((m[k] for k in _REASONING_FIELDS if m.get(k) is not None), None)
    if reasoning is not None:
        m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
    return m


def render_chat_template(template: str, messages: list[dict[str, Any]], *, where: str = "this tokenizer",
                         add_generation_prompt: bool = False, tools: list[dict[str, Any]] | None = None,
                         documents: list[dict[str, Any]] | None = None,
                         special_tokens: Mapping[str, str | None] | None = None, **variables: Any) -> str:
    """The prompt text of ``messages``, rendered with ``template`` as transformers' ``apply_chat_template(...,
    tokenize=False)`` renders it (see the module docstring).

    Args:
        template: the Jinja chat template.
        messages: the conversation, ``[{"role": ..., "content": ...}, ...]`` (JSON data).
        where: names the template in errors: the run or file it came from.
        add_generation_prompt: end with the header of an assistant turn (the prompt for a reply).
        tools: JSON schemas of the tools the model may call (``{"type": "function", "function": {...}}``).
        documents: retrieved documents (``{"title": ..., "text": ...}``).
        special_tokens: ``{"bos_token": "<s>", ...}``; entries that are None are left undefined.
        variables: further template variables (as transformers' ``**kwargs``; they override special tokens).

    Raises:
        DataError: one line naming ``where`` — the template does not parse, is refused (Python internals), calls
        ``raise_exception``, fails on these messages, or runs past :data:`MAX_RENDER_SECONDS` or
        :data:`MAX_RENDER_CHARS`.
    """
    check_chat_template(template, where)
    compiled, _ = _compile(template)
    if not isinstance(messages, (list, tuple)):
        raise DataError(f"the chat template of {where} needs a list of messages, got {type(messages).__name__}")
    chat = [_message(m, where) for m in _plain(list(messages), where)]
    if documents is not None and not all(isinstance(document, Mapping) for document in documents):
        raise DataError(f"the chat template of {where}: documents must be objects with 'title' and 'text'")
    values = {k: v for k, v in (special_tokens or {}).items() if v is not None}
    values.update(_plain(variables, where))
    from jinja2.exceptions import SecurityError

    budget = _Budget(MAX_RENDER_SECONDS, MAX_RENDER_CHARS)
    token = _BUDGET.set(budget)
    try:
        parts = []
        for part in compiled.generate(messages=chat, tools=_plain(tools, where), documents=_plain(documents, where),
                                      add_generation_prompt=bool(add_generation_prompt), **values):
            parts.append(part)
            budget.tick()
        return "".join(parts)
    except _OverBudget as error:
        raise DataError(f"the chat template of {where} is refused on this conversation: {error}") from None
    except _Raised as error:
        raise DataError(f"the chat template of {where} refused the conversation: {one_line(error)}") from None
    except SecurityError as error:
        raise DataError(f"the chat template of {where} is refused: {one_line(error)}; nothing was run") from None
    except RecursionError:
        raise DataError(f"the chat template of {where} recursed too deeply on this conversation") from None
    except Exception as error:  # noqa: BLE001 - whatever a template raises on these messages is the template's error
        raise DataError(f"the chat template of {where} failed on this conversation: "
                        f"{type(error).__name__}: {one_line(error)}") from None
    finally:
        _BUDGET.reset(token)
