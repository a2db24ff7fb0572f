"""Chat rendering: a conversation (``[{"role", "content"}, ...]``) as the prompt text a language model reads.

It sits next to the tokenizer because it is the tokenizer's: a tokenizer with a chat template (an imported model's
own, e.g. SmolLM2's ChatML, rendered in jinja2's sandbox by :mod:`tokennet.tokens.chat_template`) renders with it;
one without renders plain ChatML. ``tokennet generate --chat``, chat fine-tuning (:mod:`tokennet.data.chats`) and
``tokennet serve`` all render through :func:`render_chat`.
"""

from __future__ import annotations

from typing import Any

from ..errors import DataError

__all__ = ["ROLES", "END_OF_TURN", "check_messages", "render_chat", "chat_stop_strings"]

ROLES = ("system", "user", "assistant", "tool")

END_OF_TURN = "<|im_end|>"  # the plain ChatML of a tokenizer without a template ends each turn with it


def check_messages(messages: Any, where: str = "messages") -> list[dict[str, str]]:
    """Validate a conversation: a non-empty list of ``{"role": one of ROLES, "content": str}``; DataError otherwise."""
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{where}: 'messages' must be a non-empty list of {{'role', 'content'}} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise DataError(f"{where}: message {i} is not an object")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise DataError(f"{where}: message {i} has role {role!r}; expected one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise DataError(f"{where}: message {i} has no text 'content' (got {type(content).__name__})")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def render_chat(tokenizer, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
                where: str | None = None, **variables: Any) -> str:
    """A conversation as prompt text: the tokenizer's own chat template, else plain ChatML.

    A template renders as transformers renders it, in jinja2's sandbox (:mod:`tokennet.tokens.chat_template`):
    the one renderer of ``tokennet generate --chat``, chat fine-tuning and ``tokennet serve``. ``where`` names the
    template in its errors (the run); ``variables``: ``tools``, ``documents``, ... for the template.
    Plain ChatML is ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message and ``<|im_start|>assistant\\n``
    as the generation prompt; tokennet's own tokenizers read it as ordinary text.
    """
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, where=where,
                                             **variables)
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}{END_OF_TURN}\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def chat_stop_strings(tokenizer) -> list[str]:
    """Text that ends a reply when the tokenizer has no end-of-turn token of its own (the plain ChatML marker)."""
    return [] if getattr(tokenizer, "chat_template", None) else [END_OF_TURN]
