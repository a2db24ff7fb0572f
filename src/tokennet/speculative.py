"""Speculative decoding: draft a few tokens cheaply, verify them all in one forward of the target model.

A decoding step of a language model reads every weight to produce one token. Speculative decoding
(Leviathan et al. 2023, https://arxiv.org/abs/2211.17192; Chen et al. 2023, https://arxiv.org/abs/2302.01318)
lets a cheap *drafter* propose ``k`` tokens ``x_1 … x_k`` with distributions ``q_1 … q_k``; the target then
reads the last token and the ``k`` drafts in one forward over its KV cache, which gives its own distributions
``p_1 … p_{k+1}`` for every drafted position at once. Going left to right:

    accept x_i with probability min(1, p_i(x_i) / q_i(x_i));
    at the first rejection, draw the token from  norm(max(0, p_i − q_i))  and stop;
    if all k are accepted, draw x_{k+1} ~ p_{k+1}.

Every token so produced is distributed exactly as plain sampling from ``p`` would draw it (the papers' theorem),
whatever the drafter proposes; a good drafter only makes more tokens come per target forward. ``p`` and ``q``
are the *processed* distributions — temperature, top-k and top-p applied as plain sampling applies them
(:func:`tokennet.sampling.next_token_probs`). Greedy decoding (temperature 0) is the rule with point masses:
keep drafts while they equal the target's argmax, then take the argmax; the text is plain greedy decoding's up to
the rounding of a k-token forward against one-token ones. In float32 that matters only at an exact tie; a model
decoding with int8 activations (a GGUF run's int4 copy) rounds them differently in the two (measured on SmolLM2:
logits 0.02 apart at one step), so its greedy text can part from plain decoding's at a near-tie, as eager and
compiled plain decoding already do on it.

Two drafters:

- :class:`NgramDrafter` (prompt lookup, as llama.cpp's ``lookup`` and transformers' ``prompt_lookup_num_tokens``):
  find the most recent earlier occurrence of the last ``n`` tokens of the text so far and propose the tokens
  that followed it. ``q`` is a point mass on each proposal, so the rule accepts ``x_i`` with probability
  ``p_i(x_i)`` and on rejection draws from ``p_i`` with ``x_i`` removed. Free to run; it pays off when the
  output repeats its input (rewriting a passage, editing code, quoting).
- :class:`ModelDrafter`: a smaller causal LM over the same vocabulary, decoding over its own KV cache.

After a verification the rejected drafts' keys and values are rolled back out of the target's cache (its
``length`` is set back: the buffers are overwritten by the next forward), and the drafter's likewise.

The number of drafted tokens adapts (:class:`DraftLength`): it grows while drafts are all accepted and falls to
what was accepted after a rejection. Whether a step verifies at all is a measured bet (:class:`VerifyCost`): a
verification of ``k`` drafts costs ``r`` plain steps (timed as decoding goes) and is expected to add
``α + α² + … + α^k`` accepted tokens, where ``α`` is the sequence's moving acceptance rate — kept current between
verifications by checking each plain step's token against the first draft proposed for it, which prompt lookup
gives for free. A step verifies only when the expected tokens repay the extra time, so a workload where drafts fail
decodes at plain speed, on the compiled plain step.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor, nn

from .errors import ConfigError
from .layers import quantize as quantization
from .sampling import SAMPLING_EPS, CompilePlan, VerifyStep, compiled_step, greedy_next, next_token_probs, sample_next
from .sampling import _validate as validate_sampling

__all__ = ["Draft", "NgramDrafter", "ModelDrafter", "DraftLength", "VerifyCost", "SpeculationStats", "accept_greedy",
           "accept_sampled", "stream_speculative", "check_draft_tokens", "SPECULATIVE_MODES"]

logger = logging.getLogger(__name__)

SPECULATIVE_MODES = ("off", "ngram", "draft")


@dataclasses.dataclass
class Draft:
    """Drafted tokens ``x_1 … x_k`` and the distributions ``q_i`` ``(k, V)`` they were drawn from; ``probs`` None:
    point masses (an n-gram drafter's proposals, or any drafter under greedy decoding)."""

    tokens: list[int]
    probs: Tensor | None = None


@dataclasses.dataclass
class SpeculationStats:
    """What a speculative decoding did: tokens ``drafted`` and ``accepted``, ``verifications`` (target forwards over
    drafts), ``plain_steps`` (one-token target forwards), ``tokens`` produced."""

    drafted: int = 0
    accepted: int = 0
    verifications: int = 0
    plain_steps: int = 0
    tokens: int = 0

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    def summary(self) -> str:
        return (f"accepted {self.accepted} of {self.drafted} drafted tokens ({100 * self.acceptance_rate:.0f}%); "
                f"{self.tokens} tokens in {self.verifications} verifications and {self.plain_steps} plain steps")


def accept_greedy(logits: Tensor, draft: Sequence[int]) -> list[int]:
    """Greedy verification: the drafts while each equals the target's argmax, then the argmax after them.

    ``logits (k+1, V)``: the target's logits at the last token and at each of the ``k`` drafts. Returns the
    accepted drafts followed by one token of the target's own (1 to k+1 tokens).
    """
    best = greedy_next(logits).tolist()  # (k+1,)
    out = []
    for x, choice in zip(draft, best):
        if x != choice:
            break
        out.append(x)
    out.append(best[len(out)])
    return out


def accept_sampled(p: Tensor, draft: Draft, generator: torch.Generator | None = None) -> list[int]:
    """The rejection rule of Leviathan et al. 2023 (Algorithm 1) / Chen et al. 2023 (Algorithm 2).

    ``p (k+1, V)``: the target's processed distributions at the last token and at each draft; ``draft``: the
    tokens ``x_i`` and their ``q_i`` (None: point masses, ``q_i(x_i) = 1``). Accept ``x_i`` with probability
    ``min(1, p_i(x_i) / q_i(x_i))``; at the first rejection draw from ``norm(max(0, p_i − q_i))``; after ``k``
    acceptances draw from ``p_{k+1}``. Returns the accepted drafts and the one drawn token.
    """
    k = len(draft.tokens)
    x = torch.tensor(draft.tokens, device=p.device)
    rows = torch.arange(k, device=p.device)
    if draft.probs is None:  # point masses
        q = torch.zeros_like(p[:k]).index_put_((rows, x), torch.ones(k, device=p.device))
    else:
        q = draft.probs.to(p.device, torch.float32)
    ratio = p[rows, x] / q[rows, x]  # q_i(x_i) > 0: x_i was drawn from q_i
    uniform = torch.rand(k, generator=generator, device=p.device)
    rejected = (uniform >= ratio).tolist()  # u < min(1, ratio)  ⇔  u < ratio, as u < 1
    n = rejected.index(True) if True in rejected else k
    if n == k:
        last = p[k]
    else:
        last = (p[n] - q[n]).clamp(min=0)
        if float(last.sum()) <= 0:  # p_n = q_n up to rounding: then a rejection has probability 0
            last = p[n]
    nxt = int(torch.multinomial(last / last.sum(), 1, generator=generator))
    return [*draft.tokens[:n], nxt]


class NgramDrafter:
    """Prompt lookup: propose the tokens that followed the most recent earlier occurrence of the last n tokens.

    Tries ``n = max_ngram`` down to ``min_ngram`` and takes the first n that occurs earlier in the text (prompt and
    output so far); proposes nothing when none does (the step is then a plain one).

    Args:
        max_ngram: the longest suffix looked up.
        min_ngram: the shortest (one-token suffixes match often and by chance).
    """

    free_to_propose = True  # a lookup, no forward: it may propose at every step

    def __init__(self, max_ngram: int = 3, min_ngram: int = 2):
        if not 1 <= min_ngram <= max_ngram:
            raise ConfigError(f"n-gram sizes need 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, seq: Tensor, k: int) -> Draft:
        """Up to ``k`` tokens continuing ``seq (S,)``, the text so far."""
        S = seq.shape[0]
        for n in range(min(self.max_ngram, S - 1), self.min_ngram - 1, -1):
            tail = seq[S - n:]
            windows = seq[: S - 1].unfold(0, n, 1)  # (S − n, n): every earlier n-gram that has a successor
            hits = (windows == tail).all(dim=1).nonzero()
            if len(hits):
                start = int(hits[-1]) + n  # the token after the most recent occurrence
                return Draft(seq[start : start + k].tolist())
        return Draft([])

    def rollback(self, length: int) -> None:
        """Nothing to roll back: the lookup reads the text afresh at every proposal."""


class ModelDrafter:
    """A smaller causal LM over the target's vocabulary, drafting over its own KV cache.

    Its cache holds a prefix of the text; :meth:`propose` feeds it the tokens it has not seen, then draws ``k``
    tokens one at a time from its processed distributions (greedy under greedy decoding), and :meth:`rollback`
    keeps only the part of its cache the target accepted. Past its context it restarts from the last half of
    it, as plain decoding does.

    Args:
        model: the draft model (``forward_features``, ``forward_head``, ``make_caches``).
        vocab_size: the target's vocabulary: the draft's logits are cut or padded (with −inf) to it.
        temperature, top_k, top_p: the target's sampling settings, applied to the draft's logits as well.
        generator: the random generator the drafts are drawn with.
        quantize, compile: as in :func:`tokennet.sampling.generate`, for the draft model.
        context: the window its cache holds (default and at most the draft model's context); a server drafting
            for many sequences gives its own context, so each sequence's draft cache is no larger than it needs.
    """

    free_to_propose = False  # a forward of the draft model per token: it proposes only when a draft is expected to pay

    def __init__(self, model: nn.Module, vocab_size: int, *, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, generator: torch.Generator | None = None, quantize: str = "auto",
                 compile: bool | None = None, context: int | None = None):
        _check_decodes(model, "the draft model")
        self.net = quantization.decoding_copy(model, quantization.resolve_mode(model, quantize))
        # auto: a step compiled in this process or kept on this machine, else eager (how many tokens it will draft
        # is not known here, so a compilation is never bet on)
        self.step = CompilePlan(self.net, compile, 0).first_step()
        self.block = min(model.config.block_size, context or model.config.block_size)
        self.caches = self.net.make_caches(self.block)
        self.vocab_size = vocab_size
        self.sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p)
        self.generator = generator
        self.start = 0  # the cache holds seq[start : start + length]

    def _logits(self, feed: Tensor) -> Tensor:
        """Last-position logits ``(1, V)`` of the target's vocabulary for ``feed (1, n)`` after the cache."""
        if self.step is not None and feed.shape[1] == 1 and self.caches[0].k is not None:
            logits = self.step(feed, self.caches)
        else:
            logits = self.net.forward_head(self.net.forward_features(feed, caches=self.caches)[:, -1:])[:, -1]
        V = self.vocab_size
        if logits.shape[-1] >= V:
            return logits[:, :V]
        return torch.nn.functional.pad(logits.float(), (0, V - logits.shape[-1]), value=float("-inf"))

    @torch.inference_mode()
    def propose(self, seq: Tensor, k: int) -> Draft:
        """``k`` tokens drawn one at a time after ``seq (S,)``, with the distributions they were drawn from."""
        S = seq.shape[0]
        k = min(k, self.block // 2)
        length = self.caches[0].length
        if length + (S - self.start - length) + k - 1 > self.block or self.start + length > S:
            for cache in self.caches:  # past the draft's context: restart from the recent half of it
                cache.reset()
            self.start, length = max(0, S - self.block // 2), 0
        logits = self._logits(seq[None, self.start + length : S])
        greedy = self.sampling["temperature"] < SAMPLING_EPS
        tokens, probs = [], []
        for i in range(k):
            if greedy:
                tokens.append(int(greedy_next(logits)))
            else:
                q = next_token_probs(logits, **self.sampling)  # (1, V)
                tokens.append(int(torch.multinomial(q, 1, generator=self.generator)))
                probs.append(q)
            if i < k - 1:
                logits = self._logits(seq.new_tensor([[tokens[-1]]]))
        return Draft(tokens, None if greedy else torch.cat(probs))

    def rollback(self, length: int) -> None:
        """Keep only the cached tokens among the text's first ``length`` (the accepted ones)."""
        keep = max(0, min(self.caches[0].length, length - self.start))
        for cache in self.caches:
            cache.length = keep


class VerifyCost:
    """What a verification costs against a plain step, measured: by the number of rows decoded and of drafts read.

    A plain step of ``B`` rows yields ``B`` tokens. A verification of ``d`` drafts a row (a forward of width
    ``1 + d``) yields ``B`` plus the drafts it accepts, in ``ratio(B, d)`` times the seconds, a line in ``d``
    (``c₀ + c₁·d``) fitted to the verifications timed (recent ones weigh more; two pseudo-points of
    :meth:`prior` keep the line defined before there are any). :meth:`best` picks the ``d`` with the most tokens a
    second, and says a plain step (0) unless the drafts it is expected to accept repay the extra time by a
    :attr:`MARGIN` (the expectation is an estimate, and the rounds it looks best for are those it overrates)::

        E[accepted](d)  >  MARGIN · B · (ratio(B, d) − 1)

    Plain steps' seconds are a moving average by ``B`` (the first of each ``B`` is warm-up, not recorded). Without a
    clock nothing is timed and every verification pays: the tests' deterministic policy.
    """

    MARGIN = 1.25

    @staticmethod
    def prior(rows: int, drafts: int) -> float:
        """The plain steps a verification is taken to cost before any is timed: SmolLM2 on 2 cores, an eager
        verification against the compiled step, measured 2.0 steps for 4 drafts of one row, 2.7 for 8, and for 8 rows
        2.7 for 3 drafts, 3.1 for 4 and 5.0 for 8."""
        return 1.4 + (0.15 + 0.035 * (rows - 1)) * drafts

    def __init__(self, clock: Callable[[], float] | None = time.perf_counter, decay: float = 0.9):
        self.clock, self.decay = clock, decay
        self.plain: dict[int, float] = {}  # rows → seconds of a plain step (moving average)
        self.fits: dict[int, list[float]] = {}  # rows → weighted sums w, wx, wxx, wy, wxy of (drafts, ratio)
        self._seen: set[int] = set()

    @property
    def timed(self) -> bool:
        return self.clock is not None

    def plain_done(self, rows: int, seconds: float) -> None:
        if rows in self._seen:
            self.plain[rows] = _average(self.plain.get(rows), seconds)
        self._seen.add(rows)

    def verify_done(self, rows: int, drafts: int, seconds: float) -> None:
        """A verification of ``rows`` rows, ``drafts`` drafts wide, took ``seconds``."""
        plain = self.plain.get(rows)
        if not plain:  # nothing to compare it with yet (or a clock too coarse to time a step)
            return
        y = seconds / plain
        sums = self.fits.setdefault(rows, [0.0] * 5)
        for j, term in enumerate((1.0, drafts, drafts * drafts, y, drafts * y)):
            sums[j] = self.decay * sums[j] + term

    def ratio(self, rows: int, drafts: int) -> float:
        """Seconds of a verification of ``drafts`` drafts over a plain step's, for ``rows`` rows."""
        weight, sum_x, sum_xx, sum_y, sum_xy = self.fits.get(rows, [0.0] * 5)  # weighted least squares: y = c₀ + c₁x
        for x in (1, 8):  # the prior's two points, at weight ½ each
            y = self.prior(rows, x)
            weight, sum_x, sum_xx, sum_y, sum_xy = (weight + 0.5, sum_x + 0.5 * x, sum_xx + 0.5 * x * x,
                                                    sum_y + 0.5 * y, sum_xy + 0.5 * x * y)
        slope = (weight * sum_xy - sum_x * sum_y) / (weight * sum_xx - sum_x * sum_x)
        return (sum_y - slope * sum_x) / weight + slope * drafts

    def best(self, rows: int, expected: Callable[[int], float], most: int) -> int:
        """How many drafts a row to verify (0: a plain step), given ``expected(d)``: the drafts accepted over all
        rows when each verifies up to ``d`` (``1 ≤ d ≤ most``)."""
        if not self.timed:
            return most
        best, rate = 0, 1.0  # tokens a row per plain step's time
        for drafts in range(1, most + 1):
            gain, ratio = expected(drafts), self.ratio(rows, drafts)
            if gain > self.MARGIN * rows * (ratio - 1) and (rows + gain) / (rows * ratio) > rate:
                best, rate = drafts, (rows + gain) / (rows * ratio)
        return best


class DraftLength:
    """How many drafts one sequence is expected to have accepted, and (for a lone sequence) how many to verify.

    ``acceptance`` (α) is a moving average of whether a draft token was accepted: a verification that kept ``a`` of
    ``k`` drafts counts ``a`` acceptances and, when ``a < k``, one rejection; a plain step counts one *shadow*
    check, when the drafter had proposed a token for it (prompt lookup proposes for free): was the token decoded the
    first draft? (Its expectation is the probability the rule would have accepted that draft, greedy or sampled.) A
    draft of ``k`` tokens is then expected to yield ``E = α + α² + … + α^k`` accepted tokens, each accepted only
    after the ones before it (:meth:`expected`); :class:`VerifyCost` weighs that against the verification's cost, so
    the number of drafts verified adapts between 0 and ``k_max``. A plain step with nothing to check moves α back
    toward its prior by ``drift``, so a sequence whose drafter costs a forward to propose (a draft model) is tried
    again now and then.

    For :func:`stream_speculative` it also keeps one sequence's :class:`VerifyCost` (``cost``, timed by ``clock``)
    and :meth:`choose` decides each step; the first ``plain_first`` steps are plain (the prompt's forward, one
    one-token step to warm up, then a timed one). The serving engine decides for its whole batch instead (one
    :class:`VerifyCost` over every row). Without a clock (``clock=None``) every draft is verified.

    Args:
        k_max: the most tokens drafted in one round.
        clock: the time source; None: no timing, always speculate.
        plain_first: plain steps before the first draft (with a clock).
        prior: α before any evidence.
        drift: how far α moves back toward ``prior`` at a plain step with nothing to check.
    """

    def __init__(self, k_max: int, clock: Callable[[], float] | None = time.perf_counter, plain_first: int = 3,
                 prior: float = 0.8, drift: float = 0.02):
        self.k_max = k_max
        self.cost = VerifyCost(clock)
        self.clock = clock or (lambda: 0.0)
        self.wait = plain_first if clock is not None else 0
        self.prior, self.drift, self.acceptance = prior, drift, prior

    def expected(self, k: int) -> float:
        """``α + α² + … + α^k``: the drafts of a ``k``-token draft the target is expected to accept."""
        alpha = self.acceptance
        return float(k) if alpha >= 1 else alpha * (1 - alpha ** k) / (1 - alpha)

    def choose(self, most: int) -> int:
        """How many of ``most`` drafts a lone sequence's next step verifies (0: a plain step)."""
        if self.wait > 0:
            self.wait -= 1
            return 0
        return self.cost.best(1, self.expected, most) if most >= 1 else 0

    def round_done(self, drafted: int, accepted: int, seconds: float | None = None) -> None:
        """After a verification that kept ``accepted`` of ``drafted`` drafts (and took ``seconds``, for a lone
        sequence's own cost)."""
        for hit in outcomes(drafted, accepted):
            self._observe(hit)
        if seconds is not None:
            self.cost.verify_done(1, drafted, seconds)

    def plain_done(self, seconds: float | None = None, shadow: bool | None = None) -> None:
        """After a plain step (of ``seconds``, for a lone sequence's own cost): ``shadow`` whether its token was the
        first draft proposed for it (None: nothing was proposed)."""
        if shadow is None:
            self.acceptance += self.drift * (self.prior - self.acceptance)
        else:
            self._observe(shadow)
        if seconds is not None:
            self.cost.plain_done(1, seconds)

    def _observe(self, hit: bool, weight: float = 0.2) -> None:
        self.acceptance += weight * (float(hit) - self.acceptance)


def outcomes(drafted: int, accepted: int) -> list[bool]:
    """What a verification that kept ``accepted`` of ``drafted`` drafts says of each draft judged: ``accepted``
    acceptances and, when it stopped short, one rejection (the drafts after it were never judged)."""
    return [True] * accepted + [False] * (accepted < drafted)


def _average(old: float | None, new: float, weight: float = 0.3) -> float:
    return new if old is None else (1 - weight) * old + weight * new


def _check_decodes(model: nn.Module, what: str) -> None:
    if not all(hasattr(model, attr) for attr in ("forward_features", "forward_head", "make_caches")) or not hasattr(
            getattr(model, "config", None), "block_size"):
        raise ConfigError(f"{what} ({type(model).__name__}) is not a causal language model with a KV cache: "
                          "speculative decoding needs one")


def check_draft_tokens(draft_tokens: int, block_size: int) -> int:
    """Refuse a draft length outside ``1 … block_size − 1`` (a verification reads the last token and the drafts)."""
    if isinstance(draft_tokens, bool) or not isinstance(draft_tokens, int) or not 1 <= draft_tokens < block_size:
        raise ConfigError(f"draft_tokens must be between 1 and {block_size - 1} (the model's context of {block_size} "
                          f"tokens less the one being continued), got {draft_tokens!r}")
    return draft_tokens


def _verify_step(net: nn.Module, mode: str) -> VerifyStep | None:
    """The compiled verification forward, once the plain step is compiled: with ``--compile`` always; in auto mode
    where it is kept on this machine (:mod:`tokennet.step_store`; the builder that ``generate`` starts keeps it with
    the plain step), since its compilation is not in the plain step's bet; otherwise None (eager)."""
    if mode == "off":
        return None
    step = compiled_step(net, VerifyStep)
    if mode == "on" or step.compiled or step.load("K"):
        return step
    return None


class _Target:
    """The target model's side: its decoding copy, its KV caches and the text so far (``seq[:n]``).

    The caches hold ``seq[start : start + length]``; the newest token is never in them before a forward reads it.
    """

    def __init__(self, model: nn.Module, idx: Tensor, max_new_tokens: int, quantize: str, compile: bool | None):
        self.net = quantization.decoding_copy(model, quantization.resolve_mode(model, quantize))
        self.plan = CompilePlan(self.net, compile, max_new_tokens)  # the same decision as plain decoding's
        self.step = self.plan.first_step()
        self.verify = _verify_step(self.net, self.plan.mode) if self.step is not None else None
        self.block = model.config.block_size
        T = idx.shape[1]
        self.seq = idx.new_empty(T + max_new_tokens)  # every token id, written in place
        self.seq[:T] = idx[0]
        self.n = T
        self.caches = self.net.make_caches(min(self.block, T + max_new_tokens))
        self.start = max(0, T - self.block)

    @property
    def length(self) -> int:
        return self.caches[0].length

    @property
    def pending(self) -> int:
        """Tokens of the text not yet in the caches: the prompt before the first forward, then the newest token."""
        return self.n - self.start - self.length

    def room(self) -> int:
        """How many drafts a verification may carry without passing the context (where plain decoding would
        restart its window, a plain step does it)."""
        return self.block - self.length - self.pending

    def plain_logits(self) -> Tensor:
        """Logits ``(1, V)`` of the next token, as :func:`tokennet.sampling.stream` computes them: the tokens not yet
        cached, after restarting the window from the last half context when the cache is full."""
        feed = self.seq[None, self.start + self.length : self.n]
        if self.length + feed.shape[1] > self.block:
            for cache in self.caches:
                cache.reset()
            self.start = self.n - self.block // 2
            feed = self.seq[None, self.start : self.n]
        if self.step is not None and feed.shape[1] == 1 and self.caches[0].k is not None:
            return self.step(feed, self.caches)
        started = time.perf_counter()
        hidden = self.net.forward_features(feed, caches=self.caches)  # (1, n, D)
        logits = self.net.forward_head(hidden[:, -1:])[:, -1]  # (1, V)
        if feed.shape[1] == 1:  # an eager plain step: timed for the compile plan
            self.step = self.plan.observe(time.perf_counter() - started, self.seq.numel() - self.n - 1) or self.step
            if self.step is not None and self.verify is None:  # the plan took the compiled step: verify compiled too
                self.verify = _verify_step(self.net, self.plan.mode)
        return logits

    def verify_logits(self, draft: Sequence[int]) -> Tensor:
        """The target's logits ``(k+1, V)`` at the newest token and at each of the ``k`` drafts: one forward over the
        tokens not yet cached (the prompt, at the first) and the drafts."""
        k = len(draft)
        feed = torch.cat([self.seq[self.n - self.pending : self.n], self.seq.new_tensor(draft)])[None]  # (1, P+k)
        if self.verify is not None and self.caches[0].k is not None:
            logits = self.verify(feed, self.caches)  # (P+k, V), compiled
            if logits is not None:
                return logits[-(k + 1):]
        hidden = self.net.forward_features(feed, caches=self.caches)  # (1, P+k, D)
        return self.net.forward_head(hidden[:, -(k + 1):])[0]  # (k+1, V)

    def keep(self, accepted: int, k: int) -> None:
        """Roll the rejected drafts' keys and values out of the caches: keep the text and the ``accepted`` drafts of
        the ``k`` just cached."""
        for cache in self.caches:
            cache.length -= k - accepted

    def append(self, token: int) -> None:
        self.seq[self.n] = token
        self.n += 1


@torch.inference_mode()
def stream_speculative(
    model: nn.Module,
    idx: Tensor,
    max_new_tokens: int,
    *,
    drafter: NgramDrafter | ModelDrafter,
    draft_tokens: int = 8,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop: Sequence[int] | int | None = None,
    generator: torch.Generator | None = None,
    quantize: str = "auto",
    compile: bool | None = None,
    stats: SpeculationStats | None = None,
    draft_length: DraftLength | None = None,
) -> Iterator[Tensor]:
    """Yield the next tokens ``(1,)`` one at a time, as :func:`tokennet.sampling.stream` does, decoded speculatively.

    Greedy output is plain greedy decoding's; sampled output is distributed as plain sampling's (not the same
    draws for a seed). One sequence (``idx`` of shape ``(1, T)``); stops after a stop token.

    Args:
        model: the target causal LM.
        idx: prompt token ids ``(1, T)``.
        max_new_tokens: how many tokens to add at most.
        drafter: where drafts come from (:class:`NgramDrafter`, :class:`ModelDrafter`).
        draft_tokens: the most tokens drafted in one round (1 … block_size − 1; the round's number adapts).
        temperature, top_k, top_p, stop, generator, quantize, compile: as in :func:`tokennet.sampling.generate`.
        stats: filled in as decoding goes (acceptance rate, verifications, plain steps).
        draft_length: the draft-length policy (default :class:`DraftLength` of ``draft_tokens``).
    """
    _check_decodes(model, "the model")
    validate_sampling(model, idx, max_new_tokens, temperature, top_k, top_p)
    if idx.shape[0] != 1:
        raise ConfigError(f"speculative decoding continues one sequence at a time, got a batch of {idx.shape[0]}")
    check_draft_tokens(draft_tokens, model.config.block_size)
    stats = SpeculationStats() if stats is None else stats
    policy = DraftLength(draft_tokens) if draft_length is None else draft_length
    stops = {stop} if isinstance(stop, int) else set(stop or [])
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    was_training = model.training
    model.eval()
    try:
        target = _Target(model, idx, max_new_tokens, quantize, compile)
        while stats.tokens < max_new_tokens:
            most = min(policy.k_max, target.room(), max_new_tokens - stats.tokens - 1)
            started = policy.clock()
            proposed, chosen = _draft(drafter, policy, target.seq[: target.n], most)
            if chosen.tokens:
                new = _verify(target, chosen, sampling, generator)
                drafter.rollback(target.n + len(new) - 1)
                stats.drafted, stats.accepted = stats.drafted + len(chosen.tokens), stats.accepted + len(new) - 1
                stats.verifications += 1
                policy.round_done(len(chosen.tokens), len(new) - 1, policy.clock() - started)
            else:
                one = target.pending == 1  # not the prompt's forward
                new = [int(sample_next(target.plain_logits(), **sampling, generator=generator)[0])]
                stats.plain_steps += 1
                policy.plain_done(policy.clock() - started if one else None,
                                  shadow=new[0] == proposed.tokens[0] if proposed.tokens else None)
            for token in new:
                target.append(token)
                stats.tokens += 1
                yield target.seq[target.n - 1 : target.n].clone()
                if token in stops:
                    return
    finally:
        model.train(was_training)


def _draft(drafter, policy: DraftLength, text: Tensor, most: int) -> tuple[Draft, Draft]:
    """What the drafter proposed (for the plain step's shadow check) and the drafts to verify (none: a plain step).

    A free drafter (prompt lookup) proposes up to ``most`` tokens at every step and the policy chooses how many of
    them to verify; a draft model, whose proposals cost forwards, proposes only the number the policy chooses."""
    if most < 1:
        return Draft([]), Draft([])
    if getattr(drafter, "free_to_propose", False):  # a drafter that does not say is a costly one
        proposed = drafter.propose(text, most)
        chosen = policy.choose(len(proposed.tokens)) if proposed.tokens else 0
        probs = None if proposed.probs is None else proposed.probs[:chosen]
        return proposed, Draft(proposed.tokens[:chosen], probs)
    chosen = policy.choose(most)
    return Draft([]), drafter.propose(text, chosen) if chosen else Draft([])


def _verify(target: _Target, draft: Draft, sampling: dict, generator: torch.Generator | None) -> list[int]:
    """One verification: the target's forward over the drafts, the rule, and the rejected drafts rolled back."""
    logits = target.verify_logits(draft.tokens)  # (k+1, V)
    if sampling["temperature"] < SAMPLING_EPS:
        new = accept_greedy(logits, draft.tokens)
    else:
        new = accept_sampled(next_token_probs(logits, **sampling), draft, generator)
    target.keep(len(new) - 1, len(draft.tokens))
    return new
