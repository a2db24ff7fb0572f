"""A tokennet run as a model of EleutherAI's evaluation harness (lm-eval): ``--model tokennet --model_args run=DIR``.

lm-eval asks a model three things; for a causal language model over tokens ``x_1 … x_n`` they are

    loglikelihood(context, continuation) = Σ_{t ∈ continuation} log p(x_t | x_{<t}), and whether every x_t
                                           of the continuation is the argmax (``is_greedy``)
    loglikelihood_rolling(text)          = Σ_t log p(x_t | x_{<t}) over the whole text (perplexity tasks),
                                           in windows of the context as lm-eval's own rolling windows
    generate_until(context, until=...)   = the continuation, sampled (greedy at temperature 0) until a stop string

A multiple-choice task scores each choice by ``loglikelihood`` and picks the largest (``acc``) or the
largest per byte of the choice (``acc_norm``). The class builds on lm-eval's ``TemplateLM``, so a
(context, continuation) pair is tokenized exactly as lm-eval tokenizes it for any other backend
(the context's trailing spaces move to the continuation; the whole is encoded, and the continuation is
what follows the context's tokens) — the same token ids that ``--model local-completions`` sends to
``tokennet serve``, which is why the two paths give the same accuracy.

lm-eval has no plugin discovery for models: importing this module registers ``tokennet``. The
``tokennet lm-eval ARGS…`` command (or ``python -m tokennet.interop.lm_eval ARGS…``) imports it and then runs
lm-eval's own command line with ``ARGS`` unchanged. Needs ``pip install lm-eval``.
"""

from __future__ import annotations

import logging
import math
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import ConfigError, RunError, TokennetError, one_line
from ..jsonio import MAX_JSON_DEPTH, json_depth
from ..jsonio import loads as json_loads

try:
    # lm-eval fills its registry with its own models only while the registry is empty: register them first,
    # or ours would hide them all (local-completions, hf, ...)
    import lm_eval.models  # noqa: F401
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
except ImportError as e:  # pragma: no cover - only without lm-eval
    raise ImportError("tokennet's lm-eval model needs the evaluation harness: pip install lm-eval") from e

__all__ = ["TokennetLM", "LMEvalError", "check_argv", "check_model_args", "parse_model_args", "main"]

log = logging.getLogger(__name__)

QUANTIZE = ("none", "bf16", "int8")
# What lm-eval itself adds to every model's arguments (from its --batch_size, --max_batch_size, --device and
# --trust_remote_code): accepted here, the last two unused.
LM_EVAL_ADDS = ("max_batch_size", "trust_remote_code")
MODEL_ARGS = ("run", "device", "batch_size", "max_length", "quantize")


class LMEvalError(TokennetError, ValueError):
    """lm-eval refused its command line (no tasks found, a malformed argument, ...): the user's to fix."""


def _count(name: str, value: Any, *, allow_auto: bool = False) -> int | str | None:
    """``value`` (as lm-eval parsed it: a number, or the text itself) as a positive integer, or ConfigError."""
    if value is None:
        return None
    if allow_auto and isinstance(value, str) and value.strip().startswith("auto"):
        return value.strip()
    n: Any = value
    if isinstance(n, str):
        text = n.strip().strip("'\"")
        try:
            n = int(text)
        except ValueError:
            try:
                n = float(text)
            except ValueError:
                n = None
    if isinstance(n, float) and math.isfinite(n) and n.is_integer():
        n = int(n)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        want = "a positive integer" + (' or "auto"' if allow_auto else "")
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise ConfigError(f"lm-eval model_args: {name}={shown} is not {want}")
    return n


def _is_dir(path: Any) -> bool:
    """Whether ``path`` names a directory (a name too long for the file system, or with a NUL, names none)."""
    try:
        return Path(str(path)).is_dir()
    except (OSError, ValueError):
        return False


