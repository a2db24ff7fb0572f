"""The language-model task: continue a prompt, token by token, over the KV cache; pictures and panel."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from .. import step_store
from ..errors import ConfigError, RunError
from ..layers import quantize as quantization
from ..run import Run
from ..sampling import CompiledStep, compile_mode, stream
from ..serve.drafting import check_speculation
from ..speculative import (
    SPECULATIVE_MODES,
    ModelDrafter,
    NgramDrafter,
    SpeculationStats,
    stream_speculative,
)
from ..viz.explore.text import LanguageExplorer
from . import CausalLM
from .base import HELP, OPTIONS, Input, Option, Task, register_task, verb
from .example_files import Example, take

__all__ = ["LanguageModel", "stream_text", "generate_batch", "check_speculation"]

log = logging.getLogger(__name__)


def stream_text(run: Run, prompt: str, max_new_tokens: int = 200, *, temperature: float = 0.8,
                top_k: int | None = None, top_p: float | None = None, seed: int = 0,
                use_cache: bool = True, quantize: str = "auto", compile: bool | None = None,
                speculative: str = "off", draft: str | Path | Run | None = None, draft_tokens: int = 8,
                stats: SpeculationStats | None = None, prebuild: bool = False) -> Iterator[str]:
    """Yield the continuation of ``prompt`` as printable pieces of text, as the tokens come.

    A byte-level token may end inside a UTF-8 character: a piece is yielded only once it decodes
    cleanly, and whatever is left is yielded at the end. ``quantize`` (``"auto"``, ``"none"``, ``"bf16"``, ``"int8"``,
    ``"int4"``)
    decodes with a low-precision copy of the model's linear layers and head, made for this call (see
    :func:`tokennet.sampling.generate`). ``compile``: decode with the compiled step (None, the default: where the
    steps ahead repay it, :class:`tokennet.sampling.CompilePlan`; True always, False never; eager with a note where
    it does not compile; see :func:`tokennet.sampling.stream`).

    ``speculative`` (:mod:`tokennet.speculative`): ``"off"`` (the default), ``"ngram"`` (drafts looked up in the
    prompt and the text so far) or ``"draft"`` (drafts from ``draft``, a run directory or :class:`Run` with the
    same tokenizer; giving ``draft`` alone implies ``"draft"``), up to ``draft_tokens`` drafted tokens a round.
    Lossless: greedy text is plain decoding's, sampled text is distributed as plain sampling's (not the same draws
    for a seed). ``stats`` (a :class:`~tokennet.speculative.SpeculationStats`) is filled in as decoding goes.
    ``prebuild`` (``tokennet generate`` sets it): where this call decoded eagerly and no compiled step is kept for the
    run, start a builder at the lowest priority so the next process decodes compiled (:func:`_build_for_later`).
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
    generator = torch.Generator(device=dev).manual_seed(seed)
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, generator=generator, quantize=quantize,
                    compile=compile, stop=getattr(tok, "stop_ids", None))  # imported tokenizers: their end-of-turn
    idx = torch.tensor([ids], device=dev)
    if speculative == "off" and draft is None:
        tokens = stream(model, idx, max_new_tokens, use_cache=use_cache, **sampling)
    else:
        helper = check_speculation(run, speculative, draft, draft_tokens, use_cache)
        tokens = _speculative_tokens(run, idx, max_new_tokens, helper, draft_tokens, stats, sampling)
    new: list[int] = []
    shown = ""
    for nxt in tokens:
        new.append(int(nxt[0]))
        text = tok.decode_continuation(new)
        if not text.endswith("\ufffd"):
            yield text[len(shown):]
            shown = text
    rest = tok.decode_continuation(new)[len(shown):]
    if rest:
        yield rest
    if use_cache and prebuild:
        _build_for_later(run, quantize, compile)


