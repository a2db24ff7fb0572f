"""``tools`` and ``tool_calls`` in the OpenAI format, for runs whose chat template takes tools.

transformers' convention: a chat template that supports tools reads the variable ``tools`` (the request's
``[{"type": "function", "function": {"name", "description", "parameters"}}]``) and shows them to the model;
the model answers a call as text, which the server parses back into OpenAI's ``tool_calls``::

    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_…", "type": "function",
     "function": {"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}}]}

with ``finish_reason: "tool_calls"``. Two reply formats are read: Hermes' ``<tool_call>{"name": ...,
"arguments": {...}}</tool_call>`` blocks (Qwen2/2.5, Hermes, SmolLM2/3 templates; text before the first
block is the message's content), and a reply that is one JSON object ``{"name": ..., "arguments" |
"parameters": {...}}`` (Llama 3.1's). A reply in neither format is ordinary content. Conversations may
carry earlier calls (an assistant message's ``tool_calls``, whose JSON ``arguments`` the template gets as
an object, as transformers expects) and results (``role: "tool"`` with ``tool_call_id``).

A request with ``tools`` for a run whose template does not read ``tools`` (or that has no template) is a
400 that says so. ``tool_choice``:

- ``"auto"`` (the default): the model decides; a reply in one of the formats above is a call.
- ``"none"``: the tools are shown, no call is parsed.
- ``"required"``: the reply is one call of one of the tools; ``{"type": "function", "function": {"name": N}}``:
  one call of N. Both by constrained decoding (:mod:`.constrained`): the reply is held to the JSON schema of a
  call, ``{"name": N, "arguments": A}`` with ``name`` one of the tools' names (``const`` for a named choice)
  and ``A`` valid under that tool's ``parameters`` schema, so it always parses as a call (Llama 3.1's format
  above), with ``finish_reason: "tool_calls"`` unless ``max_tokens`` cut it short (``"length"``, the text as
  content). One call per reply. Where a call cannot be forced it is a 400 that says why: a server without
  llguidance, a name that is not among the tools, a ``parameters`` schema the constrained decoder cannot
  compile, or a ``response_format`` in the same request (both would constrain the reply).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from ..jsonio import loads
from .errors import APIError

__all__ = ["template_takes_tools", "check_tools", "call_schema", "parse_tool_calls"]

_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


def template_takes_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template reads the variable ``tools`` (transformers' convention)."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return False
    try:
        from jinja2 import Environment, meta
    except ImportError:
        return False
    try:
        return "tools" in meta.find_undeclared_variables(Environment().parse(template))
    except Exception:  # noqa: BLE001 - a template that does not parse is refused at start (check_chat_template)
        return False


def check_tools(body: dict[str, Any], tokenizer, where: str) -> tuple[list[dict[str, Any]] | None, Any]:
    """The request's tools (None: none) and its ``tool_choice``, checked: ``"none"`` (no call is parsed),
    ``"auto"``, ``"required"``, or the name of the one tool to call; 400s name the field."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        function = choice.get("function")
        if choice.get("type") != "function" or not isinstance(function, dict) \
                or not isinstance(function.get("name"), str) or not function["name"]:
            raise APIError(400, "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                           "\"function\": {\"name\": ...}}", param="tool_choice")
        choice = {"name": function["name"]}
    elif choice not in (None, "none", "auto", "required"):
        raise APIError(400, f"tool_choice must be \"none\", \"auto\", \"required\" or {{\"type\": \"function\", "
                       f"\"function\": {{\"name\": ...}}}}, got {choice!r}", param="tool_choice")
    if tools in (None, []):
        if choice not in (None, "none", "auto"):
            raise APIError(400, "tool_choice \"required\" or a named function needs tools", param="tool_choice")
        return None, "none"
    if not isinstance(tools, list) or not all(
            isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("function"), dict)
            and isinstance(t["function"].get("name"), str) and t["function"]["name"] for t in tools):
        raise APIError(400, "tools must be a list of {\"type\": \"function\", \"function\": {\"name\": ..., "
                       "\"parameters\": {...}}}", param="tools")
    for t in tools:
        params = t["function"].get("parameters")
        if params is not None and not isinstance(params, dict):
            raise APIError(400, f"tools: the parameters of {t['function']['name']!r} must be a JSON schema object",
                           param="tools")
    if not template_takes_tools(tokenizer):
        what = "has no chat template" if not getattr(tokenizer, "chat_template", None) else \
            "has a chat template that does not take tools (it never reads the variable `tools`)"
        raise APIError(400, f"tools are not supported for {where}: its tokenizer {what}; a run imported from a "
                       "checkpoint whose template supports tools (e.g. Qwen2.5, SmolLM3, Llama 3.1) serves them",
                       param="tools")
    if isinstance(choice, dict) and choice["name"] not in {t["function"]["name"] for t in tools}:
        names = ", ".join(repr(t["function"]["name"]) for t in tools)
        raise APIError(400, f"tool_choice names the function {choice['name']!r}, which is not among the request's "
                       f"tools ({names})", param="tool_choice")
    return tools, "auto" if choice is None else choice