def check_model_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """The ``tokennet`` model's arguments (``--model_args run=DIR,...`` as lm-eval parsed them, plus what lm-eval
    adds) checked and typed: ``run`` (required), ``device``, ``batch_size``, ``max_length``, ``quantize``. An
    unknown name, a missing ``run`` or a value of the wrong type is a :class:`ConfigError` naming it."""
    unknown = sorted(str(k) for k in args if k not in MODEL_ARGS and k not in LM_EVAL_ADDS)
    if unknown:
        raise ConfigError(f"lm-eval model_args: unknown argument(s) {', '.join(map(repr, unknown))[:200]} for the "
                          f"tokennet model (it takes {', '.join(MODEL_ARGS)})")
    run = args.get("run")
    if run is None or (isinstance(run, str) and not run.strip()):
        raise ConfigError("lm-eval model_args: the tokennet model needs run=DIR (a tokennet run directory), "
                          "e.g. --model_args run=runs/gpt")
    out = {"run": run, "device": args.get("device") or "cpu",
           "batch_size": _count("batch_size", args.get("batch_size", 8), allow_auto=True) or 8,
           "max_length": _count("max_length", args.get("max_length")), "quantize": args.get("quantize") or "none"}
    if not isinstance(out["device"], str) or not re.fullmatch(r"auto|cpu|(cpu|cuda|mps)(:\d{1,4})?", out["device"]):
        raise ConfigError(f"lm-eval model_args: device={str(out['device'])[:40]!r} is not a device name "
                          "(auto, cpu, cuda, cuda:N or mps)")
    if out["quantize"] not in QUANTIZE:
        raise ConfigError(f"lm-eval model_args: quantize={str(out['quantize'])[:40]!r} is not one of "
                          f"{', '.join(QUANTIZE)}")
    return out


