"""Sampling from a causal language model with a KV cache.

The decode loop: one forward pass over the prompt fills each layer's key/value cache (the "prefill"),
then every step feeds only the newest token, whose query attends to all cached keys, so a step costs
O(T) instead of recomputing the whole prefix (O(T²)). Next tokens are chosen by greedy argmax
(``temperature=0``) or by sampling from ``softmax(logits / temperature)`` restricted to the ``top_k``
most likely tokens and/or the smallest set whose probability reaches ``top_p`` (nucleus sampling,
Holtzman et al. 2020, https://arxiv.org/abs/1904.09751).

Past the context length (``block_size``) the model sees a sliding window. Without the cache the window
moves by one token per step (the last ``block_size`` tokens). With the cache, when it is full it is
rebuilt from the last ``block_size // 2`` tokens, so the window moves in half-context jumps and each
rebuild costs one prefill; outputs then differ from the uncached window, which is the price of
keeping absolute positions valid.

``quantize="bf16"``, ``"int8"`` or ``"int4"`` decodes with a low-precision inference copy of the model (see
:mod:`tokennet.layers.quantize`); the model itself is never modified. The default, ``"auto"``, is ``"int4"`` for a
model holding a GGUF file's Q8_0/Q4_0/Q4_1 blocks in every linear layer (where the CPU's integer dot products run
them) and ``"none"`` for any other. The copy is kept with the model and
rebuilt as soon as any parameter changes (the model may keep training: a stale copy is never used). A
decoding step reads every weight once, so fewer bytes per weight make it faster.

Each step is the model's forward over the new token against the preallocated KV caches, the head over
the last position, and the choice of the next token; the token ids live in one preallocated buffer. By
default (``compile=None``: where the steps ahead repay the compilation, :class:`CompilePlan`; ``compile=True`` or
``TOKENNET_COMPILE=1`` always, ``compile=False`` or ``TOKENNET_COMPILE=0`` never) the steps after the
prompt run as one graph compiled by ``torch.compile``
(:class:`CompiledStep`): eager PyTorch spends most of a small model's step launching ~20 operations per
layer, and its matrix kernels read one-row products' weights far below memory speed; the compiled step
fuses each layer into a few C++ loops that read every weight once. The prompt itself (the prefill, a
matrix–matrix product) runs eagerly. Where the step does not compile (no C++ compiler, an operation Dynamo
cannot trace) it says so once in the log and decodes eagerly. The compile cost is paid once per machine:
Inductor keeps the generated code on disk (:func:`inductor_cache_dir`, ``~/.cache/tokennet/inductor`` unless
``TORCHINDUCTOR_CACHE_DIR`` or ``TOKENNET_CACHE`` says otherwise), and a later process loads it instead of
compiling again.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import itertools
import json
import logging
import math
import os
import time
import types
import weakref
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor, nn

from . import jsonio, step_store
from .attention.multihead import KVCache, one_query_attention, use_kernel
from .errors import ConfigError
from .fileio import atomic_write_text
from .layers import pinned
from .layers import quantize as quantization
from .layers.blockquant import symbolic_rows

__all__ = ["generate", "stream", "sample_next", "next_token_probs", "greedy_next", "SAMPLING_EPS", "CompiledStep",
           "VerifyStep",
           "compiled_step", "compile_default", "compile_mode", "CompilePlan", "inductor_cache_dir", "measure_speedup"]

logger = logging.getLogger(__name__)

_SERIAL = itertools.count()

# Inductor settings of the compiled step. realize_opcount_threshold: a pointwise result read by a matrix–vector
# product (the normalized hidden state) is stored once instead of being recomputed for every weight it meets
# (measured: the LM head 3× slower with the norm fused into its inner loop). size_asserts: the generated
# wrapper would check the size and strides of every weight at every step (~600 checks per step of a 30-layer
# model; measured in one process, alternating: ~15% of the fixed cost of a step).
INDUCTOR_OPTIONS = {"realize_opcount_threshold": 8, "size_asserts": False}


def compile_mode(compile: bool | None = None) -> str:
    """``"on"``, ``"off"`` or ``"auto"``: ``compile`` when given (True on, False off), else ``$TOKENNET_COMPILE``
    (``1``/``true``/``on``: on; ``0``/``false``/``no``/``off``: off — the test suite decodes eagerly,
    tests/conftest.py), else ``"auto"``: compile only where the steps ahead repay it (:class:`CompilePlan`)."""
    if compile is not None:
        return "on" if compile else "off"
    env = os.environ.get("TOKENNET_COMPILE")
    if env is None:
        return "auto"
    return "off" if env.strip().lower() in ("0", "false", "no", "off", "") else "on"


def compile_default(compile: bool | None = None) -> bool:
    """Whether a long-lived decoder (the serving engine) uses the compiled step: everything but ``"off"``
    (:func:`compile_mode`); a server's steps ahead are many."""
    return compile_mode(compile) != "off"


