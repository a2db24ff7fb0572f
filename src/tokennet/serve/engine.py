"""Continuous batching: every sequence being served advances by one token per step, in one batched forward.

The engine owns the model and one thread that loops (the scheduling of vLLM and Orca, Yu et al. 2022,
https://www.usenix.org/conference/osdi22/presentation/yu):

1. **admit**: waiting sequences take free rows of the shared cache (:mod:`.cache`) and are prefilled, one
   prompt per forward, until the rows or this step's prompt-token budget run out; a prefill gives the
   sequence's first new token;
2. **decode**: the B running sequences feed their last token together, ``(B, 1)`` at their own positions
   with their own key masks, so one forward reads every weight once for B tokens (a step costs about as
   much for 16 sequences as for one: decoding is memory-bound);
3. **retire**: a sequence that hit a stop token, a stop string or its token budget — or whose client
   went away — leaves, and its row is refilled by the last one.

Sequences join and leave between steps, so a short request never waits for a long one to end.

Each new token is turned into text at once (a token that ends inside a UTF-8 character waits for the
next), checked against the stop strings (text that could be the start of one is held back), and handed
to the sequence's ``emit`` callback, which a server uses to wake the waiting request. Greedy decoding
(temperature 0) gives the tokens :func:`tokennet.sampling.generate` gives for the prompt alone.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..layers import quantize as quantization
from .cache import SlotCaches

__all__ = ["Engine", "Sequence", "SamplingParams", "sample_rows"]

log = logging.getLogger(__name__)


@dataclass
class SamplingParams:
    """How one sequence chooses its tokens and when it stops.

    Args:
        max_tokens: new tokens at most.
        temperature: 0 = greedy; else logits are divided by it.
        top_p: nucleus sampling (1 = off); top_k: the k most likely tokens only (0 = off).
        stop: strings that end the text (not included in it).
        stop_ids: token ids that end the text (not included), e.g. the tokenizer's end of turn.
        seed: a seed of this sequence's own generator (None: the engine's).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: list[str] = field(default_factory=list)
    stop_ids: list[int] = field(default_factory=list)
    seed: int | None = None


@dataclass
class Event:
    """What the engine tells a sequence's owner: new ``text``; at the end, ``finish_reason`` (and ``error``)."""

    text: str = ""
    finish_reason: str | None = None  # "stop", "length", "cancelled" or "error"
    error: str | None = None


class Sequence:
    """One request's prompt, sampling settings and progress; ``emit(event)`` is called from the engine's thread."""

    def __init__(self, prompt: list[int], params: SamplingParams, emit: Callable[[Event], None]):
        if not prompt:
            raise ValueError("a sequence needs at least one prompt token")
        self.prompt, self.params, self.emit = list(prompt), params, emit
        self.generated: list[int] = []
        self.text = ""  # decoded text of ``generated`` (cleanly decodable part)
        self.sent = 0  # characters of ``text`` already emitted
        self.finish_reason: str | None = None
        self.cancelled = False
        self.generator = None if params.seed is None else torch.Generator().manual_seed(params.seed)
        self.next_token: int | None = None  # sampled, not yet fed to the model

    @property
    def length(self) -> int:
        """Tokens in the cache: the prompt and every generated token fed back so far."""
        return len(self.prompt) + max(0, len(self.generated) - 1)


def sample_rows(logits: Tensor, params: list[SamplingParams], generators: list[torch.Generator | None],
                default: torch.Generator | None = None) -> Tensor:
    """Next tokens ``(B,)`` from last-position logits ``(B, V)``, each row with its own settings.

    Greedy rows take the argmax (as :func:`tokennet.sampling.sample_next` with temperature 0); the others
    sample from ``softmax(logits / T)`` restricted to the top k and the nucleus of mass top p.
    """
    out = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    greedy = [i for i, p in enumerate(params) if p.temperature == 0]
    if greedy:
        out[greedy] = logits[greedy].float().argmax(dim=-1)
    rest = [i for i, p in enumerate(params) if p.temperature != 0]
    if not rest:
        return out
    lg = logits[rest].float() / torch.tensor([params[i].temperature for i in rest], device=logits.device)[:, None]
    top_k = torch.tensor([params[i].top_k for i in rest], device=logits.device)
    top_p = torch.tensor([params[i].top_p for i in rest], device=logits.device)
    if bool((top_k > 0).any()) or bool((top_p < 1).any()):
        sorted_lg, order = lg.sort(dim=-1, descending=True)  # (R, V)
        rank = torch.arange(lg.shape[-1], device=lg.device)
        drop = (top_k[:, None] > 0) & (rank[None, :] >= top_k[:, None])
        probs = torch.softmax(sorted_lg.masked_fill(drop, float("-inf")), dim=-1)
        # Drop a token when the ones ranked above it already reach top_p (the first always stays).
        drop |= (probs.cumsum(dim=-1) - probs) >= top_p[:, None]
        lg = torch.full_like(lg, float("-inf")).scatter(-1, order, sorted_lg.masked_fill(drop, float("-inf")))
    probs = torch.softmax(lg, dim=-1)
    for j, i in enumerate(rest):
        g = generators[i] if generators[i] is not None else default
        out[i] = torch.multinomial(probs[j : j + 1], 1, generator=g)[0, 0]
    return out


