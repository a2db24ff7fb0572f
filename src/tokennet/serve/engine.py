"""Continuous batching: every sequence being served advances by one token per step, in one batched forward.

The engine owns the model and one thread that loops (the scheduling of vLLM and Orca, Yu et al. 2022,
https://www.usenix.org/conference/osdi22/presentation/yu):

1. **admit**: waiting sequences take free rows of the shared cache (:mod:`.cache`) and are prefilled, one
   prompt per forward, until the rows or this step's budget of computed prompt tokens run out (a prefix copied
   from the prefix cache is not computed, and not counted); a prefill gives the
   sequence's first new token;
2. **decode**: the B running sequences feed their last token together, ``(B, 1)`` at their own positions
   with their own key masks, so one forward reads every weight once for B tokens (a step costs about as
   much for 16 sequences as for one: decoding is memory-bound);
3. **retire**: a sequence that hit a stop token, a stop string or its token budget — or whose client
   went away — leaves, and its row is refilled by the last one.

Sequences join and leave between steps, so a short request never waits for a long one to end, and a free
row goes to the request that holds the fewest rows (a small request queued behind one of hundreds of
prompts gets the next row that frees; :meth:`Engine._next`).

**One sequence's failure is its own.** Each row is sampled on its own terms (a row whose probabilities are
not finite fails, the others are sampled); a temperature below :data:`SAMPLING_EPS` is greedy, as in vLLM,
since ``logits / T`` would overflow. A prefill that raises (out of memory on a long prompt, a cache that
cannot grow) fails that sequence alone. When a batched decoding forward raises, the step is retried one
row at a time: the rows whose own forward raises fail, the others take the tokens of their own forward
and go on batched from the next step (a persistent fault costs one slow step; a transient one, such as
an out-of-memory of the whole batch, fails nobody). When the cache cannot grow for the longest rows, those
rows fail and the rest go on at the old capacity. Every failure ends its sequence with an ``"error"``
event, so every client is answered, and the drain (:meth:`Engine.stop`) ends with every sequence finished; the
event says whose failure it is (``Event.fault``): the request's (:class:`RequestFault`, e.g. a grammar no token
can continue), the engine's unavailability (shutting down), or the server's own.

Each new token is turned into text at once (a token that ends inside a UTF-8 character waits for the
next), checked against the stop strings (the earliest match of any of them ends the text; text that could
be the start of one is held back), and handed
to the sequence's ``emit`` callback, which a server uses to wake the waiting request. Greedy decoding
(temperature 0) gives the tokens :func:`tokennet.sampling.generate` gives for the prompt alone.

**Prefix caching** (:class:`~tokennet.serve.cache.PrefixCache`, ``prefix_cache_mb``): a prefill first looks up
the longest run of whole cached blocks its prompt begins with (at most all but its last token, whose logits
give the first new token), copies their keys and values into its row and computes only the rest; after the
prefill the prompt's whole blocks are stored, and when a sequence ends its prompt and reply are (a chat's
next turn begins with them). The lookup happens when the prompt is prefilled, not when it is queued: a prefix
evicted while its request waits is simply not found, and the prompt is computed in full.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import ConfigError, DataError
from ..layers import quantize as quantization
from ..layers.blockquant import symbolic_rows
from ..sampling import (
    SAMPLING_EPS,
    CompiledStep,
    compile_default,
    compiled_step,
    inductor_cache_dir,
    next_token_probs,
)
from ..speculative import (
    SPECULATIVE_MODES,
    Draft,
    DraftLength,
    ModelDrafter,
    NgramDrafter,
    VerifyCost,
    accept_greedy,
    accept_sampled,
    check_draft_tokens,
    outcomes,
)
from .cache import DecodePlan, PrefixCache, SlotCache, SlotCaches

__all__ = ["Engine", "Sequence", "SamplingParams", "QueueFull", "RequestFault", "sample_rows", "SAMPLING_EPS",
           "TokenLogprob", "token_logprobs", "PREFIX_CACHE_MB", "available_memory", "RowsStep", "Speculation"]

log = logging.getLogger(__name__)

PREFIX_CACHE_MB = 256.0  # the prefix cache's default bound (tokennet serve --prefix-cache-mb)
PRIOR_ACCEPTANCE = 0.8  # a new sequence's draft acceptance estimate before the engine has judged any draft


def available_memory(device: torch.device) -> int | None:
    """Bytes free for new tensors on ``device`` now (CUDA: free device memory; CPU: the kernel's MemAvailable);
    None when it cannot be told."""
    try:
        if device.type == "cuda":
            return int(torch.cuda.mem_get_info(device)[0])
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, RuntimeError, AttributeError):
        return None


PROMPT_LOGPROBS_CHUNK = 256  # prompt positions whose logits are held at once (echo with logprobs)


class QueueFull(Exception):
    """The engine's queue of waiting sequences has no room for a request's sequences (try again later)."""


class RequestFault(DataError):
    """A sequence the engine cannot go on serving because of what its own request asked for (a grammar that no
    token of the vocabulary can continue): that sequence ends with ``Event.fault == "request"`` — the client's
    to fix, a server answers it 400 — and no traceback is logged; the other sequences go on."""


@dataclass
class SamplingParams:
    """How one sequence chooses its tokens and when it stops.

    Args:
        max_tokens: new tokens at most.
        temperature: 0 (or below :data:`SAMPLING_EPS`) = greedy; else logits are divided by it.
        top_p: nucleus sampling (1 = off); top_k: the k most likely tokens only (0 = off).
        stop: strings that end the text (not included in it).
        stop_ids: token ids that end the text (not included), e.g. the tokenizer's end of turn.
        seed: a seed of this sequence's own generator (None: the engine's).
        logprobs: None = off; k >= 0: record each new token's log probability and the k most likely tokens'
            (:class:`TokenLogprob`), from the logits the token is sampled from, before temperature, top-k/p
            and any constraint: ``log_softmax(logits)``, the model's own distribution.
        prompt_logprobs: also record each prompt token's (from the prefill's forward; the first has none).
        constraint: a grammar (:mod:`.constrained`) whose ``matcher()`` masks each step's logits to the tokens
            that keep the output valid; the sequence stops when the grammar is complete.
        speculative: ``"off"``, ``"ngram"`` or ``"draft"`` (:class:`Speculation`); None: the engine's mode. A
            constrained sequence never drafts.
        draft_tokens: the most tokens drafted a round (None: the engine's).
    """

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: list[str] = field(default_factory=list)
    stop_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    logprobs: int | None = None
    prompt_logprobs: bool = False
    constraint: Any = None
    speculative: str | None = None
    draft_tokens: int | None = None


@dataclass
class TokenLogprob:
    """One token's log probability and the ``top`` most likely tokens' ``[(id, logprob), ...]`` at its position."""

    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class Event:
    """What the engine tells a sequence's owner: new ``text``; at the end, ``finish_reason`` (and ``error``).

    ``logprobs``: the :class:`TokenLogprob` of the tokens sampled since the last event (when asked for).
    ``fault``: with an error, whose it is: ``"request"`` (the request cannot be served: :class:`RequestFault`),
    ``"unavailable"`` (the engine is shutting down or has stopped), or None (the server's own failure).
    """

    text: str = ""
    finish_reason: str | None = None  # "stop", "length", "cancelled" or "error"
    error: str | None = None
    fault: str | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)


def token_logprobs(logits: Tensor, tokens: Tensor, top: list[int]) -> list[TokenLogprob]:
    """Each row's chosen token's ``log_softmax(logits)`` and its ``top[i]`` most likely tokens.

    Shapes: logits ``(R, V)``, tokens ``(R,)``; the log-softmax is taken in float32,
    :math:`\\log p_i = z_i - \\log \\sum_j e^{z_j}`.
    """
    log_probs = torch.log_softmax(logits.float(), dim=-1)  # (R, V)
    chosen = log_probs.gather(-1, tokens.clamp(min=0)[:, None])[:, 0].tolist()  # (R,)
    k = max(top, default=0)
    vals, ids = log_probs.topk(k, dim=-1) if k else (None, None)  # (R, k)
    out = []
    for i, t in enumerate(tokens.tolist()):
        pairs = list(zip(ids[i, : top[i]].tolist(), vals[i, : top[i]].tolist())) if top[i] else []
        out.append(TokenLogprob(int(t), float(chosen[i]), pairs))
    return out


class Sequence:
    """One request's prompt, sampling settings and progress; ``emit(event)`` is called from the engine's thread."""

    def __init__(self, prompt: list[int], params: SamplingParams, emit: Callable[[Event], None], *,
                 group: object | None = None):
        if not prompt:
            raise ValueError("a sequence needs at least one prompt token")
        self.prompt, self.params, self.emit = list(prompt), params, emit
        self.group = group  # the request it belongs to: rows are shared fairly between requests (Engine._next)
        self.generated: list[int] = []
        self.text = ""  # decoded text of ``generated`` (cleanly decodable part)
        self.sent = 0  # characters of ``text`` already emitted
        self.finish_reason: str | None = None
        self.cancelled = False
        self.generator: torch.Generator | None = None  # of a seeded sequence, on the engine's device (submit)
        self.cached_tokens = 0  # prompt tokens whose keys and values came from the prefix cache
        self.next_token: int | None = None  # sampled, not yet fed to the model
        self.logprobs: list[TokenLogprob] = []  # of the sampled tokens (params.logprobs is not None)
        self.prompt_logprobs: list[TokenLogprob] = []  # of prompt[1:] (params.prompt_logprobs)
        self.logprobs_sent = 0
        self.matcher = params.constraint.matcher() if params.constraint is not None else None
        self.drafting: RowDrafting | None = None  # how it drafts, decided at its first decoding step

    @property
    def length(self) -> int:
        """Tokens in the cache: the prompt and every generated token fed back so far."""
        return len(self.prompt) + max(0, len(self.generated) - 1)


def sample_rows(logits: Tensor, params: list[SamplingParams], generators: list[torch.Generator | None],
                default: torch.Generator | None = None, *, errors: dict[int, str] | None = None) -> Tensor:
    """Next tokens ``(B,)`` from last-position logits ``(B, V)``, each row with its own settings.

    Greedy rows (temperature below :data:`SAMPLING_EPS`) take the argmax (as
    :func:`tokennet.sampling.sample_next` with temperature 0); the others sample from ``softmax(logits / T)``
    restricted to the top k and the nucleus of mass top p. A row that cannot be sampled (NaN logits,
    probabilities that are not finite) raises ``ValueError``; with ``errors`` given it is recorded there
    instead (row → message, its token −1) and the other rows are sampled as they would be without it.
    """
    B = logits.shape[0]
    out = torch.empty(B, dtype=torch.long, device=logits.device)
    bad: dict[int, str] = {}
    for i in torch.isnan(logits).any(dim=-1).nonzero().flatten().tolist():
        bad[i] = "the model's logits are NaN"
    greedy = [i for i, param in enumerate(params) if param.greedy]
    if greedy:
        out[greedy] = logits[greedy].float().argmax(dim=-1)
    rest = [i for i, param in enumerate(params) if not param.greedy and i not in bad]
    if rest:
        scaled = logits[rest].float() / torch.tensor([params[i].temperature for i in rest],
                                                     device=logits.device)[:, None]
        V = scaled.shape[-1]
        top_k = torch.tensor([params[i].top_k if 0 < params[i].top_k < V else 0 for i in rest], device=scaled.device)
        top_p = torch.tensor([params[i].top_p for i in rest], device=logits.device)
        if bool((top_k > 0).any()) or bool((top_p < 1).any()):
            sorted_lg, order = scaled.sort(dim=-1, descending=True)  # (R, V)
            rank = torch.arange(V, device=scaled.device)
            drop = (top_k[:, None] > 0) & (rank[None, :] >= top_k[:, None])
            probs = torch.softmax(sorted_lg.masked_fill(drop, float("-inf")), dim=-1)
            # Drop a token when the ones ranked above it already reach top_p (the first always stays, also for
            # a top_p that float32 rounds to 0).
            drop |= (probs.cumsum(dim=-1) - probs) >= top_p[:, None]
            drop[:, 0] = False
            kept = sorted_lg.masked_fill(drop, float("-inf"))
            scaled = torch.full_like(scaled, float("-inf")).scatter(-1, order, kept)
        probs = torch.softmax(scaled, dim=-1)  # (R, V)
        # Checked here, not left to multinomial: on CUDA its check is a device-side assert, fatal to the process.
        finite = (torch.isfinite(probs).all(dim=-1) & (probs.sum(dim=-1) > 0)).tolist()
        for j, i in enumerate(rest):
            if not finite[j]:
                bad[i] = f"the sampling probabilities are not finite (temperature {params[i].temperature:g})"
                continue
            generator = generators[i] if generators[i] is not None else default
            try:
                out[i] = torch.multinomial(probs[j : j + 1], 1, generator=generator)[0, 0]
            except RuntimeError as error:
                bad[i] = f"sampling failed: {error}"
    if bad:
        if errors is None:
            raise ValueError("; ".join(f"row {i}: {m}" for i, m in sorted(bad.items())))
        errors.update(bad)
        out[sorted(bad)] = -1
    return out


@dataclass
class Speculation:
    """The engine's speculative decoding (:mod:`tokennet.speculative`) and what it has done so far.

    ``mode``: ``"off"``, ``"ngram"`` or ``"draft"``, the default of sequences that do not choose
    (``SamplingParams.speculative``); ``draft``: the draft model's name (its run's path), None without a draft
    model; ``draft_tokens``:
    the default most tokens drafted a round. ``drafted`` and ``accepted`` count draft tokens over every sequence,
    ``verifications`` the rows verified, ``skipped`` the steps that had drafts but decoded plainly because no
    verification was expected to pay. ``cost``: what a verification of the batch costs against a plain step,
    measured over the engine's steps (:class:`~tokennet.speculative.VerifyCost`); ``acceptance``: each mode's
    acceptance over the engine's sequences, where a new sequence's estimate starts (:meth:`prior`); ``clock``: None
    verifies every draft (deterministic, for tests).
    """

    mode: str = "off"
    draft: str | None = None
    draft_tokens: int = 8
    drafted: int = 0
    accepted: int = 0
    verifications: int = 0
    skipped: int = 0
    clock: Callable[[], float] | None = time.perf_counter
    cost: VerifyCost = field(default_factory=VerifyCost)
    acceptance: dict[str, float] = field(default_factory=dict)

    def width(self, rows: int, expected: Callable[[int], float], most: int) -> int:
        """How many drafts a row a step of ``rows`` rows verifies (0: a plain step): :meth:`VerifyCost.best
        <tokennet.speculative.VerifyCost.best>`; all ``most`` without a clock."""
        return most if self.clock is None else self.cost.best(rows, expected, most)

    def prior(self, mode: str) -> float:
        """Where a new sequence's acceptance estimate starts: what this mode's drafts have scored over the engine's
        sequences so far (a moving average of every judged draft), :data:`PRIOR_ACCEPTANCE` before any."""
        return self.acceptance.get(mode, PRIOR_ACCEPTANCE)

    def observe(self, mode: str, hits: list[bool], weight: float = 0.02) -> None:
        """Fold judged drafts (True: accepted) into the mode's engine-wide acceptance."""
        for hit in hits:
            self.acceptance[mode] = (1 - weight) * self.prior(mode) + weight * float(hit)

    def status(self) -> dict[str, Any]:
        """What ``GET /health`` shows: the mode, the draft run, draft tokens and the acceptance so far."""
        return {"mode": self.mode, "draft": self.draft, "draft_tokens": self.draft_tokens, "drafted": self.drafted,
                "accepted": self.accepted, "verifications": self.verifications, "skipped": self.skipped,
                "acceptance_rate": round(self.accepted / self.drafted, 4) if self.drafted else 0.0}


@dataclass
class RowDrafting:
    """One sequence's drafting: its drafter (None: it decodes plainly) and its adaptive draft length."""

    drafter: NgramDrafter | ModelDrafter | None = None
    length: DraftLength | None = None
    mode: str = "off"


class RowsStep(CompiledStep):
    """The engine's decoding forward of rows ``0..B−1``, each at its own length, compiled by ``torch.compile``.

    ``step(feed (B, 1), lengths (B,), n_keys, caches) → logits (B, V)`` computes what the eager
    ``net.forward_features(feed, caches=caches.layers, positions=lengths[:, None], mask=...)`` and ``forward_head``
    compute, as one Inductor graph over the :class:`~tokennet.serve.cache.SlotCaches` buffers (see
    :class:`~tokennet.sampling.CompiledStep`: the same fused layers, options and on-disk cache). Continuous
    batching changes the batch size, the rows' lengths and the cache's capacity between steps; the number of
    keys and the capacity are symbolic, and so is the batch size from 2 rows on (a single row is its own graph,
    whose linear layers are one-pass sums of products, :func:`~tokennet.layers.blockquant.gemv`; a symbolic
    batch takes the matrix products, :func:`~tokennet.layers.blockquant.symbolic_rows`), so a session of any lengths
    and concurrencies compiles two graphs (:meth:`Engine.warm_up` compiles them
    before serving). Returns None when the step does not compile (said once in the log): the engine then
    decodes eagerly.
    """

    def _step(self, feed: Tensor, lengths: Tensor, keys: Tensor, buffers: list[tuple[Tensor, Tensor]]) -> Tensor:
        B = feed.shape[0]
        plan = DecodePlan(lengths, keys.shape[0], torch.arange(B, device=feed.device))
        caches = [SlotCache(k, v, plan) for k, v in buffers]
        mask = (keys[None, :] <= lengths[:, None])[:, None, None, :]  # (B, 1, 1, Nk): True where a row's key is real
        hidden = self.net.forward_features(feed, caches=caches, positions=lengths[:, None], mask=mask)  # (B, 1, D)
        return self.net.forward_head(hidden)[:, -1]  # (B, V)

    @torch.inference_mode()
    def __call__(self, feed: Tensor, lengths: Tensor, n_keys: int, caches: SlotCaches) -> Tensor | None:
        if self.compiled is False:
            return None
        caches.ensure(n_keys)
        if self._positions.numel() < n_keys:
            self._positions = torch.arange(max(n_keys, 2 * self._positions.numel()), device=feed.device)
        keys = self._positions[:n_keys]  # 0..Nk−1: its length is the keys attended over
        torch._dynamo.mark_dynamic(keys, 0)
        if feed.shape[0] > 1:  # a size of 1 is its own graph (Dynamo specializes 0 and 1)
            torch._dynamo.mark_dynamic(feed, 0)
            torch._dynamo.mark_dynamic(lengths, 0)
        B = feed.shape[0]
        with symbolic_rows(B > 1):  # a symbolic batch: matrix products, not the one-row sum of products
            return self._run("B1" if B == 1 else "Bn", feed, lengths, keys, self._views(caches, B))

    @staticmethod
    def _views(caches: SlotCaches, B: int) -> list[tuple[Tensor, Tensor]]:
        """Every layer's rows 0..B−1, marked for the graph: views (the graph writes the new keys into the buffers
        themselves), so the batch size is never compared with the number of rows the cache has. Made once per
        batch size and kept with the caches until their buffers are replaced (a grown capacity), instead of 2·L
        views made and marked at every step."""
        kept = caches.__dict__.get("_rows_step_views")
        if kept is None or kept[0] is not caches.layers[0].k:
            kept = caches.__dict__["_rows_step_views"] = (caches.layers[0].k, {})
        buffers = kept[1].get(B)
        if buffers is None:
            buffers = []
            for layer in caches.layers:
                layer_kv = (layer.k[:B], layer.v[:B])
                for t in layer_kv:
                    torch._dynamo.mark_dynamic(t, 2)  # the capacity: one graph for every cache size
                    if B > 1:
                        torch._dynamo.mark_dynamic(t, 0)
                buffers.append(layer_kv)
            kept[1][B] = buffers
        return buffers


class _CannotSample(ValueError):
    """A row's logits or probabilities that no token can be drawn from (NaN): its sequence ends with the message."""


def _processing(params: SamplingParams, vocab: int) -> dict[str, Any]:
    """A sampled sequence's settings as :func:`~tokennet.sampling.next_token_probs` takes them (top-k past the
    vocabulary and top-p of 1 are off), the distribution :func:`sample_rows` draws from."""
    return {"temperature": params.temperature, "top_k": params.top_k if 0 < params.top_k < vocab else None,
            "top_p": params.top_p if params.top_p < 1 else None}


def _describe(e: BaseException) -> str:
    return f"internal error: {type(e).__name__}: {e}"


def _failure(e: BaseException | str) -> dict[str, str | None]:
    """How a sequence that failed with ``e`` (an exception, or a message) ends: ``_finish``'s error and fault."""
    if isinstance(e, RequestFault):
        return {"error": str(e), "fault": "request"}
    return {"error": e if isinstance(e, str) else _describe(e), "fault": None}


class Engine:
    """Serve a causal language model to many sequences at once (see the module docstring).

    Args:
        model: a causal LM with ``forward_features(idx, caches=, positions=, mask=)``, ``forward_head``
            and a config with ``block_size``, ``num_layers``, ``num_heads``, ``dim`` (tokennet's GPT).
        tokenizer: turns generated ids into text (``decode``).
        max_batch: the most sequences decoded together (rows of the shared cache).
        context: the longest sequence (prompt + new tokens) served; default the model's context, beyond which it is
            refused (:class:`~tokennet.errors.ConfigError`), never clamped.
        prefill_tokens: prompt tokens computed by prefills per step at most (at least one prompt is; tokens
            copied from the prefix cache are not counted), so arrivals do not stall the running sequences for long.
        seed: the seed of the generator shared by sequences without their own.
        quantize: ``"auto"``, ``"none"``, ``"bf16"``, ``"int8"`` or ``"int4"``: decode with that copy of the model, as
            :func:`tokennet.sampling.generate` does (:func:`~tokennet.layers.quantize.decoding_copy`; the model
            itself is not modified).
        max_queue: the most sequences waiting for a row (None: no limit); :meth:`submit_all` raises
            :class:`QueueFull` beyond it.
        prefix_cache_mb: the prefix cache's bound in MiB of keys and values (0: no prefix caching); more than
            the device's free memory is refused (:class:`~tokennet.errors.ConfigError`).
        prefix_block: tokens per cached block (prefixes are reused in whole blocks).
        compile: decode with the compiled step (:class:`RowsStep`; eager, with one note in the log, where it
            does not compile). None (the default): on unless ``TOKENNET_COMPILE=0``
            (:func:`~tokennet.sampling.compile_default`), as ``tokennet generate``; False: eager.
        speculative: the speculative decoding of sequences that do not choose theirs: ``"off"``, ``"ngram"``
            (drafts looked up in each sequence's prompt and text so far) or ``"draft"`` (drafts from
            ``draft_model``); see :meth:`_decode`.
        draft_model: a smaller causal LM over the model's vocabulary, whose drafts ``"draft"`` sequences verify
            (None: no sequence may ask for them); ``draft_name``: what :meth:`status` calls it.
        draft_tokens: the default most tokens drafted a round, 1 to ``context − 1``.
    """

    def __init__(self, model: nn.Module, tokenizer, *, max_batch: int = 16, context: int | None = None,
                 prefill_tokens: int = 2048, seed: int = 0, quantize: str = "none", max_queue: int | None = None,
                 prefix_cache_mb: float = PREFIX_CACHE_MB, prefix_block: int = 16, compile: bool | None = None,
                 speculative: str = "off", draft_model: nn.Module | None = None, draft_tokens: int = 8,
                 draft_name: str | None = None):
        config = model.config
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_queue is not None and max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        if context is not None and not 1 <= context <= config.block_size:  # never clamped silently
            raise ConfigError(f"the context must be 1 to the model's {config.block_size} tokens (its block_size), "
                              f"got {context}")
        self.model, self.tokenizer = model.eval(), tokenizer
        self.context = context or config.block_size
        self.max_batch, self.prefill_tokens, self.max_queue = max_batch, prefill_tokens, max_queue
        param = next(model.parameters())
        self.device = param.device
        quantize = quantization.resolve_mode(model, quantize)  # "auto": the file's own blocks, else float32
        self.quantize = quantize
        self.net = quantization.decoding_copy(model, quantize)  # what tokennet.sampling.generate decodes with
        with torch.no_grad():  # the activations' dtype (bf16 for the bf16 copy): the cache holds keys of it
            act = self.net.tok_emb(torch.zeros(1, 1, dtype=torch.long, device=self.device)).dtype
        heads = config.num_kv_heads or config.num_heads
        self.caches = SlotCaches(config.num_layers, heads, config.head_width, max_batch, self.context,
                                 device=self.device, dtype=act)
        self.prefix = self._prefix_cache(prefix_cache_mb, prefix_block)
        self.step = compiled_step(self.net, RowsStep) if compile_default(compile) else None
        self.warm_up_s: float | None = None  # the time warm_up took (compiling, or loading Inductor's cache)
        # False while warm_up_in_background compiles: the engine decodes eagerly meanwhile, then takes the step
        self.step_ready = True
        self._warming: threading.Thread | None = None
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.feeding: list[Sequence] = []  # the sequences of the forward in progress (for fault injection, logs)
        self._cv = threading.Condition()
        self._stop = False
        self._abort: str | None = None  # set when a drain runs out of time: fail what is left, end
        self._thread: threading.Thread | None = None
        self.steps = 0  # decode steps taken (for tests and statistics)
        self.batch_sizes: list[int] = []  # rows of each decode step, the last 1000
        self.finished: Counter[str] = Counter()  # sequences ended, by finish reason
        self.draft_model = draft_model
        self.speculation = self._speculation(speculative, draft_model, draft_tokens, draft_name)
        self.ngram = NgramDrafter()  # stateless: one for every sequence

    def _speculation(self, mode: str, draft_model: nn.Module | None, draft_tokens: int,
                     draft_name: str | None) -> Speculation:
        """The engine's speculative decoding, checked: a known mode, ``"draft"`` with a draft model, and a draft
        length that fits the context."""
        if mode not in SPECULATIVE_MODES:
            raise ConfigError(f"speculative must be one of {', '.join(SPECULATIVE_MODES)}, got {mode!r}")
        if mode == "draft" and draft_model is None:
            raise ConfigError("speculative 'draft' needs a draft model: a smaller language model with the same "
                              "tokenizer")
        check_draft_tokens(draft_tokens, self.context)
        if draft_model is not None:
            self.draft_quantize = quantization.resolve_mode(draft_model, "auto" if self.quantize == "int4"
                                                            else self.quantize)
            draft_model.eval()
        shown = None if draft_model is None else draft_name or type(draft_model).__name__
        return Speculation(mode, shown, draft_tokens)

    def _prefix_cache(self, mb: float, block: int) -> PrefixCache | None:
        if not (mb >= 0) or mb == float("inf"):
            raise ConfigError(f"the prefix cache's size must be a number of MiB >= 0, got {mb}")
        if block < 1:
            raise ConfigError(f"prefix_block must be >= 1, got {block}")
        if mb == 0:
            return None
        budget = int(mb * 2**20)
        free = available_memory(self.device)
        if free is not None and budget > free:
            raise ConfigError(f"a prefix cache of {mb:g} MiB does not fit: {free / 2**20:.0f} MiB of "
                              f"{self.device.type} memory is free (--prefix-cache-mb; 0 turns it off)")
        return PrefixCache(budget, block)

    # -- the caller's side (any thread) ------------------------------------------------------------
    def start(self) -> Engine:
        self._thread = threading.Thread(target=self._loop, name="tokennet-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 30.0) -> None:
        """Finish every sequence already submitted, then end the thread (a drain).

        Sequences still unfinished after ``timeout`` seconds end with an ``"error"`` event (the server is
        shutting down), so every owner is answered; a sequence that was never started gets it too.
        """
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is None:
            self._fail_all("the server is shutting down")
            return
        self._thread.join(timeout)
        if self._thread.is_alive():
            with self._cv:
                self._abort = f"the server is shutting down: unfinished after the drain's {timeout:g} s"
                self._cv.notify_all()
            self._thread.join(timeout)

    def submit(self, seq: Sequence) -> None:
        self.submit_all([seq])

    def submit_all(self, seqs: list[Sequence]) -> None:
        """Queue a request's sequences, all or none.

        Raises:
            ValueError: a sequence does not fit in the context.
            QueueFull: the queue has no room for them now (``max_queue``).
            RuntimeError: the engine is shutting down.
        """
        for seq in seqs:
            if len(seq.prompt) + seq.params.max_tokens > self.context:
                raise ValueError(f"{len(seq.prompt)} prompt tokens + {seq.params.max_tokens} new tokens exceed "
                                 f"the context of {self.context}")
            self._check_speculative(seq.params)
        for seq in seqs:  # a seeded sequence's generator lives on the device its probabilities are on
            if seq.params.seed is not None and seq.generator is None:
                seq.generator = torch.Generator(device=self.device).manual_seed(seq.params.seed)
        with self._cv:
            if self._stop:
                raise RuntimeError("the engine is shutting down")
            if self._thread is not None and not self._thread.is_alive():  # nobody would ever serve them
                raise RuntimeError("the engine's thread has ended")
            if self.max_queue is not None and len(self.waiting) + len(seqs) > self.max_queue:
                raise QueueFull(f"{len(self.waiting)} sequences are waiting and the queue holds {self.max_queue}: "
                                f"no room for {len(seqs)} more; try again later")
            self.waiting.extend(seqs)
            self._cv.notify_all()

    def _check_speculative(self, params: SamplingParams) -> None:
        """A ValueError for a sequence's speculative settings that this engine cannot follow."""
        if params.speculative is not None and params.speculative not in SPECULATIVE_MODES:
            raise ValueError(f"speculative must be one of {', '.join(SPECULATIVE_MODES)}, got {params.speculative!r}")
        if params.speculative == "draft" and self.draft_model is None:
            raise ValueError("speculative 'draft' needs the engine's draft model; this engine has none")
        if params.draft_tokens is not None:
            try:
                check_draft_tokens(params.draft_tokens, self.context)
            except ConfigError as error:
                raise ValueError(str(error)) from None

    def cancel(self, seq: Sequence) -> None:
        """Stop a sequence (its client went away); its row is freed before the next step."""
        seq.cancelled = True
        with self._cv:
            self._cv.notify_all()

    @property
    def load(self) -> dict[str, int]:
        return {"running": len(self.running), "waiting": len(self.waiting)}

    def queue_room(self) -> int | None:
        """How many more sequences the queue takes now (None: no limit)."""
        return None if self.max_queue is None else self.max_queue - len(self.waiting)

    # -- the engine's thread -----------------------------------------------------------------------
    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        try:
            while True:
                with self._cv:
                    while not (self.waiting or self.running or self._stop):
                        self._cv.wait()
                    if self._abort is not None or (self._stop and not (self.waiting or self.running)):
                        return
                try:
                    with torch.inference_mode():
                        self._retire_cancelled()
                        self._admit()
                        if self.running:
                            self._decode()
                except Exception as error:  # noqa: BLE001 - a bug outside any one sequence: fail the batch, go on
                    log.exception("decoding step failed")
                    for seq in [*self.running]:
                        self._finish(seq, "error", error=_describe(error))
                    self.running.clear()
        finally:  # however the loop ends, nobody is left waiting for an answer
            self._fail_all(self._abort or "the engine stopped")

    def _fail_all(self, why: str) -> None:
        with self._cv:
            left = [*self.running, *self.waiting]
            self.running.clear()
            self.waiting.clear()
        for seq in left:
            if seq.finish_reason is None:
                self._finish(seq, "error", error=why, fault="unavailable")

    def _retire_cancelled(self) -> None:
        with self._cv:
            gone = [seq for seq in self.waiting if seq.cancelled]
            for seq in gone:
                self.waiting.remove(seq)
        for seq in gone:
            self._finish(seq, "cancelled")
        for i in reversed(range(len(self.running))):
            if self.running[i].cancelled:
                self._remove(i, "cancelled")

    def _admit(self) -> None:
        budget = self.prefill_tokens
        while len(self.running) < self.max_batch:
            with self._cv:
                seq = self._next()
                # the tokens it computes: a cached prefix is copied, not computed (it may yet be evicted before
                # the prefill: then it computes more, and this step's budget is charged what it computed)
                if seq is None or (budget < len(seq.prompt) - self._cached(seq) and budget < self.prefill_tokens):
                    return
                self.waiting.remove(seq)
            try:
                token = self._prefill(seq, row=len(self.running))
                if token is None:  # nothing to generate (max_tokens 0: the prompt's log probabilities only)
                    self._finish(seq, "length")
                    continue
            except RequestFault as error:  # what the request asked for cannot be served: its own error, no traceback
                log.info("a sequence ends with its request's error: %s", error)
                self._finish(seq, "error", **_failure(error))
                continue
            except Exception as error:  # noqa: BLE001 - this prompt's failure (e.g. out of memory) is its own
                log.exception("prefill failed; that sequence ends with an error")
                self._finish(seq, "error", **_failure(error))
                continue
            except BaseException:  # the thread ends (the loop's finally answers the others): answer this one too
                self._finish(seq, "error", error="the engine stopped", fault="unavailable")
                raise
            finally:
                self.feeding = []
                budget -= len(seq.prompt) - seq.cached_tokens  # what it computed
            self.running.append(seq)
            self._accept_or_fail(len(self.running) - 1, token)

    def _next(self) -> Sequence | None:
        """The waiting sequence to get the next free row: the first of the request holding the fewest rows.

        Sequences of one request each are served first come, first served; a request of many prompts takes
        the free rows only while no other request waits with fewer, so a small request queued behind a huge
        one gets the next row that frees instead of waiting for all of the huge one's prompts.
        """
        if not self.waiting:
            return None
        held = Counter(seq.group for seq in self.running if seq.group is not None)
        best, fewest = None, None
        for seq in self.waiting:
            n = held.get(seq.group, 0) if seq.group is not None else 0
            if n == 0:
                return seq
            if fewest is None or n < fewest:
                best, fewest = seq, n
        return best

    def _prefill(self, seq: Sequence, row: int) -> int | None:
        """Fill row ``row`` of the cache with the prompt (its cached prefix copied, the rest computed); the first
        new token (None: ``max_tokens`` is 0). A request for the prompt's log probabilities computes it whole."""
        self.feeding = [seq]
        seq_params = seq.params
        start = 0 if seq_params.prompt_logprobs else self._load_prefix(seq, row)
        self.caches.plan_prefill(row, len(seq.prompt), start)
        ids = torch.tensor([seq.prompt], device=self.device)  # (1, P)
        hidden = self.net.forward_features(ids[:, start:], caches=self.caches.layers)  # (1, P − start, D)
        # every position's logits, from this same forward (in chunks: P × V can be large)
        if seq_params.prompt_logprobs:
            P, k = len(seq.prompt), seq_params.logprobs or 0
            for begin in range(0, P - 1, PROMPT_LOGPROBS_CHUNK):
                end = min(begin + PROMPT_LOGPROBS_CHUNK, P - 1)
                # (end - begin, V): predicts prompt[begin + 1 : end + 1]
                chunk_logits = self.net.forward_head(hidden[:, begin:end])[0]
                seq.prompt_logprobs += token_logprobs(chunk_logits, ids[0, begin + 1 : end + 1], [k] * (end - begin))
        logits = self.net.forward_head(hidden[:, -1:])[:, -1]  # (1, V)
        self._remember(seq.prompt, row)
        if seq_params.max_tokens == 0:
            return None
        return int(self._sample(logits, [seq])[0])

    def _sample(self, logits: Tensor, rows: list[Sequence], errors: dict[int, Any] | None = None) -> Tensor:
        """:func:`sample_rows` after each constrained row's mask; the log probabilities of the rows that ask.

        With ``errors`` given, a row that cannot be sampled is recorded there (row → message, or the
        :class:`RequestFault` of a grammar no token can continue) with token −1, and the others are sampled."""
        masked, refused = logits, {}
        if any(seq.matcher is not None for seq in rows):
            masked = logits.clone()
            for i, seq in enumerate(rows):
                if seq.matcher is not None:
                    try:
                        seq.matcher.mask(masked[i])
                    except RequestFault as error:
                        if errors is None:
                            raise
                        refused[i] = error
        nxt = sample_rows(masked, [seq.params for seq in rows], [seq.generator for seq in rows], self.generator,
                          errors=errors)
        if refused:
            errors.update(refused)
            nxt[list(refused)] = -1
        want = [i for i, seq in enumerate(rows) if seq.params.logprobs is not None and nxt[i] >= 0]
        if want:
            for i, error in zip(want, token_logprobs(logits[want], nxt[want], [rows[i].params.logprobs for i in want])):
                rows[i].logprobs.append(error)
        return nxt

    def _cached(self, seq: Sequence) -> int:
        """The prompt tokens of ``seq`` the prefix cache holds now (what its prefill would copy, not compute)."""
        if self.prefix is None or seq.params.prompt_logprobs or len(seq.prompt) <= self.prefix.block:
            return 0
        return self.prefix.peek(seq.prompt, limit=len(seq.prompt) - 1)

    def _load_prefix(self, seq: Sequence, row: int) -> int:
        """Copy the longest cached prefix of ``seq``'s prompt (all but its last token at most) into row ``row``;
        the tokens copied (0: none, or no prefix cache)."""
        seq.cached_tokens = 0
        if self.prefix is None or len(seq.prompt) <= self.prefix.block:
            return 0
        m, cached_kv = self.prefix.match(seq.prompt, limit=len(seq.prompt) - 1)
        if m:
            self.caches.load_prefix(row, cached_kv)
            seq.cached_tokens = m
        return m

    def _remember(self, tokens: list[int], row: int) -> None:
        """Store the whole blocks of ``tokens``, the first ``len(tokens)`` of row ``row``, in the prefix cache."""
        if self.prefix is None or len(tokens) < self.prefix.block:
            return
        try:
            self.prefix.insert(tokens, lambda begin, end: [(k, v) for k, v in self.caches.read(row, begin, end)])
        except Exception:  # noqa: BLE001 - a cache that cannot store (out of memory) costs reuse, never a request
            log.exception("the prefix cache could not store a sequence's blocks")

    def _forward_rows(self, first: int, n: int) -> Tensor:
        """One decoding forward of rows ``first..first+n−1``: their next tokens' logits ``(n, V)``."""
        rows = self.running[first : first + n]
        self.feeding = rows
        feed = torch.tensor([[seq.next_token] for seq in rows], device=self.device)  # (n, 1)
        lengths = torch.tensor([seq.length for seq in rows], device=self.device)  # (n,): tokens already cached
        if self.step is not None and self.step_ready and first == 0:  # (a row retried alone runs eagerly)
            logits = self.step(feed, lengths, max(seq.length for seq in rows) + 1, self.caches)
            if logits is not None:
                return logits
        mask = self.caches.plan_decode(lengths, first)  # (n, 1, 1, Nk)
        hidden = self.net.forward_features(feed, caches=self.caches.layers, positions=lengths[:, None], mask=mask)
        return self.net.forward_head(hidden)[:, -1]  # (n, V)

    def _grow(self) -> None:
        """Make room for one more token in every row; when the cache cannot grow, the rows that need it fail."""
        need = max(seq.length for seq in self.running) + 1
        if need <= self.caches.capacity:
            return
        try:
            self.caches.ensure(need)
        except Exception as error:  # noqa: BLE001 - out of memory: the longest rows fail, the others fit as they are
            log.exception("the KV cache could not grow to %d tokens", need)
            for i in reversed(range(len(self.running))):
                if self.running[i].length + 1 > self.caches.capacity:
                    self._remove(i, "error", error=f"the KV cache could not grow to {need} tokens: "
                                 f"{type(error).__name__}: {error}")

    def _decode(self) -> None:
        """One decoding step of every running row; the rows that speculate verify their drafts in it.

        Without drafts the B rows feed their last token, ``(B, 1)`` (the compiled step). When any row has drafts
        (:meth:`_draft_rows`), the step is one eager forward of ``(B, 1 + k_max)``: each row its last token and its
        own drafts, padded (the padded positions' keys are written past what the row keeps, masked for its other
        queries, and their logits ignored); each drafting row then keeps the drafts the rule accepts
        (:func:`~tokennet.speculative.accept_greedy` for a greedy row, the lossless rejection rule
        :func:`~tokennet.speculative.accept_sampled` for a sampled one) and one token of the model's own, and the
        rows without drafts take one sampled token. A row's length counts only what it accepted, so the rejected
        drafts' keys are rolled back by being overwritten later. Every token goes through :meth:`_accept` one at a
        time: stop tokens, stop strings, the token budget and log probabilities work as in plain steps, and a stop
        inside accepted drafts ends the sequence there.
        """
        self._grow()
        B = len(self.running)
        if not B:
            return
        rows = list(self.running)
        started = time.perf_counter()
        drafts, verify = self._draft_rows(rows)
        errors: dict[int, Any] = {}
        if verify:
            new, entries = self._verify_step(rows, drafts, errors)
        else:
            new, entries = self._plain_step(rows, errors), {}
        self.steps += 1
        self.batch_sizes = self.batch_sizes[-999:] + [B]
        self._rounds_done(rows, drafts if verify else {}, {} if verify else drafts, new, errors,
                          time.perf_counter() - started)
        for i in reversed(range(B)):  # from the end: a retired row is refilled by the last, already handled
            if i in errors:
                if isinstance(errors[i], RequestFault):
                    log.info("a sequence ends with its request's error: %s", errors[i])
                self._remove(i, "error", **_failure(errors[i]))
            else:
                self._take(i, new[i], entries.get(i))

    def _plain_step(self, rows: list[Sequence], errors: dict[int, Any]) -> list[list[int]]:
        """One token for every row from one ``(B, 1)`` forward; when the batched forward raises, it is retried one
        row at a time, and a row whose own forward raises is recorded in ``errors``."""
        B = len(rows)
        try:
            logits = self._forward_rows(0, B)  # (B, V)
            return [[token] for token in self._sample(logits, rows, errors).tolist()]
        except Exception as error:  # noqa: BLE001 - find the row(s) at fault: retry the step one row at a time
            log.warning("a batched decoding step of %d rows failed (%s: %s); retrying row by row", B,
                        type(error).__name__, error)
            errors.clear()
            nxt = [[-1] for _ in range(B)]
            for i, seq in enumerate(rows):
                try:
                    row_logits = self._forward_rows(i, 1)  # (1, V)
                    nxt[i] = [int(self._sample(row_logits, [seq])[0])]
                except RequestFault as row_error:  # its request's own error: no traceback
                    errors[i] = row_error
                except Exception as row_error:  # noqa: BLE001 - this row's own failure
                    log.exception("decoding failed for one sequence; it ends with an error")
                    errors[i] = _describe(row_error)
            return nxt
        finally:
            self.feeding = []

    def _take(self, row: int, tokens: list[int], entries: list[TokenLogprob] | None) -> None:
        """Accept a row's new tokens one at a time (with their log probabilities, when a verification computed
        them), until the sequence ends."""
        seq = self.running[row]
        for j, token in enumerate(tokens):
            if seq.finish_reason is not None:  # a stop, the budget, or a failure among the earlier tokens
                return
            if entries is not None:
                seq.logprobs.append(entries[j])
            self._accept_or_fail(row, token)

    def _drafting(self, seq: Sequence) -> RowDrafting:
        """How ``seq`` drafts, decided at its first decoding step: its own mode or the engine's; a constrained
        sequence decodes plainly (its grammar masks one position's logits at a time)."""
        if seq.drafting is None:
            seq.drafting = RowDrafting()  # plain, also when what follows raises
            params = seq.params
            mode = params.speculative or self.speculation.mode
            if mode != "off" and seq.matcher is None:
                drafter = self.ngram if mode == "ngram" else ModelDrafter(
                    self.draft_model, self.model.config.vocab_size,
                    **_processing(params, self.model.config.vocab_size),
                    generator=seq.generator if seq.generator is not None else self.generator,
                    quantize=self.draft_quantize, compile=False, context=self.context)
                length = DraftLength(params.draft_tokens or self.speculation.draft_tokens, clock=None,
                                     prior=self.speculation.prior(mode))
                seq.drafting = RowDrafting(drafter, length, mode)
        return seq.drafting

    def _draft_rows(self, rows: list[Sequence]) -> tuple[dict[int, Draft], bool]:
        """Each speculating row's drafts (row → a draft of at least one token), and whether this step verifies them.

        A row drafts at most what its token budget and the context leave: a verification of width ``1 + d`` writes
        every row's keys up to its length + width, so ``d`` stays below what the longest row leaves. A verification
        reads the whole batch ``(B, 1 + d)``, so ``d`` is chosen for the batch (:meth:`Speculation.width`): the
        width with the most tokens a second, counting the drafts each row is expected to have accepted
        (:meth:`~tokennet.speculative.DraftLength.expected`) against the verification's measured cost, and 0 — a
        plain step — unless they repay it. Prompt lookup proposes at every step, so a plain step checks its drafts'
        first tokens (their acceptance estimates stay current); a draft model proposes only the drafts verified. A
        drafter that raises costs its sequence speculation (it decodes plainly from then on), never the sequence."""
        room = self.context - max(seq.length for seq in rows) - 1
        drafts: dict[int, Draft] = {}
        caps: dict[int, int] = {}  # row → the most drafts it may have verified
        for i, seq in enumerate(rows):
            drafting = self._drafting(seq)
            if drafting.drafter is None:
                continue
            k = min(drafting.length.k_max, room, seq.params.max_tokens - len(seq.generated) - 1)
            if k < 1:
                continue
            if not getattr(drafting.drafter, "free_to_propose", False):  # a drafter that does not say: a costly one
                caps[i] = k
            elif self._propose(i, seq, k, drafts):
                caps[i] = len(drafts[i].tokens)
        if not caps:
            return drafts, False

        def expected(width: int) -> float:
            return sum(rows[i].drafting.length.expected(min(width, cap)) for i, cap in caps.items())

        width = self.speculation.width(len(rows), expected, max(caps.values()))
        if not width:
            self.speculation.skipped += 1
            return drafts, False
        for i, cap in caps.items():
            if i in drafts:  # a free drafter's proposal: its first `width`
                draft = drafts[i]
                drafts[i] = Draft(draft.tokens[:width], None if draft.probs is None else draft.probs[:width])
            else:
                self._propose(i, rows[i], min(width, cap), drafts)
        return drafts, bool(drafts)

    def _propose(self, i: int, seq: Sequence, k: int, drafts: dict[int, Draft]) -> bool:
        """Row ``i``'s draft of up to ``k`` tokens into ``drafts`` (True when it drafted any); a drafter that raises
        is logged and the sequence decodes plainly from then on."""
        try:
            draft = seq.drafting.drafter.propose(torch.tensor(seq.prompt + seq.generated, device=self.device), k)
        except Exception:  # noqa: BLE001 - drafts are an optimization: this sequence goes on without them
            log.exception("drafting failed for one sequence; it decodes without drafts from now on")
            seq.drafting = RowDrafting()
            return False
        if draft.tokens:
            drafts[i] = draft
        return bool(draft.tokens)

    def _forward_verify(self, first: int, rows: list[Sequence], drafts: dict[int, Draft]) -> Tensor:
        """One forward of rows ``first..first+n−1``, each its last token and its drafts (``drafts``: by index in
        ``rows``), padded with its last token to the widest: logits ``(n, W, V)``."""
        self.feeding = rows
        feeds = [[seq.next_token, *(drafts[j].tokens if j in drafts else [])] for j, seq in enumerate(rows)]
        width = max(len(fed) for fed in feeds)
        feed = torch.tensor([fed + fed[:1] * (width - len(fed)) for fed in feeds], device=self.device)  # (n, W)
        lengths = torch.tensor([seq.length for seq in rows], device=self.device)  # (n,): tokens already cached
        mask = self.caches.plan_verify(lengths, width, first)  # (n, 1, W, Nk)
        positions = lengths[:, None] + torch.arange(width, device=self.device)  # (n, W)
        hidden = self.net.forward_features(feed, caches=self.caches.layers, positions=positions, mask=mask)
        return self.net.forward_head(hidden)  # (n, W, V)

    def _verify_step(self, rows: list[Sequence], drafts: dict[int, Draft], errors: dict[int, Any]
                     ) -> tuple[list[list[int]], dict[int, list[TokenLogprob]]]:
        """Every row's new tokens from one verification forward (:meth:`_decode`), and the log probabilities of the
        drafting rows that ask for them. When the batched forward raises, each row is verified alone; a row whose
        own forward or choice raises is recorded in ``errors``, the others go on."""
        B = len(rows)
        try:
            logits = self._forward_verify(0, rows, drafts)  # (B, W, V)
            each = [(i, logits[i]) for i in range(B)]
        except Exception as error:  # noqa: BLE001 - find the row(s) at fault: verify one row at a time
            log.warning("a batched verification of %d rows failed (%s: %s); retrying row by row", B,
                        type(error).__name__, error)
            each = []
            for i, seq in enumerate(rows):
                try:
                    each.append((i, self._forward_verify(i, [seq], {0: drafts[i]} if i in drafts else {})[0]))
                except Exception as row_error:  # noqa: BLE001 - this row's own failure
                    log.exception("verifying one sequence's drafts failed; it ends with an error")
                    errors[i] = _describe(row_error)
        finally:
            self.feeding = []
        new: list[list[int]] = [[] for _ in rows]
        entries: dict[int, list[TokenLogprob]] = {}
        for i, row_logits in each:
            try:
                new[i], got = self._choose(rows[i], row_logits, drafts.get(i))
            except (RequestFault, _CannotSample) as error:  # the request's own, or its probabilities: no traceback
                errors[i] = error if isinstance(error, RequestFault) else str(error)
                continue
            except Exception as error:  # noqa: BLE001 - this row's own failure
                log.exception("verifying one sequence's drafts failed; it ends with an error")
                errors[i] = _describe(error)
                continue
            if got is not None:
                entries[i] = got
        return new, entries

    def _choose(self, seq: Sequence, logits: Tensor, draft: Draft | None
                ) -> tuple[list[int], list[TokenLogprob] | None]:
        """A row's tokens from its verification's logits ``(W, V)``: without a draft, one token sampled from the
        first position (as a plain step samples it; its log probability recorded there); with ``k`` drafts, the
        accepted drafts and one token of the model's own, with their log probabilities when asked for."""
        if draft is None:
            failed: dict[int, Any] = {}
            token = int(self._sample(logits[:1], [seq], failed)[0])
            if failed:
                raise failed[0] if isinstance(failed[0], RequestFault) else _CannotSample(failed[0])
            return [token], None
        logits = logits[: len(draft.tokens) + 1]  # (k+1, V): after the last token and after each draft
        if bool(torch.isnan(logits).any()):
            raise _CannotSample("the model's logits are NaN")
        params = seq.params
        if params.greedy:
            tokens = accept_greedy(logits, draft.tokens)
        else:
            probs = next_token_probs(logits, **_processing(params, logits.shape[-1]))  # what sample_rows draws from
            if not bool((torch.isfinite(probs).all(dim=-1) & (probs.sum(dim=-1) > 0)).all()):
                raise _CannotSample(f"the sampling probabilities are not finite (temperature {params.temperature:g})")
            tokens = accept_sampled(probs, draft, seq.generator if seq.generator is not None else self.generator)
        if params.logprobs is None:
            return tokens, None
        chosen = torch.tensor(tokens, device=logits.device)
        return tokens, token_logprobs(logits[: len(tokens)], chosen, [params.logprobs] * len(tokens))

    def _rounds_done(self, rows: list[Sequence], verified: dict[int, Draft], unverified: dict[int, Draft],
                     new: list[list[int]], errors: dict[int, Any], seconds: float) -> None:
        """After a step of ``seconds``: the engine's cost of a plain step or a verification, and each speculating
        row's acceptance — a verified row's from what it kept (and a draft model's cache keeps only the accepted
        text), an unverified row's from whether its token was its first draft
        (:meth:`~tokennet.speculative.DraftLength.plain_done`), the engine's for the mode likewise; the engine's
        counts grow."""
        stats = self.speculation
        if verified:
            stats.cost.verify_done(len(rows), max(len(draft.tokens) for draft in verified.values()), seconds)
        else:
            stats.cost.plain_done(len(rows), seconds)
        for i, seq in enumerate(rows):
            drafting = seq.drafting
            if i in errors or drafting is None or drafting.length is None:
                continue
            if i not in verified:
                shadow = unverified[i].tokens[0] == new[i][0] if i in unverified and new[i] else None
                drafting.length.plain_done(shadow=shadow)
                stats.observe(drafting.mode, [] if shadow is None else [shadow])
                continue
            drafted, accepted = len(verified[i].tokens), len(new[i]) - 1
            drafting.length.round_done(drafted, accepted)
            stats.observe(drafting.mode, outcomes(drafted, accepted))
            drafting.drafter.rollback(len(seq.prompt) + len(seq.generated) + accepted)
            stats.drafted, stats.accepted = stats.drafted + drafted, stats.accepted + accepted
            stats.verifications += 1

    def _accept_or_fail(self, row: int, token: int) -> None:
        seq = self.running[row]
        try:
            self._accept(row, token)
        except Exception as error:  # noqa: BLE001 - e.g. the tokenizer cannot decode the token: this sequence only
            log.exception("a sequence's new token could not be taken")
            if row < len(self.running) and self.running[row] is seq:
                self._remove(row, "error", **_failure(error))
            elif seq.finish_reason is None:
                self._finish(seq, "error", **_failure(error))

    def _accept(self, row: int, token: int) -> None:
        """Take a sequence's newly sampled token: stop, or turn it into text and emit it."""
        seq = self.running[row]
        seq_params = seq.params
        if token in seq_params.stop_ids:
            self._flush(seq, final=True)
            self._remove(row, "stop")
            return
        if seq.matcher is not None:
            seq.matcher.accept(token)
        seq.generated.append(token)
        seq.next_token = token
        text = self.tokenizer.decode_continuation(seq.generated)
        if not text.endswith("\ufffd"):  # a token that ends inside a UTF-8 character waits for the next one
            seq.text = text
        stop_at = first_stop(seq.text, seq_params.stop, seq.sent)
        if stop_at >= 0:
            seq.text = seq.text[:stop_at]
            self._flush(seq, final=True)
            self._remove(row, "stop")
            return
        if seq.matcher is not None and seq.matcher.done():  # the grammar is complete: nothing may follow
            seq.text = self.tokenizer.decode_continuation(seq.generated)
            self._flush(seq, final=True)
            self._remove(row, "stop")
            return
        if len(seq.generated) >= seq_params.max_tokens:
            seq.text = self.tokenizer.decode_continuation(seq.generated)
            self._flush(seq, final=True)
            self._remove(row, "length")
            return
        self._flush(seq, final=False)

    def _flush(self, s: Sequence, *, final: bool) -> None:
        """Emit the text not sent yet, holding back a tail that could begin a stop string."""
        end = len(s.text) if final else held_back(s.text, s.sent, s.params.stop)
        if end > s.sent:
            piece = s.text[s.sent : end]
            s.sent = end
            self._emit(s, Event(text=piece, logprobs=self._new_logprobs(s)))

    @staticmethod
    def _new_logprobs(s: Sequence) -> list[TokenLogprob]:
        new = s.logprobs[s.logprobs_sent :]
        s.logprobs_sent = len(s.logprobs)
        return new

    def _remove(self, row: int, reason: str, *, error: str | None = None, fault: str | None = None) -> None:
        seq = self.running[row]
        if reason != "error":  # its prompt and reply, for a chat's next turn (a failed row's keys are not trusted)
            self._remember((seq.prompt + seq.generated)[: seq.length], row)
        last = len(self.running) - 1
        if row != last:
            self.caches.move(last, row, self.running[last].length)
            self.running[row] = self.running[last]
        self.running.pop()
        self._finish(seq, reason, error=error, fault=fault)

    def _finish(self, s: Sequence, reason: str, *, error: str | None = None, fault: str | None = None) -> None:
        s.finish_reason = reason
        self.finished[reason] += 1
        self._emit(s, Event(finish_reason=reason, error=error, fault=fault, logprobs=self._new_logprobs(s)))

    @staticmethod
    def _emit(s: Sequence, ev: Event) -> None:
        try:
            s.emit(ev)
        except Exception:  # noqa: BLE001 - the owner's callback must not stop the engine
            log.exception("a sequence's emit callback failed")

    def warm_up(self) -> float | None:
        """Compile the decoding step for every graph continuous batching uses (1 row, and 2 rows where
        ``max_batch`` allows: the graph of every batch from 2 rows on) before any request, so none waits for it;
        the seconds it took (None: no compiled step, or it does not compile). A later process loads the graphs
        from Inductor's on-disk cache (:func:`~tokennet.sampling.inductor_cache_dir`) instead of compiling them
        again. Call it before :meth:`start` (it writes a dummy token into rows that no sequence holds yet)."""
        return self._compile_on(self.caches)

    def warm_up_in_background(self, builder: Callable | None = None) -> bool:
        """Make the compiled step ready while the engine answers requests eagerly; the first decoding step after it
        is ready runs compiled (``compile_status()["ready"]``). False when there is no step to compile.

        With ``builder`` (the server's: :func:`tokennet.serve.prebuild.spawn` for its run, called with the step's
        :class:`~tokennet.step_store.Artifact`, returning the builder process or None when one is already at work):
        the steps kept on this machine (:mod:`tokennet.step_store`) are loaded in a thread (seconds, not minutes); where
        none is kept, the builder process compiles them at the lowest priority, so the eager steps served meanwhile
        keep this process's cores and interpreter, and they are loaded when it is done. Without ``builder`` they are
        compiled in a thread of this process, over caches of their own (the same shapes as the engine's, never read
        by a request), which slows the eager steps served meanwhile."""
        if self.step is None or self._warming is not None:
            return False
        self.step_ready = False
        target = self._compile_in_thread if builder is None else functools.partial(self._load_or_build, builder)

        def then_switch() -> None:
            try:
                took = target()
                if took is not None:
                    log.info("the batched decoding step is ready (%.1f s); decoding switches to it", took)
            except Exception:  # noqa: BLE001 - a failed compile costs speed, never the server
                log.exception("compiling the decoding step failed; decoding stays eager")
                self.step.compiled = False
            finally:
                self.step_ready = True

        self._warming = threading.Thread(target=then_switch, name="tokennet-compile", daemon=True)
        self._warming.start()
        return True

    def _variants(self) -> list[str]:
        return ["B1"] + (["Bn"] if self.max_batch > 1 else [])

    def _load_kept(self) -> bool:
        return all(self.step.load(variant) for variant in self._variants())

    def _load_or_build(self, builder: Callable) -> float | None:
        """Load the kept steps, or have a builder process make them first; the seconds it took."""
        started = time.perf_counter()
        if not self._load_kept():
            artifact = self.step.artifact(self._variants()[-1])
            child = builder(artifact)
            log.info("building the batched decoding step in a process of its own at the lowest priority (its log: "
                     "%s); requests are decoded eagerly until it is ready", artifact.path.with_suffix(".log"))
            if child is not None:
                child.wait()
            else:  # another process is building it: wait for its lock to go
                while artifact.path.with_suffix(".building").exists():
                    time.sleep(1.0)
            if not self._load_kept():
                log.warning("the batched decoding step could not be built (see %s); decoding stays eager",
                            artifact.path.with_suffix(".log"))
                self.step.compiled = False
                return None
        self.warm_up_s = time.perf_counter() - started
        return self.warm_up_s

    def _compile_in_thread(self) -> float | None:
        spare = SlotCaches(len(self.caches.layers), self.caches.layers[0].k.shape[1],
                           self.caches.layers[0].k.shape[3], self.max_batch, self.context, device=self.device,
                           dtype=self.caches.layers[0].k.dtype, capacity=16)
        return self._compile_on(spare)

    def _compile_on(self, caches: SlotCaches) -> float | None:
        """Run the compiled step once for each graph over ``caches`` (compiling it, or loading Inductor's cache);
        the seconds it took, or None."""
        if self.step is None:
            return None
        started = time.perf_counter()
        with torch.inference_mode():
            for B in sorted({1, min(2, self.max_batch)}):
                feed = torch.zeros(B, 1, dtype=torch.long, device=self.device)
                if self.step(feed, torch.ones(B, dtype=torch.long, device=self.device), 2, caches) is None:
                    return None
        self.warm_up_s = time.perf_counter() - started
        return self.warm_up_s

    def compile_status(self) -> dict[str, Any]:
        """How the decoding step runs: ``{"compiled": True / False (eager) / None (not tried yet), "ready": False
        while :meth:`warm_up_in_background` compiles (requests are decoded eagerly meanwhile), "warm_up_s",
        "inductor_cache"}``."""
        if self.step is None:
            return {"compiled": False, "why": "off (--no-compile or TOKENNET_COMPILE=0)"}
        out: dict[str, Any] = {"compiled": self.step.compiled, "ready": self.step_ready, "warm_up_s": self.warm_up_s,
                               "inductor_cache": inductor_cache_dir()}
        if self.step.compiled is False:
            out["why"] = "torch.compile is unavailable here (see the log); decoding eagerly"
        return out

    def status(self) -> dict[str, Any]:
        return {**self.load, "max_batch": self.max_batch, "context": self.context, "steps": self.steps,
                "quantize": self.quantize, "max_queue": self.max_queue, "compile": self.compile_status(),
                "threads": torch.get_num_threads(),
                "prefix_cache": None if self.prefix is None else self.prefix.stats(),
                "speculative": self.speculation.status()}


def first_stop(text: str, stops: list[str], sent: int = 0) -> int:
    """Where the earliest match of any stop string begins in ``text`` (−1: none).

    Text before ``sent`` was emitted, so no match starts there (a tail that could begin a stop string is
    held back, :func:`held_back`); only matches that reach past it are looked for.
    """
    best = -1
    for stop in stops:
        found = text.find(stop, max(0, sent - len(stop) + 1))
        if found >= 0 and (best < 0 or found < best):
            best = found
    return best


def held_back(text: str, sent: int, stops: list[str]) -> int:
    """How much of ``text`` may be emitted: up to the longest tail after ``sent`` that begins a stop string."""
    end = len(text)
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text) - sent), 0, -1):
            if text.endswith(stop[:k]):
                end = min(end, len(text) - k)
                break
    return end