# What the auto mode assumes where it has measured nothing: the compiled step runs a small model's decoding step
# this many times faster than eager PyTorch (bench/results/compile-decisions.json measures it), and a compilation
# of a model never compiled on this machine takes this long (a warm Inductor cache: less; the last compile of the
# same model is remembered, _compile_seconds).
COMPILED_SPEEDUP = 2.0
UNMEASURED_COMPILE_S = 30.0


class CompilePlan:
    """Whether the decoding steps ahead repay compiling them, decided once per call and said once per reason.

    ``on`` compiles at once and ``off`` never; ``auto`` decodes the first :attr:`PROBE` tokens eagerly, timing them
    (the fastest is the estimate: the first steps also pay one-time costs), and then compiles only if the steps
    left would save more than the compilation costs::

        saved = steps_left · t_eager · (1 − 1 / COMPILED_SPEEDUP)   >   cost = the last compile of this model
                                                                          here (UNMEASURED_COMPILE_S if none)

    where ``cost`` is the compilation's, or — where an earlier process kept the step on this machine
    (:mod:`tokennet.step_store`) — the seconds loading it took here (about one), and the speedup is the one measured
    here for this model (the builder that keeps a step times it against the eager step; ``COMPILED_SPEEDUP`` where
    nothing was measured). A step already compiled in this process costs nothing and is taken at once. So a short
    answer never waits for a compilation or a load, a long one pays for it, a machine where the compiled step is no
    faster never compiles, and a later process takes a kept step after its first few tokens. ``declined`` is True
    when the plan decided against compiling (the caller may then build the step for later processes in the
    background: :func:`tokennet.serve.prebuild.spawn`)."""

    PROBE = 4

    def __init__(self, net: nn.Module, compile: bool | None, steps: int, rows: int = 1):
        self.net, self.steps, self.mode, self.rows = net, steps, compile_mode(compile), rows
        self.times: list[float] = []
        self.decided = self.mode != "auto"
        self.declined = False

    def first_step(self) -> CompiledStep | None:
        """The compiled step to start with: on, or auto with a step already compiled in this process."""
        if self.mode == "on":
            return compiled_step(self.net)
        ready = _STEPS.get(self.net, {}).get(CompiledStep)
        if self.mode == "auto" and ready is not None and ready.compiled:
            self.decided = True
            return ready
        return None

    def observe(self, seconds: float, steps_left: int) -> CompiledStep | None:
        """One eager decoding step took ``seconds``; the compiled step when it is now worth compiling (or loading)."""
        if self.decided:
            return None
        self.times.append(seconds)
        if len(self.times) < self.PROBE:
            return None
        self.decided = True
        eager = min(self.times)  # the first steps also pay one-time costs (allocations, kernel choice): the fastest
        measured = _remembered(self.net, "speedup")
        speedup = measured or COMPILED_SPEEDUP
        saved = steps_left * eager * (1 - 1 / speedup)
        kept = step_store.Artifact(CompiledStep.__name__, f"B{self.rows}", self.net).present()
        if kept:
            cost, how = _remembered(self.net, "load") or 2.0, "loading the step kept here"
        else:
            cost, how = _compile_seconds(self.net), "compiling"
            how += " (measured)" if cost is not None else " (not measured here yet)"
            cost = UNMEASURED_COMPILE_S if cost is None else cost
        pays = saved > cost
        self.declined = not pays and not kept
        _say_once(f"{'compiling' if pays else 'not compiling'} the decoding step: {steps_left} steps left at "
                  f"{1e3 * eager:.1f} ms, {speedup:.2f}x faster compiled ({'measured' if measured else 'assumed'}), "
                  f"would save ~{saved:.1f} s against ~{cost:.1f}"
                  f" s of {how}; --compile / --no-compile decide it yourself")
        return compiled_step(self.net) if pays else None


