"""The language-model task: continue a prompt, token by token, over the KV cache."""

from __future__ import annotations

import math
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
                use_cache: bool = True, quantize: str = "none") -> Iterator[str]:
    """Yield the continuation of ``prompt`` as printable pieces of text, as the tokens come.

    A byte-level token may end inside a UTF-8 character: a piece is yielded only once it decodes
    cleanly, and whatever is left is yielded at the end. ``quantize`` (``"none"``, ``"bf16"``, ``"int8"``)
    decodes with a low-precision copy of the model's linear layers and head, made for this call (see
    :func:`tokennet.sampling.generate`).
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
                      top_k=top_k, top_p=top_p, use_cache=use_cache, generator=g, quantize=quantize,
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

    def evaluate_text(self, run: Run, text: str, *, window: int = 1024, max_tokens: int = 262_144,
                      batch_size: int = 8) -> dict[str, float]:
        """Next-token loss and perplexity of the model on ``text`` (e.g. an imported checkpoint on a file).

        The text is tokenized with the run's tokenizer (with the special tokens it adds itself), cut into
        non-overlapping windows of ``min(window, block_size)`` + 1 tokens, and every token after the first
        of a window is predicted from the ones before it in that window: loss = mean over all those
        tokens of −log p(token | window prefix), perplexity = exp(loss). At most ``max_tokens`` tokens are
        read (``truncated`` says whether the text was longer).
        """
        model, tok = run.model, run.tokenizer
        if tok is None:
            raise RunError(f"{run.path} has no tokenizer.json: evaluating on text needs one")
        ids = tok.encode(text)  # as the source's tokenizer reads it (Llama's: with a leading <s>)
        truncated = len(ids) > max_tokens
        ids = ids[:max_tokens]
        w = min(window, model.config.block_size)
        if len(ids) < 2:
            raise RunError("the text is shorter than two tokens: nothing to predict")
        starts = list(range(0, len(ids) - 1, w))
        dev = run.device
        total, count = 0.0, 0
        with torch.no_grad():
            for i in range(0, len(starts), batch_size):
                chunk = [ids[s:s + w + 1] for s in starts[i:i + batch_size]]
                n = max(len(c) for c in chunk)
                x = torch.full((len(chunk), n), -1, dtype=torch.long)
                for r, c in enumerate(chunk):
                    x[r, :len(c)] = torch.tensor(c)
                inp, tgt = x[:, :-1].clamp(min=0).to(dev), x[:, 1:].to(dev)  # (B, n-1); -1 = padding, ignored
                logits = model(inp).logits.float()
                loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=-1,
                                                         reduction="sum")
                total += float(loss)
                count += int((tgt >= 0).sum())
        mean = total / count
        return {"loss": mean, "perplexity": math.exp(mean), "tokens": count, "window": w, "truncated": truncated}