def call_schema(tools: list[dict[str, Any]], choice: Any) -> dict[str, Any]:
    """The JSON schema of one call that ``choice`` (``"required"`` or ``{"name": N}``) allows:
    ``{"name": N, "arguments": A}``, ``A`` under that tool's ``parameters`` (any object where it has none)."""
    def one(t: dict[str, Any]) -> dict[str, Any]:
        function = t["function"]
        return {"type": "object", "properties": {"name": {"const": function["name"]},
                                                 "arguments": function.get("parameters") or {"type": "object"}},
                "required": ["name", "arguments"], "additionalProperties": False}

    chosen = [t for t in tools if choice == "required" or t["function"]["name"] == choice["name"]]
    return one(chosen[0]) if len(chosen) == 1 else {"anyOf": [one(t) for t in chosen]}


def tool_messages(messages: list[dict[str, Any]], raw: list[Any]) -> list[dict[str, Any]]:
    """Add the tool fields of the raw messages (``tool_calls``, ``tool_call_id``, ``name``) to the checked ones.

    An assistant's ``tool_calls[i].function.arguments`` is JSON text in the OpenAI format; templates expect
    an object (transformers), so it is parsed (text that is not JSON is left as is).
    """
    out = []
    for m, original in zip(messages, raw):
        m = dict(m)
        if isinstance(original, dict):
            calls = original.get("tool_calls")
            if calls is not None:
                if not isinstance(calls, list) or not all(
                        isinstance(call, dict) and isinstance(call.get("function"), dict) for call in calls):
                    raise APIError(400, "tool_calls must be a list of {\"id\", \"type\": \"function\", \"function\": "
                                   "{\"name\", \"arguments\"}}", param="messages")
                fixed = []
                for call in calls:
                    function = dict(call["function"])
                    if isinstance(function.get("arguments"), str):
                        try:
                            function["arguments"] = loads(function["arguments"], what="tool_calls arguments")
                        except ValueError:  # not JSON, or nested too deep (JSONTooDeep): left as text
                            pass
                    fixed.append({**call, "function": function})
                m["tool_calls"] = fixed
            for k in ("tool_call_id", "name"):
                if isinstance(original.get(k), str):
                    m[k] = original[k]
        out.append(m)
    return out


def _call(obj: Any) -> dict[str, Any] | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": obj["name"], "arguments": args if isinstance(args, str) else json.dumps(args)}}


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """The reply's content (None when it is only calls) and its tool calls in the OpenAI format (empty: none)."""
    if "<tool_call>" in text:
        calls = []
        for block in _BLOCK.findall(text):
            try:
                obj = loads(block, what="a tool call")
            except ValueError:
                return text, []  # not a well-formed call: the reply is content
            items = obj if isinstance(obj, list) else [obj]
            parsed = [_call(item) for item in items]
            if not parsed or None in parsed:
                return text, []
            calls += parsed
        head = text[: text.index("<tool_call>")].strip()
        return (head or None), calls
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            call = _call(loads(stripped, what="a tool call"))
        except ValueError:
            call = None
        if call is not None:
            return None, [call]
    return text, []