_SAID: set[str] = set()


def _say_once(message: str) -> None:
    key = message.split(":")[0]
    if key not in _SAID:
        _SAID.add(key)
        logger.info("%s", message)


def _signature(net: nn.Module) -> str:
    """What a compilation's cost depends on: the model's configuration and its layers' kinds (quantization)."""
    config = getattr(net, "config", None)
    described = json.dumps(config.to_dict(), sort_keys=True, default=str) if hasattr(config, "to_dict") else ""
    kinds = sorted({type(m).__name__ for m in net.modules()})
    return hashlib.sha256(f"{type(net).__name__}|{described}|{kinds}".encode()).hexdigest()[:16]


def _compile_times_file() -> str:
    return os.path.join(inductor_cache_dir(), "tokennet-compile-seconds.json")


def _compile_seconds(net: nn.Module) -> float | None:
    """The last compilation of this model's decoding step on this machine, in seconds (None: never measured)."""
    try:
        times = jsonio.load(_compile_times_file())
    except (OSError, ValueError):
        return None
    value = times.get(_signature(net)) if isinstance(times, dict) else None
    return float(value) if isinstance(value, (int, float)) and value >= 0 else None


def measure_speedup(net: nn.Module, step: CompiledStep, steps: int = 8) -> float:
    """How many times faster ``step`` (compiled, ready) decodes one token of ``net`` than the eager forward does here:
    the fastest of ``steps`` of each, over a short cache. Remembered for :class:`CompilePlan` (a machine where the
    compiled step is no faster never compiles or loads one)."""
    def fastest(decode) -> float:
        caches = net.make_caches(min(64, net.config.block_size))
        tok = torch.zeros(1, 1, dtype=torch.long, device=next(net.parameters()).device)
        best = math.inf
        with torch.inference_mode():
            net.forward_features(tok, caches=caches)
            for _ in range(steps):
                started = time.perf_counter()
                decode(tok, caches)
                best = min(best, time.perf_counter() - started)
        return best

    eager = fastest(lambda tok, caches: net.forward_head(net.forward_features(tok, caches=caches))[:, -1])
    speedup = eager / fastest(step)
    _remember_compile_seconds(net, speedup, "speedup")
    return speedup


def _remembered(net: nn.Module, what: str) -> float | None:
    """A measurement of this model's decoding step on this machine: ``"load"`` (seconds to load its kept step) or
    ``"speedup"`` (eager step time over compiled), None where none was made."""
    try:
        times = jsonio.load(_compile_times_file())
    except (OSError, ValueError):
        return None
    value = times.get(f"{_signature(net)}:{what}") if isinstance(times, dict) else None
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def _remember_compile_seconds(net: nn.Module, seconds: float, what: str | None = None) -> None:
    path = _compile_times_file()
    try:
        times = jsonio.load(path)
        times = times if isinstance(times, dict) else {}
    except (OSError, ValueError):
        times = {}
    times[_signature(net) if what is None else f"{_signature(net)}:{what}"] = round(seconds, 2 if what is None else 3)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write_text(path, json.dumps(times, indent=1) + "\n")
    except OSError as error:  # a read-only cache: the next process estimates again
        logger.debug("could not remember the compile time in %s: %s", path, error)


def inductor_cache_dir() -> str:
    """Where Inductor keeps compiled code across processes: ``$TORCHINDUCTOR_CACHE_DIR`` when set, else
    ``$TOKENNET_CACHE/inductor`` or ``~/.cache/tokennet/inductor`` (set when this module is imported, before
    Inductor first reads it, so the cache outlives a reboot's cleaning of /tmp, Inductor's own default)."""
    cache_dir = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not cache_dir:
        root = os.environ.get("TOKENNET_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tokennet")
        cache_dir = os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(root, "inductor")
    return cache_dir