def _build_for_later(run: Run, quantize: str, compile: bool | None) -> None:
    """Where this call decoded eagerly because a compilation would not have paid (:class:`~tokennet.sampling.
    CompilePlan`) and no compiled step is kept for the run on this machine, start a builder at the lowest priority
    (:func:`tokennet.serve.prebuild.spawn`): the next ``generate`` of the run loads it and decodes compiled from its
    first token. ``TOKENNET_PREBUILD=0`` turns this off."""
    if compile_mode(compile) != "auto" or os.environ.get("TOKENNET_PREBUILD", "1") == "0" or run.path is None:
        return
    net = quantization.decoding_copy(run.model, quantization.resolve_mode(run.model, quantize))
    artifact = step_store.Artifact(CompiledStep.__name__, "B1", net)  # what a step compiled here would have kept
    if artifact.present():
        return
    from ..serve import prebuild

    if prebuild.spawn(run.path, "one", quantize, artifact) is not None:
        log.info("building the compiled decoding step once for this run and machine, in a process of its own at the "
                 "lowest priority (its log: %s); later generates of this run load it where it pays "
                 "(TOKENNET_PREBUILD=0: never)", artifact.path.with_suffix(".log"))


def _speculative_tokens(run: Run, idx: torch.Tensor, max_new_tokens: int, helper: Run | None, draft_tokens: int,
                        stats: SpeculationStats | None, sampling: dict) -> Iterator[torch.Tensor]:
    """:func:`~tokennet.speculative.stream_speculative` for :func:`stream_text` with n-gram drafts (``helper``
    None) or the draft run's; one line in the log says which mode runs, one at the end the acceptance rate."""
    stats = SpeculationStats() if stats is None else stats
    if helper is None:
        drafter = NgramDrafter()
        log.info("speculative decoding: n-gram drafts from the prompt and the text so far, up to %d a round",
                 draft_tokens)
    else:
        drafter = ModelDrafter(helper.model, run.model.config.vocab_size, temperature=sampling["temperature"],
                               top_k=sampling["top_k"], top_p=sampling["top_p"], generator=sampling["generator"],
                               quantize=sampling["quantize"], compile=sampling["compile"])
        log.info("speculative decoding: drafts from %s, up to %d a round", helper.path, draft_tokens)
    yield from stream_speculative(run.model, idx, max_new_tokens, drafter=drafter, draft_tokens=draft_tokens,
                                  stats=stats, **sampling)
    log.info("speculative decoding: %s", stats.summary())


def generate_batch(run: Run, prompts: list[str], max_new_tokens: int = 200, *, temperature: float = 0.8,
                   top_k: int | None = None, top_p: float | None = None, seed: int = 0, use_cache: bool = True,
                   quantize: str = "auto", max_batch: int = 16, compile: bool | None = None) -> list[str]:
    """The continuations of several prompts, decoded together by the server's engine (:mod:`tokennet.serve.engine`).

    Prompts of different lengths share one batched forward per decoding step (continuous batching: each
    sequence at its own position, with its own key mask; no padding), up to ``max_batch`` at once; the others
    wait for a free row. Greedy decoding (``temperature=0``) gives each prompt the text the one-prompt call gives;
    sampled, each prompt draws from its own generator seeded ``seed`` (so its text does not depend on what else
    is in the batch, though it is not the one-prompt call's draw). Each prompt plus its new tokens must fit in
    the model's context: a longer prompt is cut to its last ``block_size − max_new_tokens`` tokens. ``use_cache``
    is accepted for the one-prompt signature's sake (the engine always decodes over its cache). ``compile``: the
    engine's compiled decoding step (None, the default: on unless ``TOKENNET_COMPILE=0``; False: eager).

    Returns:
        One text per prompt, in the prompts' order (each without its prompt).
    """
    import threading

    from ..serve.engine import Engine, SamplingParams, Sequence

    tok = run.tokenizer
    if tok is None:
        raise RunError(f"{run.path} has no tokenizer.json: a language model run needs one to read the prompt")
    if max_new_tokens < 1:
        raise RunError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not all(isinstance(entry, str) for entry in prompts):
        raise RunError("run.generate takes a prompt or a list of prompts (strings)")
    if not prompts:
        return []
    block = run.model.config.block_size
    keep = block - max_new_tokens
    if keep < 1:
        raise RunError(f"max_new_tokens={max_new_tokens} leaves no room for a prompt in the model's context of {block}")
    params = dict(max_tokens=max_new_tokens, temperature=float(temperature), top_k=int(top_k or 0),
                  top_p=1.0 if top_p is None else float(top_p), stop_ids=list(getattr(tok, "stop_ids", None) or []),
                  seed=seed)
    texts: list[list[str]] = [[] for _ in prompts]
    errors: list[str | None] = [None] * len(prompts)
    left = [len(prompts)]
    done = threading.Condition()

    def emit_to(i: int):
        def emit(ev) -> None:
            texts[i].append(ev.text)
            if ev.finish_reason is not None:
                with done:
                    errors[i] = ev.error if ev.finish_reason == "error" else None
                    left[0] -= 1
                    done.notify_all()
        return emit

    seqs = []
    for i, prompt in enumerate(prompts):
        ids = tok.encode(prompt) or [tok.bos_id]
        if len(ids) > keep:
            log.warning("prompt %d is %d tokens: with %d new tokens in a context of %d, only its last %d are read",
                        i, len(ids), max_new_tokens, block, keep)
            ids = ids[-keep:]
        seqs.append(Sequence(ids, SamplingParams(**params), emit_to(i)))
    engine = Engine(run.model, tok, max_batch=max(1, min(max_batch, len(prompts))), seed=seed,
                    quantize=quantize, compile=compile).start()
    try:
        engine.submit_all(seqs)
        with done:
            while left[0]:
                done.wait()
    finally:
        engine.stop()
    bad = [(i, err) for i, err in enumerate(errors) if err is not None]
    if bad:
        raise RunError(f"generating for prompt {bad[0][0]} failed: {bad[0][1]}")
    return ["".join(t) for t in texts]