class Engine:
    """Serve a causal language model to many sequences at once (see the module docstring).

    Args:
        model: a causal LM with ``forward_features(idx, caches=, positions=, mask=)``, ``forward_head``
            and a config with ``block_size``, ``num_layers``, ``num_heads``, ``dim`` (tokennet's GPT).
        tokenizer: turns generated ids into text (``decode``).
        max_batch: the most sequences decoded together (rows of the shared cache).
        context: the longest sequence (prompt + new tokens) served; default the model's context.
        prefill_tokens: prompt tokens prefilled per step at most (at least one prompt is), so arrivals do
            not stall the running sequences for long.
        seed: the seed of the generator shared by sequences without their own.
        quantize: ``"none"``, ``"bf16"``, ``"int8"`` or ``"int4"``: decode with that copy of the model, as
            :func:`tokennet.sampling.generate` does (:func:`~tokennet.layers.quantize.decoding_copy`; the model
            itself is not modified).
    """

    def __init__(self, model: nn.Module, tokenizer, *, max_batch: int = 16, context: int | None = None,
                 prefill_tokens: int = 2048, seed: int = 0, quantize: str = "none"):
        c = model.config
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.model, self.tokenizer = model.eval(), tokenizer
        self.context = min(context or c.block_size, c.block_size)
        self.max_batch, self.prefill_tokens = max_batch, prefill_tokens
        p = next(model.parameters())
        self.device = p.device
        quantization.check_mode(quantize)
        self.quantize = quantize
        self.net = quantization.decoding_copy(model, quantize)  # what tokennet.sampling.generate decodes with
        with torch.no_grad():  # the activations' dtype (bf16 for the bf16 copy): the cache holds keys of it
            act = self.net.tok_emb(torch.zeros(1, 1, dtype=torch.long, device=self.device)).dtype
        heads = c.num_kv_heads or c.num_heads
        self.caches = SlotCaches(c.num_layers, heads, c.dim // c.num_heads, max_batch, self.context,
                                 device=self.device, dtype=act)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._cv = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.steps = 0  # decode steps taken (for tests and statistics)
        self.batch_sizes: list[int] = []  # rows of each decode step, the last 1000
        self.finished: Counter[str] = Counter()  # sequences ended, by finish reason

    # -- the caller's side (any thread) ------------------------------------------------------------
    def start(self) -> Engine:
        self._thread = threading.Thread(target=self._loop, name="tokennet-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 30.0) -> None:
        """Finish every sequence already submitted, then end the thread (a drain)."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def submit(self, seq: Sequence) -> None:
        if len(seq.prompt) + seq.params.max_tokens > self.context:
            raise ValueError(f"{len(seq.prompt)} prompt tokens + {seq.params.max_tokens} new tokens exceed the "
                             f"context of {self.context}")
        with self._cv:
            if self._stop:
                raise RuntimeError("the engine is shutting down")
            self.waiting.append(seq)
            self._cv.notify_all()

    def cancel(self, seq: Sequence) -> None:
        """Stop a sequence (its client went away); its row is freed before the next step."""
        seq.cancelled = True
        with self._cv:
            self._cv.notify_all()

    @property
    def load(self) -> dict[str, int]:
        return {"running": len(self.running), "waiting": len(self.waiting)}

    # -- the engine's thread -----------------------------------------------------------------------
    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self._cv:
                while not (self.waiting or self.running or self._stop):
                    self._cv.wait()
                if self._stop and not (self.waiting or self.running):
                    return
            try:
                with torch.inference_mode():
                    self._retire_cancelled()
                    self._admit()
                    if self.running:
                        self._decode()
            except Exception as e:  # noqa: BLE001 - a bug must not take the server down: fail the batch, go on
                log.exception("decoding step failed")
                for s in [*self.running]:
                    self._finish(s, "error", error=f"internal error: {type(e).__name__}: {e}")
                self.running.clear()

    def _retire_cancelled(self) -> None:
        with self._cv:
            gone = [s for s in self.waiting if s.cancelled]
            for s in gone:
                self.waiting.remove(s)
        for s in gone:
            self._finish(s, "cancelled")
        for i in reversed(range(len(self.running))):
            if self.running[i].cancelled:
                self._remove(i, "cancelled")

    def _admit(self) -> None:
        budget = self.prefill_tokens
        while len(self.running) < self.max_batch:
            with self._cv:
                if not self.waiting or (budget < len(self.waiting[0].prompt) and budget < self.prefill_tokens):
                    return
                seq = self.waiting.popleft()
            budget -= len(seq.prompt)
            row = len(self.running)
            self.caches.plan_prefill(row, len(seq.prompt))
            ids = torch.tensor([seq.prompt], device=self.device)  # (1, P)
            h = self.net.forward_features(ids, caches=self.caches.layers)  # (1, P, D)
            logits = self.net.forward_head(h[:, -1:])[:, -1]  # (1, V)
            self.running.append(seq)
            self._accept(row, int(sample_rows(logits, [seq.params], [seq.generator], self.generator)[0]))

    def _decode(self) -> None:
        rows = self.running
        B = len(rows)
        feed = torch.tensor([[s.next_token] for s in rows], device=self.device)  # (B, 1)
        lengths = torch.tensor([s.length for s in rows], device=self.device)  # (B,): tokens already cached
        mask = self.caches.plan_decode(lengths)  # (B, 1, 1, Nk)
        h = self.net.forward_features(feed, caches=self.caches.layers, positions=lengths[:, None], mask=mask)
        logits = self.net.forward_head(h)[:, -1]  # (B, V)
        nxt = sample_rows(logits, [s.params for s in rows], [s.generator for s in rows], self.generator).tolist()
        self.steps += 1
        self.batch_sizes = self.batch_sizes[-999:] + [B]
        for i in reversed(range(B)):  # from the end: a retired row is refilled by the last, already handled
            self._accept(i, nxt[i])

    def _accept(self, row: int, token: int) -> None:
        """Take a sequence's newly sampled token: stop, or turn it into text and emit it."""
        s = self.running[row]
        p = s.params
        if token in p.stop_ids:
            self._flush(s, final=True)
            self._remove(row, "stop")
            return
        s.generated.append(token)
        s.next_token = token
        text = self.tokenizer.decode(s.generated)
        if not text.endswith("\ufffd"):  # a token that ends inside a UTF-8 character waits for the next one
            s.text = text
        for stop in p.stop:
            at = s.text.find(stop, max(0, s.sent - len(stop)))
            if at >= 0:
                s.text = s.text[:at]
                self._flush(s, final=True)
                self._remove(row, "stop")
                return
        if len(s.generated) >= p.max_tokens:
            s.text = self.tokenizer.decode(s.generated)
            self._flush(s, final=True)
            self._remove(row, "length")
            return
        self._flush(s, final=False)

    def _flush(self, s: Sequence, *, final: bool) -> None:
        """Emit the text not sent yet, holding back a tail that could begin a stop string."""
        end = len(s.text)
        if not final:
            for stop in s.params.stop:
                for k in range(min(len(stop) - 1, end - s.sent), 0, -1):
                    if s.text.endswith(stop[:k]):
                        end = min(end, len(s.text) - k)
                        break
        if end > s.sent:
            piece = s.text[s.sent : end]
            s.sent = end
            s.emit(Event(text=piece))

    def _remove(self, row: int, reason: str) -> None:
        s = self.running[row]
        last = len(self.running) - 1
        if row != last:
            self.caches.move(last, row, self.running[last].length)
            self.running[row] = self.running[last]
        self.running.pop()
        self._finish(s, reason)

    def _finish(self, s: Sequence, reason: str, *, error: str | None = None) -> None:
        s.finish_reason = reason
        self.finished[reason] += 1
        try:
            s.emit(Event(finish_reason=reason, error=error))
        except Exception:  # noqa: BLE001 - the owner's callback must not stop the engine
            log.exception("a sequence's emit callback failed")

    def status(self) -> dict[str, Any]:
        return {**self.load, "max_batch": self.max_batch, "context": self.context, "steps": self.steps,
                "quantize": self.quantize}
