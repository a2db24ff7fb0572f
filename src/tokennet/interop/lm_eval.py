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
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import RunError

try:
    # lm-eval fills its registry with its own models only while the registry is empty: register them first,
    # or ours would hide them all (local-completions, hf, ...)
    import lm_eval.models  # noqa: F401
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
except ImportError as e:  # pragma: no cover - only without lm-eval
    raise ImportError("tokennet's lm-eval model needs the evaluation harness: pip install lm-eval") from e

__all__ = ["TokennetLM", "main"]

log = logging.getLogger(__name__)


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

    def __init__(self, run: Any, device: str = "cpu", batch_size: int | str = 8, max_length: int | None = None,
                 quantize: str = "none", **_ignored: Any):
        super().__init__()
        from ..device import resolve_device
        from ..run import Run, load

        if isinstance(run, Run):
            self.run = run
        else:
            if not Path(str(run)).is_dir():
                raise RunError(f"{run}: no such run directory")
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
        self.max_length = min(int(max_length), self.block) if max_length else self.block
        self.batch_size = 8 if str(batch_size).startswith("auto") else max(1, int(batch_size))
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
            n = max(len(r) for r in rows) - 1
            x = torch.zeros(len(rows), n, dtype=torch.long)  # right padding: causal, so it never reaches a real token
            for r, row in enumerate(rows):
                x[r, :len(row) - 1] = torch.tensor(row[:-1])
            with torch.no_grad():
                logp = F.log_softmax(self.model(x.to(self.dev)).logits.float(), dim=-1).cpu()  # (B, n, V)
            for r, (row, (_, k)) in enumerate(zip(rows, chunk)):
                k = min(k, len(row) - 1)
                pos = torch.arange(len(row) - 1 - k, len(row) - 1)  # the logits that predict the last k tokens
                tgt = torch.tensor(row[-k:])
                lp = logp[r, pos]  # (k, V)
                out.append((float(lp.gather(1, tgt[:, None]).sum()), bool((lp.argmax(-1) == tgt).all())))
        return out

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """``requests``: ``((context, continuation), context_enc, continuation_enc)`` as lm-eval built them."""
        pairs = []
        for _, ctx, cont in requests:
            if not cont:
                raise RunError("lm-eval asked for the likelihood of an empty continuation")
            pairs.append((ctx + cont, len(cont)))
        res = self._score(pairs)
        for (key, _, _), r in zip(requests, res):
            self.cache_hook.add_partial("loglikelihood", key, r)
        return res

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """The log-likelihood of each whole text, every token predicted once (lm-eval's rolling windows)."""
        out = []
        for req in requests:
            (text,) = req.args
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=self.tok_encode(text), prefix_token=self.prefix_token_id, max_seq_len=self.max_length,
                context_len=1)]
            # a window (context, targets): the targets follow context + targets[:-1]
            total = sum(lp for lp, _ in self._score([(ctx + tgt, len(tgt)) for ctx, tgt in windows]))
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
            out.append(total)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy (temperature 0, lm-eval's default) or sampled continuations, cut at the first stop string."""
        from ..sampling import stream

        out = []
        for req in requests:
            context, kw = req.args
            kw = dict(kw or {})
            until = kw.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(kw.get("max_gen_toks", 256))
            temperature = float(kw.get("temperature", 0.0)) if kw.get("do_sample", True) else 0.0
            ids = (self.tok_encode(context) or [self.prefix_token_id])[-(self.block - 1):]
            max_new = max(1, min(max_new, self.block - len(ids)))
            g = torch.Generator(device=self.dev).manual_seed(int(kw.get("seed", 0)))
            new: list[int] = []
            text = ""
            for nxt in stream(self.model, torch.tensor([ids], device=self.dev), max_new, temperature=temperature,
                              generator=g, quantize=self.quantize, stop=getattr(self.tok, "stop_ids", None)):
                new.append(int(nxt[0]))
                text = self.tok.decode_continuation(new)
                if any(u and u in text for u in until):
                    break
            for u in until:
                if u:
                    text = text.split(u)[0]
            self.cache_hook.add_partial("generate_until", (context, req.args[1]), text)
            out.append(text)
        return out


def main(argv: list[str] | None = None) -> int:
    """lm-eval's command line with the ``tokennet`` model registered: ``tokennet lm-eval --model tokennet ...``."""
    from lm_eval.__main__ import cli_evaluate

    saved = sys.argv
    sys.argv = ["lm-eval", *(sys.argv[1:] if argv is None else argv)]
    try:
        cli_evaluate()
    finally:
        sys.argv = saved
    return 0


if __name__ == "__main__":  # python -m tokennet.interop.lm_eval ...
    raise SystemExit(main())