PROMPT = Input("prompt", HELP["prompt"], file=False, required=False, default="\n")

SPECULATIVE = (
    Option("speculative", "language models: speculative decoding, lossless (greedy text is plain decoding's; sampled "
           "text is distributed as plain sampling's, by the rejection rule of Leviathan et al. 2023): ngram drafts "
           "tokens by looking up the last few tokens' most recent earlier occurrence in the prompt and the text so "
           "far (fast when the output repeats its input: rewriting, editing, quoting); draft drafts them with "
           "--draft RUN; the target checks all drafts in one forward. The draft length adapts, and drafts are "
           "verified only while the tokens they are expected to add repay the verification's measured cost (drafts "
           "that fail decode at plain speed). stderr names the mode and, at the end, the acceptance "
           "rate. Default off", str, "off", choices=SPECULATIVE_MODES),
    Option("draft", "language models: the draft run for --speculative draft (implies it): a smaller language-model "
           "run with the same tokenizer", str, metavar="RUN"),
    Option("draft_tokens", "language models, with --speculative: the most tokens drafted a round, 1 to the "
           "context − 1 (default 8; the number drafted adapts below it)", int, 8, metavar="K"),
)


def _compile_choice(values: dict) -> bool | None:
    """``--compile`` / ``--no-compile`` as :func:`tokennet.sampling.stream`'s ``compile`` (neither: None, auto)."""
    if values.get("compile") and values.get("no_compile"):
        raise ConfigError("--compile and --no-compile contradict each other; give one")
    return True if values.get("compile") else False if values.get("no_compile") else None


def _in_reading_direction(run: Run, text: str) -> str:
    """``text`` as the run read its corpus: backwards for a character model trained with ``reverse=true``.

    Raises:
        RunError: a run that read subword tokens backwards (reversing the characters would not reverse its tokens).
    """
    if not getattr(run.data, "reverse", False):
        return text
    if getattr(run.tokenizer, "kind", None) != "char":
        raise RunError(f"{run.path} was trained on its tokens read backwards (reverse=true): evaluate it on its own "
                       "held-out text (tokennet eval without --stride), or with --data and no --stride")
    return text[::-1]