inductor_cache_dir()


class CompiledStep:
    """One decoding step compiled by ``torch.compile``: a token per row against preallocated KV caches.

    ``step(tok (B, 1), caches) → logits (B, V)`` computes what ``net.forward_head(net.forward_features(tok,
    caches=caches))[:, -1]`` computes, as one Inductor graph: the norms, RoPE, the cache writes, attention, the
    residuals and every linear layer (through :func:`~tokennet.layers.quantize.gemv`: one fused loop per weight,
    read once) become a few C++ loops instead of ~20 PyTorch calls per layer. The caches are the same
    :class:`KVCache` objects eager prefill fills; the graph reads and writes their buffers in place. Their
    length (the number of cached tokens) and capacity are symbolic, so one compilation serves every step.

    The compiled graph is kept here (and Inductor's on-disk cache keeps the generated code across processes);
    ``compile_s`` is the time the first call took. When compilation fails (no C++ compiler, an unsupported
    operation), the step says so once in the log and runs eagerly: ``compiled`` is then False.

    An int4 copy (:mod:`tokennet.layers.pinned`) keeps its own layers: its float steps are C++ operations that the
    graph calls as they are, so the compiled step's logits are the eager forward's, bit for bit.

    Args:
        net: a causal LM with ``forward_features`` / ``forward_head`` (a decoding copy; its linear layers
            are traced through ``gemv``, but for a pinned copy's).
    """

    def __init__(self, net: nn.Module):
        self.eager = net
        self.net = copy.deepcopy(net, quantization._share_tensors(net))  # same tensors, GEMV linears
        if not pinned.is_pinned(net):  # a pinned copy keeps its own steps: the same floats as its eager forward
            quantization._replace_linears(self.net, quantization.GemvLinear)
            use_kernel(self.net, one_query_step_kernel)  # attention of one query, fused into the step's loops
        self._fns: dict[str, Callable] = {}  # variant → its compiled graph, loaded from the step store or built
        self.fn: Callable | None = None  # a compiled step to use instead of building one (tests: their own backend)
        self.compiled: bool | None = None  # None: not tried yet
        self.compile_s: float | None = None
        self.loaded_s: float | None = None  # the seconds the last graph took to load from the step store
        self._positions = torch.arange(0)

    def __getstate__(self) -> dict:
        """Without the compiled graphs: saving one graph (its guards' state reaches the step object) must not try
        to pickle the others."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_fns", "fn")}

    def artifact(self, variant: str) -> step_store.Artifact:
        """Where the graph of ``variant`` is kept across processes (:mod:`tokennet.step_store`)."""
        return step_store.Artifact(type(self).__name__, variant, self.eager)

    def load(self, variant: str) -> bool:
        """Load the graph of ``variant`` from the step store, if a fitting one is kept there; whether it is ready."""
        if variant in self._fns:
            return True
        started = time.perf_counter()
        loaded = self.artifact(variant).load(f_globals=type(self)._step.__globals__)
        if loaded is None:
            return False
        self._fns[variant] = functools.partial(loaded, self)
        self.compiled, self.loaded_s = True, time.perf_counter() - started
        _remember_compile_seconds(self.eager, self.loaded_s, "load")
        logger.info("loaded the compiled decoding step (%s) in %.2f s from %s", variant, self.loaded_s,
                    step_store.store_dir())
        return True

    def _build(self, variant: str, args: tuple) -> Callable:
        """Compile the graph of ``variant`` ahead of time and keep it in the step store; where it cannot be captured
        whole for the store, ``torch.compile`` as it is (Inductor's caches still spare a later process the code
        generation)."""
        method = types.MethodType(type(self)._step, self)  # a subclass's own step (the server's rows)
        try:
            built, _ = self.artifact(variant).build(method, args, INDUCTOR_OPTIONS)
            return functools.partial(built, self)
        except Exception as error:  # noqa: BLE001 - a step the ahead-of-time capture refuses: torch.compile's own
            first = (str(error).splitlines() or [""])[0][:160]
            logger.info("the decoding step is compiled for this process only (%s: %s)", type(error).__name__, first)
        # torch.compile keeps its compiled graphs per code object, so every CompiledStep would share (and
        # evict, past Dynamo's recompile limit) one list of graphs: give each its own copy of the code.
        code = type(self)._step.__code__.replace(co_name=f"_step_{next(_SERIAL)}")
        step = types.MethodType(types.FunctionType(code, type(self)._step.__globals__), self)
        # Dynamo checks its guards before every call, and on the decoding copy's hundreds of tensors that is a
        # visible share of a small model's step. The copy never changes under its step (a changed model gets a new
        # copy and a new step, decoding_copy), so only the guards on the step's own inputs are kept.
        return torch.compile(step, fullgraph=True, dynamic=False, options={
            **INDUCTOR_OPTIONS, "guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe})

    def _step(self, tok: Tensor, keys: Tensor, buffers: list[tuple[Tensor, Tensor]]) -> Tensor:
        caches = []
        for k, v in buffers:  # a KVCache over the given buffers, holding keys.shape[0] − 1 tokens
            cache = KVCache(k.shape[2])
            cache.k, cache.v, cache.length = k, v, keys.shape[0] - 1
            caches.append(cache)
        hidden = self.net.forward_features(tok, caches=caches)  # (B, 1, D)
        return self.net.forward_head(hidden)[:, -1]  # (B, V)

    def _run(self, variant: str, *args) -> Tensor | None:
        """The graph of ``variant`` on ``args``: loaded from the step store, or compiled at its first call (timed,
        logged once, kept in the store); None when it does not compile (``compiled`` is then False, and the
        caller runs its eager forward)."""
        graph = self._fns.get(variant)
        if graph is not None:
            try:
                return graph(*args)
            except step_store.StepMismatch as error:  # a kept step built for inputs of another form
                logger.info("rebuilding the compiled decoding step (%s): %s", variant, error)
                del self._fns[variant]
                return self._compile(variant, args)
            except RuntimeError as error:  # a step built here, outside the shapes its guards allow: eager this once
                if "GuardManager check failed" not in str(error):
                    raise
                _say_once(f"a compiled decoding step ({variant}): inputs outside the shapes it was traced for run "
                          "eagerly")
                return None
        if self.compiled is False or (self.fn is None and self.load(variant)):  # a step given (fn) is used as given
            return self._run(variant, *args) if self.compiled else None
        return self._compile(variant, args)

    def _compile(self, variant: str, args: tuple) -> Tensor | None:
        started = time.perf_counter()
        try:
            graph = self._build(variant, args) if self.fn is None else self.fn
            out = graph(*args)
        except (torch._dynamo.exc.TorchDynamoException, RuntimeError, OSError) as error:
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            logger.warning("torch.compile is unavailable for decoding (%s); decoding eagerly", first[:200])
            self.compiled = False
            return None
        self._fns[variant] = graph
        self.compiled, self.compile_s = True, time.perf_counter() - started
        _remember_compile_seconds(self.eager, self.compile_s)
        logger.info("compiled the decoding step in %.1f s, kept for later processes in %s (--no-compile decodes "
                    "eagerly)", self.compile_s, step_store.store_dir())
        return out

    @torch.inference_mode()
    def __call__(self, tok: Tensor, caches: list[KVCache]) -> Tensor:
        """Logits ``(B, V)`` of the token after ``tok (B, 1)``; its key and value join ``caches``."""
        n = caches[0].length + 1
        if self.compiled is False:
            return self.eager.forward_head(self.eager.forward_features(tok, caches=caches))[:, -1]
        if self._positions.numel() < n:
            self._positions = torch.arange(max(n, 2 * self._positions.numel()), device=tok.device)
        keys = self._positions[:n]  # only its length is read: the number of keys after this step
        torch._dynamo.mark_dynamic(keys, 0)
        # (B, 1) with strides (1, 1) (a column of a longer buffer has others), an inference tensor whoever made it:
        # the compiled graph's guards check both
        tok = tok.reshape(-1).clone()[:, None]
        buffers = []
        for cache in caches:
            for t in (cache.k, cache.v):
                if not hasattr(t, "_dynamo_dynamic_indices"):
                    torch._dynamo.mark_dynamic(t, 2)  # the capacity: one graph for every cache size
            buffers.append((cache.k, cache.v))
        logits = self._run(f"B{tok.shape[0]}", tok, keys, buffers)
        if logits is None:  # it does not compile (eager from now on), or not for these inputs (eager this once)
            return self.eager.forward_head(self.eager.forward_features(tok, caches=caches))[:, -1]
        for cache in caches:
            cache.length = n
        return logits


class VerifyStep(CompiledStep):
    """Speculative decoding's verification forward compiled: ``step(tok (1, K), caches) → logits (K, V)`` for the
    ``K`` tokens not yet cached (the newest token and ``K − 1`` drafts), each attending to the cache and to the
    tokens before it, as ``net.forward_head(net.forward_features(tok, caches=caches))[0]`` computes them. ``K`` is
    symbolic (from 2 on: one graph for every draft length), and so are the cache's length and capacity; the linear
    layers take matrix products (:func:`~tokennet.layers.blockquant.symbolic_rows`). Kept in the step store as the
    variant ``K`` (:mod:`tokennet.step_store`); eager (None) where it does not compile."""

    def _step(self, tok: Tensor, keys: Tensor, buffers: list[tuple[Tensor, Tensor]]) -> Tensor:
        caches = []
        for k, v in buffers:  # a KVCache over the given buffers, holding keys.shape[0] − K tokens
            cache = KVCache(k.shape[2])
            cache.k, cache.v, cache.length = k, v, keys.shape[0] - tok.shape[1]
            caches.append(cache)
        hidden = self.net.forward_features(tok, caches=caches)  # (1, K, D)
        return self.net.forward_head(hidden)[0]  # (K, V)

    @torch.inference_mode()
    def __call__(self, tok: Tensor, caches: list[KVCache]) -> Tensor | None:
        """Logits ``(K, V)`` after each of the tokens ``tok (1, K)``, K ≥ 2; their keys and values join ``caches``.
        None where the step does not compile (the caller runs its eager forward)."""
        if self.compiled is False:
            return None
        n = caches[0].length + tok.shape[1]
        if n >= caches[0].k.shape[2]:  # a cache filled to its capacity is another graph (its slices are the whole
            return None  # buffer): verified eagerly, rather than traced again for one verification
        if self._positions.numel() < n:
            self._positions = torch.arange(max(n, 2 * self._positions.numel()), device=tok.device)
        keys = self._positions[:n]
        torch._dynamo.mark_dynamic(keys, 0)
        tok = tok.clone()
        torch._dynamo.mark_dynamic(tok, 1)
        buffers = []
        for cache in caches:
            for t in (cache.k, cache.v):
                if not hasattr(t, "_dynamo_dynamic_indices"):
                    torch._dynamo.mark_dynamic(t, 2)
            buffers.append((cache.k, cache.v))
        with symbolic_rows():
            logits = self._run("K", tok, keys, buffers)
        if logits is not None:
            for cache in caches:
                cache.length = n
        return logits


def one_query_step_kernel(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, *, bias: Tensor | None,
                          dropout: float, return_weights: bool, is_causal: bool = False) -> Tensor | None:
    """The compiled decoding step's attention kernel (installed with :func:`~tokennet.attention.multihead.
    use_kernel`): one query per row is :func:`~tokennet.attention.multihead.one_query_attention`, whose sums
    Inductor fuses into the step's own loops, where a fused-attention kernel call per layer would cost more than
    the few thousand multiplications it does. A per-key mask ``(B, 1, 1, Nk)`` — the serving engine's rows at
    their own lengths — is fused in too. Every other call (the prompt, eager steps, a bias, dropout, the weights
    asked for) is left to the layer's own backend (None)."""
    one_row_mask = mask is None or (mask.dtype == torch.bool and mask.dim() == 4 and mask.shape[1] == 1
                                    and mask.shape[2] == 1)
    if (torch.compiler.is_compiling() and q.shape[2] == 1 and one_row_mask and bias is None and not return_weights
            and dropout == 0):
        return one_query_attention(q, k, v, mask)
    return None


# decoding copy → {step class: its step} (weak keys: a step lives no longer than its copy; every caller of one copy
# shares its compiled graphs)
_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def compiled_step(net: nn.Module, kind: type[CompiledStep] | None = None) -> CompiledStep:
    """The step of class ``kind`` (default :class:`CompiledStep`; the serving engine's ``RowsStep``) of a decoding
    copy, made once and kept with it."""
    kind = CompiledStep if kind is None else kind
    steps = _STEPS.setdefault(net, {})
    if kind not in steps:
        steps[kind] = kind(net)
    return steps[kind]


# A temperature below this is greedy (vLLM's _SAMPLING_EPS): dividing logits by 1e-40 overflows to inf,
# whose softmax is NaN.
SAMPLING_EPS = 1e-5


def next_token_probs(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> Tensor:
    """The distribution ``(B, V)`` sampling draws from: ``softmax(logits / temperature)`` over the ``top_k`` most
    likely tokens and the nucleus ``top_p`` (float32). Speculative decoding's rejection rule reads the same
    distributions (:mod:`tokennet.speculative`). ``temperature`` must be at least :data:`SAMPLING_EPS`."""
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p (the first always stays).
        drop_sorted = (probs.cumsum(dim=-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.softmax(logits, dim=-1)


def greedy_next(logits: Tensor) -> Tensor:
    """The most likely tokens ``(B,)`` of logits ``(B, V)`` (argmax, in float32 for low-precision logits)."""
    # bf16 logits (a quantized model): argmax is several times faster in float32, and the same.
    low = logits.dtype in (torch.bfloat16, torch.float16)
    return (logits.float() if low else logits).argmax(dim=-1)


def sample_next(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Choose next tokens ``(B,)`` from last-position logits ``(B, V)``; a temperature below
    :data:`SAMPLING_EPS` is greedy."""
    if temperature < SAMPLING_EPS:
        return greedy_next(logits)
    probs = next_token_probs(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _validate(model: nn.Module, idx: Tensor, max_new_tokens: int, temperature: float, top_k, top_p) -> None:
    if idx.dim() != 2 or idx.shape[1] < 1:
        raise ValueError(f"idx must be (B, T) token ids with T >= 1, got shape {tuple(idx.shape)}")
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not (temperature >= 0 and math.isfinite(temperature)):  # NaN fails every comparison: say so here
        raise ConfigError(f"temperature must be a number >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise ConfigError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not (0 < top_p <= 1):
        raise ConfigError(f"top_p must be in (0, 1], got {top_p}")
    if not hasattr(model, "forward_features") or not hasattr(model.config, "block_size"):
        raise ValueError(f"{type(model).__name__} is not a causal language model")


@torch.inference_mode()
def stream(
    model: nn.Module,
    idx: Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop: Sequence[int] | int | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    quantize: str = "auto",
    compile: bool | None = None,
) -> Iterator[Tensor]:
    """Yield the next tokens ``(B,)`` one step at a time; stops early when every row hit a stop token.

    Rows that already stopped keep yielding their stop token. Arguments as in :func:`generate`.
    """
    _validate(model, idx, max_new_tokens, temperature, top_k, top_p)
    quantize = quantization.resolve_mode(model, quantize)
    was_training = model.training
    model.eval()
    block = model.config.block_size
    stops = torch.tensor([stop] if isinstance(stop, int) else list(stop or []), device=idx.device)
    done = torch.zeros(idx.shape[0], dtype=torch.bool, device=idx.device)
    B, T = idx.shape
    seq = idx.new_empty(B, T + max_new_tokens)  # every token id, written in place (no per-step concatenation)
    seq[:, :T] = idx
    try:
        net = quantization.decoding_copy(model, quantize)  # fp32: packed linears; bf16, int8: quantized
        plan = CompilePlan(net, compile if use_cache else False, max_new_tokens, rows=B)
        step = plan.first_step()
        caches = net.make_caches(min(block, T + max_new_tokens)) if use_cache else None
        feed = seq[:, max(0, T - block) : T]
        for t in range(T, T + max_new_tokens):
            if use_cache and caches[0].length + feed.shape[1] > block:
                for cache in caches:  # sliding window: rebuild the cache from the recent half context
                    cache.reset()
                feed = seq[:, t - block // 2 : t]
            if step is not None and feed.shape[1] == 1 and caches[0].k is not None:  # a one-token prompt fills
                # the caches eagerly first (the compiled step marks their buffers, which must exist)
                logits = step(feed, caches)  # (B, V)
            else:  # the prompt (prefill), or decoding without the compiled step
                started = time.perf_counter()
                hidden = net.forward_features(feed, caches=caches)  # (B, t, D)
                logits = net.forward_head(hidden[:, -1:])[:, -1]  # (B, V): only the last position is needed
                if feed.shape[1] == 1:  # an eager decoding step: timed for the plan
                    step = plan.observe(time.perf_counter() - started, T + max_new_tokens - t - 1) or step
            nxt = sample_next(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
            if len(stops):
                first = stops[0]
                nxt = torch.where(done, first, nxt)
                done = done | torch.isin(nxt, stops)
            seq[:, t] = nxt
            feed = seq[:, t : t + 1] if use_cache else seq[:, max(0, t + 1 - block) : t + 1]
            yield nxt
            if len(stops) and bool(done.all()):
                return
    finally:
        model.train(was_training)


def generate(
    model: nn.Module,
    idx: Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop: Sequence[int] | int | None = None,
    use_cache: bool = True,
    callback: Callable[[Tensor], None] | None = None,
    generator: torch.Generator | None = None,
    quantize: str = "auto",
    compile: bool | None = None,
) -> Tensor:
    """Continue the token ids ``idx`` ``(B, T)`` by up to ``max_new_tokens``; returns ``(B, T + n)``.

    Args:
        model: a causal LM with ``forward_features``, ``forward_head``, ``make_caches`` (e.g. GPT).
        idx: prompt token ids.
        max_new_tokens: how many tokens to add at most.
        temperature: 0 for greedy decoding; otherwise logits are divided by it before sampling.
        top_k: sample only among the k most likely tokens.
        top_p: sample only within the smallest set of tokens whose probability reaches p.
        stop: token id(s) that end a row; generation ends when every row has stopped.
        use_cache: decode with the KV cache (False recomputes the whole window every step).
        callback: called with each step's new tokens ``(B,)`` (streaming).
        generator: random generator for reproducible sampling.
        quantize: ``"auto"`` (the default: ``"int4"`` for a model whose linear layers all hold a GGUF file's
            Q8_0/Q4_0/Q4_1 blocks, where the CPU has AVX-512 VNNI; ``"none"`` for every other,
            :func:`~tokennet.layers.quantize.resolve_mode`), ``"none"`` (the model as it is), ``"bf16"``,
            ``"int8"`` (per-channel weight scales;
            int8 activations in groups of 32 with integer dot products where the CPU has AVX-512 VNNI) or
            ``"int4"`` (4-bit blocks; a GGUF run's own Q4_0/Q4_1/Q8_0 blocks as they are, multiplied by int8
            activations with integer dot products where the CPU has AVX-512 VNNI): decode with a
            low-precision copy of every linear layer and the LM head, kept with the model
            (see :mod:`tokennet.layers.quantize`).
        compile: decode one token at a time with a :class:`CompiledStep` (``torch.compile``; eager, with one
            note in the log, where it is unavailable). None (the default): where the steps ahead repay the
            compilation (:class:`CompilePlan`; ``TOKENNET_COMPILE`` 1 or 0 forces it on or off); True: always;
            False: eager. The first compilation on a machine takes tens of seconds
            for a 30-layer model; later processes load it from Inductor's disk cache
            (:func:`inductor_cache_dir`).
    """
    out = [idx]
    for nxt in stream(model, idx, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                      stop=stop, use_cache=use_cache, generator=generator, quantize=quantize, compile=compile):
        out.append(nxt[:, None])
        if callback is not None:
            callback(nxt)
    return torch.cat(out, dim=1)

