"""Checking a speculative-decoding request before anything runs: the mode, the draft length, the draft run.

Shared by ``tokennet generate`` (:mod:`tokennet.tasks.language`) and ``tokennet serve`` (:mod:`.app`): a draft run
must be a run of the target's own kind with the target's tokenizer (drafts are the target's token ids), and is
loaded once, on the target's device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import RunError
from ..run import Run, load
from ..speculative import SPECULATIVE_MODES, check_draft_tokens

__all__ = ["check_speculation"]


def check_speculation(run: Run, speculative: str, draft, draft_tokens: int, use_cache: bool = True) -> Run | None:
    """Refuse speculative settings that cannot run, before anything is printed; returns the draft run (loaded once),
    or None for n-gram drafts. ``draft`` alone asks for drafts from it."""
    mode = "draft" if speculative == "off" else speculative
    if mode not in SPECULATIVE_MODES:
        raise RunError(f"speculative must be one of {', '.join(SPECULATIVE_MODES)}, got {speculative!r}")
    if not use_cache:
        raise RunError("speculative decoding verifies drafts over the KV cache: it cannot decode without the cache")
    check_draft_tokens(draft_tokens, run.model.config.block_size)
    if mode == "ngram":
        if draft is not None:
            raise RunError("a draft run drafts only in speculative='draft' mode; n-gram drafts come from the text")
        return None
    return _draft_run(run, draft)


def _vocabulary(tokenizer) -> dict[str, Any]:
    """What decides a tokenizer's ids: its saved form without the chat template (a base model and its chat version
    share a vocabulary)."""
    data = dict(tokenizer.to_dict())
    if isinstance(data.get("tokennet"), dict):
        data["tokennet"] = {k: v for k, v in data["tokennet"].items() if not k.startswith("chat_template")}
    return data


def _draft_run(run: Run, draft: str | Path | Run | None) -> Run:
    """The draft run, loaded on the target's device; refused unless it is a language model with the same tokenizer."""
    if draft is None:
        raise RunError("speculative='draft' needs a draft run: a smaller language-model run with the same tokenizer")
    helper = draft if isinstance(draft, Run) else load(draft, device=run.device)
    if not isinstance(helper.task, type(run.task)):
        raise RunError(f"the draft run {helper.path} is {helper.task.a_name} run, not a language model: it cannot "
                       "draft tokens")
    if helper.tokenizer is None or _vocabulary(helper.tokenizer) != _vocabulary(run.tokenizer):
        raise RunError(f"the draft run {helper.path} and the run {run.path} have different tokenizers: drafts must "
                       "be the target's token ids")
    return helper
