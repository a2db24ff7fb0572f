"""The language-model task: continue a prompt, token by token, over the KV cache."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from ..errors import RunError
from ..sampling import stream
from . import CausalLM, Task

if TYPE_CHECKING:
    from ..run import Run

__all__ = ["LanguageModel", "stream_text"]


def stream_text(run: Run, prompt: str, max_new_tokens: int = 200, *, temperature: float = 0.8,
                top_k: int | None = None, top_p: float | None = None, seed: int = 0,
                use_cache: bool = True) -> Iterator[str]:
    """Yield the continuation of ``prompt`` as printable pieces of text, as the tokens come.

    A byte-level token may end inside a UTF-8 character: a piece is yielded only once it decodes
    cleanly, and whatever is left is yielded at the end.
    """
    model, tok = run.model, run.tokenizer
    if tok is None:
        raise RunError(f"{run.path} has no tokenizer.json: a language model run needs one to read the prompt")
    if max_new_tokens < 1:
        raise RunError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    dev = run.device
    ids = tok.encode(prompt) or [tok.bos_id]
    block = model.config.block_size
    if len(ids) > block:
        raise RunError(f"the prompt is {len(ids)} tokens, longer than the model's context of {block} tokens")
    torch.manual_seed(seed)
    g = torch.Generator(device=dev).manual_seed(seed)
    new: list[int] = []
    shown = ""
    for nxt in stream(model, torch.tensor([ids], device=dev), max_new_tokens, temperature=temperature,
                      top_k=top_k, top_p=top_p, use_cache=use_cache, generator=g,
                      stop=getattr(tok, "stop_ids", None)):  # imported tokenizers: stop at their end-of-turn
        new.append(int(nxt[0]))
        text = tok.decode(new)
        if not text.endswith("\ufffd"):
            yield text[len(shown):]
            shown = text
    rest = tok.decode(new)[len(shown):]
    if rest:
        yield rest


class LanguageModel(Task):
    """A causal language model (GPT): ``run.generate(prompt, max_new_tokens, temperature=..., ...)``."""

    name = "language model"
    kind = "language-model"
    verbs = ("generate",)
    protocol = CausalLM

    def generate(self, run: Run, prompt: str, max_new_tokens: int = 200, **kw) -> str:
        """The continuation of ``prompt`` (without the prompt); options as in :func:`stream_text`."""
        return "".join(stream_text(run, prompt, max_new_tokens, **kw))
