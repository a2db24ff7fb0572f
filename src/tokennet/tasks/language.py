"""The language-model task: continue a prompt, token by token, over the KV cache; pictures and panel."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..errors import RunError
from ..sampling import stream
from . import CausalLM
from .base import HELP, OPTIONS, Input, Task, register_task, verb

if TYPE_CHECKING:
    from ..run import Run

__all__ = ["LanguageModel", "stream_text"]

log = logging.getLogger(__name__)


def stream_text(run: Run, prompt: str, max_new_tokens: int = 200, *, temperature: float = 0.8,
                top_k: int | None = None, top_p: float | None = None, seed: int = 0,
                use_cache: bool = True, quantize: str = "none", compile: bool | None = None) -> Iterator[str]:
    """Yield the continuation of ``prompt`` as printable pieces of text, as the tokens come.

    A byte-level token may end inside a UTF-8 character: a piece is yielded only once it decodes
    cleanly, and whatever is left is yielded at the end. ``quantize`` (``"none"``, ``"bf16"``, ``"int8"``)
    decodes with a low-precision copy of the model's linear layers and head, made for this call (see
    :func:`tokennet.sampling.generate`). ``compile``: decode with the compiled step (None, the default: on unless
    ``TOKENNET_COMPILE=0``; eager with a note where it does not compile; see :func:`tokennet.sampling.stream`).
    """
    model, tok = run.model, run.tokenizer
    if tok is None:
        raise RunError(f"{run.path} has no tokenizer.json: a language model run needs one to read the prompt")
    if max_new_tokens < 1:
        raise RunError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    dev = run.device
    ids = tok.encode(prompt) or [tok.bos_id]
    block = model.config.block_size
    if len(ids) > block:  # as nanoGPT does: the model reads the last window of the prompt
        log.warning("the prompt is %d tokens, longer than the model's context of %d: only its last %d tokens are "
                    "read", len(ids), block, block)
        ids = ids[-block:]
    torch.manual_seed(seed)
    g = torch.Generator(device=dev).manual_seed(seed)
    new: list[int] = []
    shown = ""
    for nxt in stream(model, torch.tensor([ids], device=dev), max_new_tokens, temperature=temperature,
                      top_k=top_k, top_p=top_p, use_cache=use_cache, generator=g, quantize=quantize,
                      compile=compile,
                      stop=getattr(tok, "stop_ids", None)):  # imported tokenizers: stop at their end-of-turn
        new.append(int(nxt[0]))
        text = tok.decode(new)
        if not text.endswith("\ufffd"):
            yield text[len(shown):]
            shown = text
    rest = tok.decode(new)[len(shown):]
    if rest:
        yield rest


PROMPT = Input("prompt", HELP["prompt"], file=False, required=False, default="\n")


@register_task
class LanguageModel(Task):
    """A causal language model (GPT): ``run.generate(prompt, max_new_tokens, temperature=..., ...)``."""

    name = "language model"
    kind = "language-model"
    families = ("gpt",)
    protocol = CausalLM
    inputs = (PROMPT,)
    options = tuple(OPTIONS[k] for k in ("max_new_tokens", "temperature", "top_k", "top_p", "seed", "no_cache",
                                         "no_compile", "quantize", "chat"))

    @verb
    def generate(self, run: Run, prompt: str = "\n", max_new_tokens: int = 200, **kw) -> str:
        """The continuation of ``prompt`` (without the prompt); options as in :func:`stream_text`."""
        return "".join(stream_text(run, prompt, max_new_tokens, **kw))

    def respond(self, run: Run, values: dict[str, Any]) -> Iterator[str]:
        """Echo the prompt, then stream the continuation (``--chat``: the reply to the prompt as a user message)."""
        prompt = values["prompt"]
        if values["chat"]:
            if not getattr(run.tokenizer, "chat_template", None):
                raise RunError(f"{run.path} has no chat template (only imported chat models have one)")
            from ..data.chats import render_chat

            prompt = render_chat(run.tokenizer, [{"role": "user", "content": values["prompt"]}], where=str(run.path))
        else:
            yield prompt
        yield from stream_text(run, prompt, values["max_new_tokens"], temperature=values["temperature"],
                               top_k=values["top_k"], top_p=values["top_p"], seed=values["seed"],
                               use_cache=not values["no_cache"], quantize=values["quantize"],
                               compile=False if values["no_compile"] else None)
        yield "\n"

    def draw(self, run: Run, out_dir: Path, **options) -> list[Path]:
        """``token_attention.png``: causal self-attention over ``--text``, per layer and head."""
        from ..viz.language import language_viz

        return language_viz(run, out_dir, **options)

    def panel(self, run: Run, log) -> list[tuple[str, str]]:
        from ..viz.report.language import language_panel

        return language_panel(run, log)

    def examples(self, run: Run, directory: Path) -> dict[str, Any]:
        """The first tokens of the run's validation split, as a prompt."""
        val = run.data.held_out(run.tokenizer, run.model.config.block_size)
        return {"prompt": run.tokenizer.decode(val[:8].tolist()) or "\n"}

    def evaluate(self, run: Run, data: str | None) -> dict[str, Any]:
        """``tokennet eval`` of an imported language model: loss and perplexity on the text file ``data``."""
        if data is None:
            raise RunError(f"{run.path} is an imported checkpoint with no held-out split of its own: give a text "
                           "file to measure its loss and perplexity on")
        p = Path(data)
        if not p.is_file():
            raise RunError(f"{data}: no such file")
        metrics = self.evaluate_text(run, p.read_text(encoding="utf-8", errors="replace"))
        if metrics["truncated"]:
            log.warning("%s is longer than 262,144 tokens: evaluated on its first 262,144", data)
        return metrics

    @verb
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