@register_task
class LanguageModel(Task):
    """A causal language model (GPT): ``run.generate(prompt, max_new_tokens, temperature=..., ...)``."""

    name = "language model"
    kind = "language-model"
    families = ("gpt",)
    viz_uses = ("text", "layer", "head")
    explorer = LanguageExplorer
    protocol = CausalLM
    inputs = (PROMPT,)
    options = tuple(OPTIONS[k] for k in ("max_new_tokens", "temperature", "top_k", "top_p", "seed", "no_cache",
                                         "no_compile", "compile", "quantize", "chat")) + SPECULATIVE

    @verb
    def generate(self, run: Run, prompt: str | list[str] = "\n", max_new_tokens: int = 200, *,
                 include_prompt: bool = False, **kw) -> str | list[str]:
        """The continuation of ``prompt``; options as in :func:`stream_text`.

        ``include_prompt=True`` puts the prompt in front, as ``tokennet generate --prompt`` prints it: the command
        prints ``run.generate(prompt, n, include_prompt=True, ...)`` and a newline, for the same options and seed.
        The default leaves the prompt out (the continuation alone, as before). A list of prompts is decoded in one
        batch by the serving engine (:func:`generate_batch`, which also takes ``max_batch``): one text per prompt.
        """
        if isinstance(prompt, (list, tuple)):
            if kw.get("speculative", "off") != "off" or kw.get("draft") is not None:
                raise RunError("speculative decoding continues one prompt at a time: give one prompt")
            texts = generate_batch(run, list(prompt), max_new_tokens, **kw)
            return [given + text for given, text in zip(prompt, texts, strict=True)] if include_prompt else texts
        text = "".join(stream_text(run, prompt, max_new_tokens, **kw))
        return prompt + text if include_prompt else text

    def respond(self, run: Run, values: dict[str, Any]) -> Iterator[str]:
        """Echo the prompt, then stream the continuation (``--chat``: the reply to the prompt as a user message)."""
        prompt, draft = values["prompt"], values["draft"]
        compile = _compile_choice(values)  # refused before the prompt is echoed
        if values["speculative"] != "off" or draft is not None:  # refused before the prompt is echoed
            draft = check_speculation(run, values["speculative"], draft, values["draft_tokens"], not values["no_cache"])
        if values["chat"]:
            if not getattr(run.tokenizer, "chat_template", None):
                raise RunError(f"{run.path} has no chat template (only imported chat models have one)")
            from ..tokens.chat import render_chat

            prompt = render_chat(run.tokenizer, [{"role": "user", "content": values["prompt"]}], where=str(run.path))
        else:
            yield prompt
        yield from stream_text(run, prompt, values["max_new_tokens"], temperature=values["temperature"],
                               top_k=values["top_k"], top_p=values["top_p"], seed=values["seed"],
                               use_cache=not values["no_cache"], quantize=values["quantize"],
                               compile=compile, speculative=values["speculative"],
                               draft=draft, draft_tokens=values["draft_tokens"], prebuild=True)
        yield "\n"

    def draw(self, run: Run, out_dir: Path, **options) -> list[Path]:
        """``token_attention.png``: causal self-attention over ``--text``, per layer and head."""
        from ..viz.language import language_viz

        return language_viz(run, out_dir, **options)

    def panel(self, run: Run, log) -> list[tuple[str, str]]:
        from ..viz.report.language import language_panel

        return language_panel(run, log)

    def examples(self, run: Run, directory: Path, count: int = 1) -> list[Example]:
        """``prompt-K.txt``: prompts of up to 16 tokens spread over the validation split (each from the start of a
        line where one begins nearby), labelled with the 24 tokens that follow it there."""
        block_size, tokenizer = run.model.config.block_size, run.tokenizer
        val = run.data.held_out(tokenizer, block_size).tolist()
        prompt, follows = min(16, max(1, block_size // 2)), 24
        spacing = len(val) // count
        out = []
        for k in take(count, len(val) // (prompt + follows), run.path):
            start = next((j for j in range(k * spacing, k * spacing + spacing - prompt - follows)
                          if j > 0 and tokenizer.decode(val[j - 1:j]).endswith("\n")), k * spacing)
            text = tokenizer.decode(val[start:start + prompt]) or "\n"
            path = Path(directory) / f"prompt-{k}.txt"
            path.write_text(text, encoding="utf-8")
            label = tokenizer.decode(val[start + prompt:start + prompt + follows])
            out.append(Example({"prompt": text}, label, (path,)))
        return out

    def evaluate(self, run: Run, data: str | None, *, stride: int | None = None) -> dict[str, Any]:
        """``tokennet eval`` of a language model on the text file ``data``: loss, perplexity and bits per byte.

        ``stride`` (``tokennet eval --stride``): the sliding-window evaluation of :meth:`evaluate_text`
        (None: non-overlapping windows).
        """
        if data is None:
            raise RunError(f"{run.path} is an imported checkpoint with no held-out split of its own: give a text "
                           "file to measure its loss and perplexity on")
        path = Path(data)
        if not path.is_file():
            raise RunError(f"{data}: no such file")
        text = _in_reading_direction(run, path.read_text(encoding="utf-8", errors="replace"))
        metrics = self.evaluate_text(run, text, stride=stride)
        if metrics["truncated"]:
            log.warning("%s is longer than 262,144 tokens: evaluated on its first 262,144", data)
        return metrics

    @verb
    def evaluate_text(self, run: Run, text: str, *, window: int = 1024, stride: int | None = None,
                      max_tokens: int = 262_144, batch_size: int = 8) -> dict[str, Any]:
        """Next-token loss, perplexity and bits per byte of the model on ``text`` (e.g. a run on a file).

        The text is tokenized with the run's tokenizer (with the special tokens it adds itself) into
        ``x_0 … x_{n-1}``; every token after the first is predicted exactly once. The model reads windows of
        ``w = min(window, block_size)`` tokens starting every ``stride`` tokens (``s``, default ``w``):
        window k reads ``x_{ks} … x_{ks+w-1}`` and scores only the targets no earlier window scored, so each
        of them is predicted from at least ``w − s`` tokens before it (Hugging Face's sliding-window
        perplexity, https://huggingface.co/docs/transformers/perplexity, with its ``max_length`` = w + 1).
        ``s = w``: non-overlapping windows; a smaller ``s`` gives more context and costs ``w / s`` times the
        compute.

            loss = (1/(n−1)) Σ_{t≥1} −ln p(x_t | x_{<t} in its window),   perplexity = exp(loss)
            bits_per_byte = Σ_t −log₂ p(x_t | …) / (UTF-8 bytes of the text)

        Bits per byte does not depend on how a tokenizer cuts the text, so models with different
        vocabularies compare on it. At most ``max_tokens`` tokens are read (``truncated`` says whether the
        text was longer; the bytes are then those of the tokens read).
        """
        model, tok = run.model, run.tokenizer
        if tok is None:
            raise RunError(f"{run.path} has no tokenizer.json: evaluating on text needs one")
        ids = tok.encode(text)  # as the source's tokenizer reads it (Llama's: with a leading <s>)
        truncated = len(ids) > max_tokens
        ids = ids[:max_tokens]
        win = min(window, model.config.block_size)
        step = win if stride is None else stride
        if not 1 <= step <= win:
            raise RunError(f"the stride must be between 1 and the window of {win} tokens, got {step}")
        if len(ids) < 2:
            raise RunError("the text is shorter than two tokens: nothing to predict")
        n_bytes = len((tok.decode(ids) if truncated else text).encode("utf-8"))
        # (begin, first): window from x_begin; its targets x_{begin+1+j} count for j >= first (not scored before)
        windows, scored = [], 0  # scored: the index of the last target scored so far
        for begin in range(0, len(ids) - 1, step):
            windows.append((begin, scored - begin))
            scored = min(begin + win, len(ids) - 1)
            if scored == len(ids) - 1:
                break
        dev = run.device
        total, count = 0.0, 0
        with torch.no_grad():
            for i in range(0, len(windows), batch_size):
                chunk = windows[i:i + batch_size]
                rows = [ids[begin:begin + win + 1] for begin, _ in chunk]
                n = max(len(seq) for seq in rows)
                x = torch.full((len(rows), n), -1, dtype=torch.long)
                for row_idx, row in enumerate(rows):
                    x[row_idx, :len(row)] = torch.tensor(row)
                inp, tgt = x[:, :-1].clamp(min=0), x[:, 1:].clone()  # (B, n-1); -1 = padding, ignored
                for row_idx, (_, first) in enumerate(chunk):
                    tgt[row_idx, :first] = -1  # scored by an earlier window, with less context
                logits = model(inp.to(dev)).logits.float()
                tgt = tgt.to(dev)
                loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=-1,
                                                         reduction="sum")
                total += float(loss)
                count += int((tgt >= 0).sum())
        mean = total / count
        return {"loss": mean, "perplexity": math.exp(mean), "bits_per_byte": total / math.log(2) / n_bytes,
                "tokens": count, "bytes": n_bytes, "window": win, "stride": step, "truncated": truncated}