@register_model("tokennet")
class TokennetLM(TemplateLM):
    """A tokennet language-model run for lm-eval.

    Args:
        run: the run directory (``tokennet train`` / ``tokennet import``), or a loaded :class:`~tokennet.run.Run`.
        device: where the model runs ("cpu", "cuda", "auto").
        batch_size: sequences scored per forward ("auto" is read as 8).
        max_length: the most tokens a forward reads (default: the model's context, ``block_size``).
        quantize: decode ``generate_until`` with a low-precision copy ("none", "bf16", "int8").
    """

    def __init__(self, run: Any = None, device: str = "cpu", batch_size: int | str = 8, max_length: int | None = None,
                 quantize: str = "none", **lm_eval_adds: Any):
        super().__init__()
        from ..device import resolve_device
        from ..run import Run, load

        if not isinstance(run, Run):
            args = check_model_args({"run": run, "device": device, "batch_size": batch_size,
                                     "max_length": max_length, "quantize": quantize, **lm_eval_adds})
            run, device, batch_size, max_length, quantize = (args[k] for k in MODEL_ARGS)
        else:
            max_length = _count("max_length", max_length)
            batch_size = _count("batch_size", batch_size, allow_auto=True) or 8
        if isinstance(run, Run):
            self.run = run
        else:
            if not _is_dir(run):
                raise RunError(f"{str(run)[:200]}: no such run directory")
            if str(device).startswith("cuda") and not torch.cuda.is_available():
                # lm-eval's command line asks for cuda:0 unless told otherwise (its HF model falls back the same way)
                log.warning("device %s requested but CUDA is not available: running on the CPU", device)
                device = "cpu"
            self.run = load(run, device=str(resolve_device(device or "auto")))
        model, tok = self.run.model, self.run.tokenizer
        if tok is None or not hasattr(model.config, "block_size"):
            raise RunError(f"{self.run.path} is not a language-model run with a tokenizer: lm-eval scores text")
        self.model, self.tok = model.eval(), tok
        self.block = model.config.block_size
        self.max_length = min(max_length, self.block) if max_length else self.block
        self.batch_size = 8 if isinstance(batch_size, str) else batch_size  # "auto" is read as 8
        self.quantize = quantize
        self.dev = next(model.parameters()).device

    # -- tokens ------------------------------------------------------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return self.tok.eos_id

    @property
    def prefix_token_id(self) -> int:
        """What an empty context is conditioned on: the tokenizer's begin-of-sequence token."""
        return self.tok.bos_id

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """The run's own tokenization (with the special tokens its tokenizer adds itself, as ``tokennet serve``)."""
        return self.tok.encode(string)

    def tok_decode(self, tokens: list[int], **kwargs) -> str:
        return self.tok.decode(tokens)

    # -- scoring -----------------------------------------------------------------------------------------------

    def _score(self, pairs: list[tuple[list[int], int]]) -> list[tuple[float, bool]]:
        """For each ``(tokens, k)``: the summed log-probability of the last ``k`` tokens given those before them,
        and whether each is the argmax. The tokens are cut to the last ``max_length + 1`` (lm-eval's left
        truncation of a long context)."""
        out: list[tuple[float, bool]] = []
        for i in range(0, len(pairs), self.batch_size):
            chunk = pairs[i:i + self.batch_size]
            rows = [toks[-(self.max_length + 1):] for toks, _ in chunk]
            n = max(len(seq) for seq in rows) - 1
            x = torch.zeros(len(rows), n, dtype=torch.long)  # right padding: causal, so it never reaches a real token
            for row_index, row in enumerate(rows):
                x[row_index, :len(row) - 1] = torch.tensor(row[:-1])
            with torch.no_grad():
                logp = F.log_softmax(self.model(x.to(self.dev)).logits.float(), dim=-1).cpu()  # (B, n, V)
            for row_index, (row, (_, k)) in enumerate(zip(rows, chunk)):
                k = min(k, len(row) - 1)
                pos = torch.arange(len(row) - 1 - k, len(row) - 1)  # the logits that predict the last k tokens
                tgt = torch.tensor(row[-k:])
                target_logp = logp[row_index, pos]  # (k, V)
                out.append((float(target_logp.gather(1, tgt[:, None]).sum()),
                            bool((target_logp.argmax(-1) == tgt).all())))
        return out

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """``requests``: ``((context, continuation), context_enc, continuation_enc)`` as lm-eval built them."""
        pairs = []
        for _, ctx, cont in requests:
            if not cont:
                raise RunError("lm-eval asked for the likelihood of an empty continuation")
            pairs.append((ctx + cont, len(cont)))
        res = self._score(pairs)
        for (key, _, _), result in zip(requests, res):
            self.cache_hook.add_partial("loglikelihood", key, result)
        return res

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """The log-likelihood of each whole text, every token predicted once (lm-eval's rolling windows)."""
        out = []
        for req in requests:
            (text,) = req.args
            windows = [make_disjoint_window(window) for window in get_rolling_token_windows(
                token_list=self.tok_encode(text), prefix_token=self.prefix_token_id, max_seq_len=self.max_length,
                context_len=1)]
            # a window (context, targets): the targets follow context + targets[:-1]
            total = sum(logp for logp, _ in self._score([(ctx + tgt, len(tgt)) for ctx, tgt in windows]))
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
            out.append(total)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy (temperature 0, lm-eval's default) or sampled continuations, cut at the first stop string."""
        from ..sampling import stream

        out = []
        for req in requests:
            context, gen_kwargs = req.args
            gen_kwargs = dict(gen_kwargs or {})
            until = gen_kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(gen_kwargs.get("max_gen_toks", 256))
            temperature = float(gen_kwargs.get("temperature", 0.0)) if gen_kwargs.get("do_sample", True) else 0.0
            ids = (self.tok_encode(context) or [self.prefix_token_id])[-(self.block - 1):]
            max_new = max(1, min(max_new, self.block - len(ids)))
            gen = torch.Generator(device=self.dev).manual_seed(int(gen_kwargs.get("seed", 0)))
            new: list[int] = []
            text = ""
            for nxt in stream(self.model, torch.tensor([ids], device=self.dev), max_new, temperature=temperature,
                              generator=gen, quantize=self.quantize, stop=getattr(self.tok, "stop_ids", None)):
                new.append(int(nxt[0]))
                text = self.tok.decode_continuation(new)
                if any(stop and stop in text for stop in until):
                    break
            for stop in until:
                if stop:
                    text = text.split(stop)[0]
            self.cache_hook.add_partial("generate_until", (context, req.args[1]), text)
            out.append(text)
        return out


def _split_top_level(text: str) -> list[str]:
    """``text`` split at commas outside brackets and quotes (how lm-eval splits ``key=value,key=value``)."""
    parts, depth, quote, start = [], 0, None, 0
    for i, char in enumerate(text):
        if quote is not None:
            quote = None if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in "[({":
            depth += 1
        elif char in "])}":
            depth = max(depth - 1, 0)
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [part for part in parts if part]


def _model_args_in(argv: list[str]) -> tuple[str | None, list[str]]:
    """The ``--model`` and the ``--model_args`` strings of lm-eval's command line ``argv``."""
    model, values, i = None, [], 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--model", "--model_args", "-a"):
            j = i + 1
            while j < len(argv) and not argv[j].startswith("-") and (j == i + 1 or arg != "--model"):
                j += 1
            if arg == "--model":
                model = argv[i + 1] if j > i + 1 else model
            else:
                values += argv[i + 1:j]
            i = j
            continue
        if arg.startswith("--model="):
            model = arg.split("=", 1)[1]
        elif arg.startswith("--model_args="):
            values.append(arg.split("=", 1)[1])
        i += 1
    return model, values


def parse_model_args(values: list[str]) -> dict[str, Any]:
    """``--model_args`` strings (one JSON object, or ``key=value`` items) as a dict of strings, or ConfigError."""
    args: dict[str, Any] = {}
    for n, text in enumerate(values):
        if n == 0 and text.lstrip().startswith("{"):
            try:
                obj = json_loads(text, what="lm-eval model_args")
            except ValueError as err:
                raise ConfigError(f"lm-eval model_args: not a JSON object: {one_line(err)[:200]}") from None
            if not isinstance(obj, dict):
                raise ConfigError("lm-eval model_args: not a JSON object")
            args.update(obj)
            continue
        for item in _split_top_level(text):
            if "=" not in item:
                raise ConfigError(f"lm-eval model_args: expected key=value, got {item[:40]!r}")
            key, value = item.split("=", 1)
            value = value.strip()
            quoted = len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'"
            args[key] = value[1:-1] if quoted else value
    return args


def check_argv(argv: list[str]) -> None:
    """What tokennet can check of lm-eval's command line before lm-eval reads its task index (a minute): no
    argument nested deeper than JSON's bound, and for ``--model tokennet`` its model_args (and that the run
    directory exists). One :class:`ConfigError` / :class:`RunError` line, or nothing."""
    for arg in argv:
        if json_depth(arg) > MAX_JSON_DEPTH:
            raise ConfigError(f"lm-eval argument {arg[:20]!r}...: nested deeper than {MAX_JSON_DEPTH} levels")
    model, values = _model_args_in(argv)
    if model != "tokennet":
        return
    run = check_model_args(parse_model_args(values))["run"]
    if not _is_dir(run):
        raise RunError(f"{str(run)[:200]}: no such run directory")


def _raised_by_lm_eval(e: BaseException) -> bool:
    """Whether the innermost lm-eval or tokennet frame of ``e``'s traceback is lm-eval's (lm-eval refused its
    input), not tokennet's (where anything but a TokennetError is a bug)."""
    frame_tb, last = e.__traceback__, None
    while frame_tb is not None:
        name = frame_tb.tb_frame.f_globals.get("__name__", "")
        if name.split(".")[0] in ("lm_eval", "tokennet"):
            last = name
        frame_tb = frame_tb.tb_next
    return last is not None and last.startswith("lm_eval")


def main(argv: list[str] | None = None) -> int:
    """lm-eval's command line with the ``tokennet`` model registered: ``tokennet lm-eval --model tokennet ...``.

    The tokennet model's arguments are checked first (:func:`check_argv`); a ``ValueError`` lm-eval raises
    itself (no tasks found, a malformed argument) comes back as one :class:`LMEvalError` line."""
    from lm_eval.__main__ import cli_evaluate

    argv = list(sys.argv[1:] if argv is None else argv)
    check_argv(argv)
    saved = sys.argv
    sys.argv = ["lm-eval", *argv]
    try:
        cli_evaluate()
    except TokennetError:
        raise
    except (ValueError, RecursionError) as err:
        if not _raised_by_lm_eval(err):
            raise
        raise LMEvalError(f"lm-eval: {one_line(err)[:300]}") from err
    finally:
        sys.argv = saved
    return 0


if __name__ == "__main__":  # python -m tokennet.interop.lm_eval ...
    raise SystemExit(main())
