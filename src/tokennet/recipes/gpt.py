"""Recipes ``gpt`` (byte-level BPE) and ``gpt-char`` (characters): a causal LM on a text corpus.

Data (:class:`~tokennet.data.text.TextCorpus`): an embedded corpus — ``shakespeare`` (Tiny
Shakespeare, 1.1 MB, the default of ``gpt-char``) or ``python-docs`` (the Python language reference that
ships with CPython, 0.46 MB, the default of ``gpt``) — or ``--data`` a text file, a directory or a glob.
The first ``1 - val_fraction`` of the token stream trains, the rest validates; ``metrics.json`` reports
``val_loss`` (nats per token), ``val_perplexity`` and a sample. ``--set reverse=true`` trains and validates on the
same two parts read backwards (the text reversed, for ``gpt-char``), so its ``val_loss`` compares with the forward
run's on the same characters (the lecture: "The statistics are different. It's not like a reversible sequence";
measured: ``bench/text_direction.py``); its sample reads backwards too.

Fine-tuning (``--init SOURCE``: a run, a Hugging Face directory, a GGUF file): the model and tokenizer are the
source's; ``block_size`` is then the training window (at most the model's context). ``--data`` may also be
a chat file (:class:`~tokennet.data.chats.ChatConversations`: ``{"messages": [...]}`` JSON lines, rendered
with the source's chat template, the loss on the assistant's tokens only; a seeded ``val_fraction`` of the
conversations validates). ``--set lora_rank=R`` trains LoRA adapters only
(:class:`~tokennet.lifecycle.recipe.FineTune`).

``gpt-char`` on Tiny Shakespeare is nanoGPT's ``shakespeare_char`` CPU example, with a 150-s default budget on 2
cores; measured: ``docs/experiments/gpt.md``.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from ..data.chats import ChatBatches, ChatConversations, is_chat_file, read_chats
from ..data.text import LMBatches, TextCorpus
from ..errors import DataError
from ..lifecycle import BuildContext, Job, Recipe, register_recipe
from ..models.registry import create_model
from ..sampling import generate
from ..tokens.text import train_tokenizer

log = logging.getLogger(__name__)

SAMPLE_PROMPT = "\n"


def lm_eval(model, batches: list) -> dict[str, float]:
    """Mean next-token cross-entropy over fixed batches."""
    dev = next(model.parameters()).device
    losses = [float(model(x.to(dev), y.to(dev)).loss) for x, y in batches]
    return {"val_loss": sum(losses) / len(losses)}


def make_data(source: str | None, settings: dict[str, Any]):
    """A chat file (JSON lines of ``{"messages": ...}``) or a text corpus, by what ``--data`` holds."""
    if is_chat_file(source):
        if settings.get("reverse"):
            raise DataError("reverse=true reads a text corpus backwards; a chat file's conversations cannot be")
        return ChatConversations(source=source, val_fraction=settings["val_fraction"], seed=settings["seed"])
    return TextCorpus.from_settings(source, settings)


def _pad(tok) -> int:
    """The id fed at padded positions of chat batches (any id: their targets are ignored)."""
    pad = getattr(tok, "pad_id", None)
    return pad if isinstance(pad, int) and pad >= 0 else 0


def window(settings: dict[str, Any], model) -> int:
    """The training window: ``block_size``, at most the model's context (a fine-tuned model's may be 8192)."""
    return min(settings["block_size"], model.config.block_size)


def _model_and_tokenizer(ctx: BuildContext, text: str | None):
    """A fresh model with a tokenizer trained on the corpus, or the ``--init`` source's model and tokenizer."""
    if ctx.init is not None:
        if ctx.init.tokenizer is None:
            raise DataError(f"{ctx.init.path} has no tokenizer: a language model starts from a source with one")
        return ctx.init.model, ctx.init.tokenizer
    if text is None:
        raise DataError("chat data fine-tunes a model with its own tokenizer and chat template: give --init")
    tok = ctx.tokenizer  # resuming: the vocabulary must be the one the checkpoint was trained with
    kind = ctx.options["tokenizer"]
    if tok is None:
        if kind == "char":
            tok = train_tokenizer("char", text)
        elif kind == "bpe":
            tok = train_tokenizer("bpe", text, vocab_size=ctx.options["vocab_size"])
        else:
            raise DataError(f"tokenizer must be 'char' or 'bpe', got {kind!r}")
    return create_model("gpt", **{**ctx.model, "vocab_size": tok.vocab_size}), tok


def build(ctx: BuildContext) -> Job:
    t = ctx.train
    if isinstance(ctx.data, ChatConversations):
        model, tok = _model_and_tokenizer(ctx, None)
        T = window(ctx.settings, model)
        train_chats, val_chats = ctx.data.split(tok)
        src = ChatBatches(train_chats, T, t.batch_size, pad_id=_pad(tok), seed=t.seed)
        val_batches = ChatBatches(val_chats, T, t.batch_size, pad_id=_pad(tok)).eval_batches()
        log.info("chats %s: %d train / %d validation conversations; model %.2fM parameters", ctx.data.source,
                 len(train_chats), len(val_chats), model.num_parameters() / 1e6)
    else:
        corpus: TextCorpus = ctx.data
        text = corpus.read()
        model, tok = _model_and_tokenizer(ctx, text)
        T = window(ctx.settings, model)
        ids = torch.tensor(tok.encode(text), dtype=torch.long)
        train_ids, val_ids = corpus.split(ids, T)
        src = LMBatches(train_ids, T, t.batch_size, seed=t.seed)
        torch.manual_seed(t.seed)
        val_batches = LMBatches(val_ids, T, t.batch_size, seed=t.seed + 1).eval_batches(ctx.options["eval_iters"])
        log.info("corpus %s: %d chars → %d tokens (%s, vocab %d); model %.2fM parameters", corpus.source,
                 len(text), len(ids), getattr(tok, "kind", "imported"), tok.vocab_size, model.num_parameters() / 1e6)

    def finish(m) -> dict[str, Any]:
        n = ctx.options["sample_tokens"]
        if n <= 0:
            return {}
        rng = torch.Generator(device=ctx.device).manual_seed(t.seed)
        prompt = torch.tensor([tok.encode(SAMPLE_PROMPT) or [tok.bos_id]], device=ctx.device)
        out = generate(m, prompt, n, temperature=0.8, top_k=None, generator=rng)
        return {"sample": tok.decode(out[0].tolist())}

    return Job(model=model.to(ctx.device), source=src, evaluate=lambda m: lm_eval(m, val_batches),
               tokens_per_batch=t.batch_size * T, tokenizer=tok, finish=finish)


def evaluate_run(run, data) -> dict[str, Any]:
    """``tokennet eval``: validation loss of a trained run on its split (or on the whole of another corpus)."""
    model, tok, settings = run.model, run.tokenizer, run.settings
    T = window(settings, model)
    spec = run.data if data is None else make_data(data, settings)
    with torch.no_grad():
        if isinstance(spec, ChatConversations):  # conversations, the loss on the replies
            chats = spec.held_out(tok) if data is None else read_chats(data, tok)
            m = lm_eval(model, ChatBatches(chats, T, settings["batch_size"], pad_id=_pad(tok)).eval_batches())
        else:  # the run's validation split, or the whole of another corpus
            ids = spec.held_out(tok, T) if data is None else spec.stream(tok)
            m = lm_eval(model, LMBatches(ids, T, settings["batch_size"], seed=settings["seed"] + 1)
                        .eval_batches(settings["eval_iters"]))
    m["val_perplexity"] = math.exp(m["val_loss"])
    return m


def unused(settings: dict[str, Any]) -> set[str]:
    """A character vocabulary is the corpus's characters: ``vocab_size`` applies to BPE only."""
    return {"vocab_size"} if settings.get("tokenizer") == "char" else set()


_COMMON_OPTS = {"eval_iters": 20, "sample_tokens": 400}


def smoke_data(directory) -> str:
    """A small corpus (numbered lines of a pangram, 17 kB) for the registry tests."""
    from pathlib import Path

    corpus = Path(directory) / "corpus.txt"
    corpus.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(300)))
    return str(corpus)

_SMOKE = {"dim": 32, "num_layers": 1, "num_heads": 2, "block_size": 16, "batch_size": 8, "eval_iters": 2,
          "sample_tokens": 8}

register_recipe(Recipe(
    name="gpt",
    description="GPT on text with a byte-level BPE tokenizer trained on the corpus (default: Python's docs)",
    model="gpt",
    build=build,
    data=TextCorpus,
    make_data=make_data,
    init=True,
    default_data="python-docs",
    option_help={
        "tokenizer": "bpe (byte-level BPE trained on the corpus) or char (the corpus's characters)",
        "vocab_size": "the BPE vocabulary's size (the tokenizer is trained to it; not for char)",
        "eval_iters": "validation batches per evaluation",
        "sample_tokens": "tokens of the sample printed after training",
    },
    options={"tokenizer": "bpe", "vocab_size": 1024, **_COMMON_OPTS},
    model_defaults={"dim": 128, "num_layers": 4, "num_heads": 4, "block_size": 128, "dropout": 0.1},
    # Muon + WSD: val loss 4.04 after 300 steps against 4.23 with AdamW + cosine, and a more readable sample.
    train_defaults={"max_iters": 100_000, "time_budget": 150.0, "batch_size": 16, "lr": 2e-3, "warmup_iters": 100,
                    "eval_interval": 250, "optimizer": "muon", "muon_lr": 0.02, "schedule": "wsd"},
    evaluate_run=evaluate_run,
    headline=("val_loss", "val_perplexity"),
    unused=unused,
    smoke={**_SMOKE, "vocab_size": 300},
    smoke_data=smoke_data,
))

register_recipe(Recipe(
    name="gpt-char",
    description="GPT on text, character level (nanoGPT's shakespeare_char; default: Tiny Shakespeare, embedded)",
    model="gpt",
    build=build,
    data=TextCorpus,
    make_data=make_data,
    init=True,
    default_data="shakespeare",
    option_help={
        "tokenizer": "bpe (byte-level BPE trained on the corpus) or char (the corpus's characters)",
        "vocab_size": "the BPE vocabulary's size (the tokenizer is trained to it; not for char)",
        "eval_iters": "validation batches per evaluation",
        "sample_tokens": "tokens of the sample printed after training",
    },
    options={"tokenizer": "char", "vocab_size": 0, **_COMMON_OPTS},
    # Muon for the hidden matrices + QK-norm + a warm-up–stable–decay schedule: on Tiny Shakespeare, val loss
    # 1.817 after 400 steps against 2.218 with AdamW + cosine (bench/gpt_train.py ablation). Block 64 × batch 32
    # (the same 2,048 tokens a step as 128 × 16, cheaper attention), Muon lr 0.03 and a 20-step warm-up: the settings
    # that reach nanoGPT's 1.886 soonest (bench/gpt_train.py budget --recipe-defaults; docs/experiments/gpt.md).
    model_defaults={"dim": 128, "num_layers": 4, "num_heads": 4, "block_size": 64, "dropout": 0.0, "bias": False,
                    "qk_norm": True},
    train_defaults={"max_iters": 100_000, "time_budget": 150.0, "batch_size": 32, "lr": 3e-3, "min_lr": 3e-4,
                    "warmup_iters": 20, "eval_interval": 250, "optimizer": "muon", "muon_lr": 0.03,
                    "schedule": "wsd"},
    evaluate_run=evaluate_run,
    headline=("val_loss", "val_perplexity"),
    unused=unused,
    smoke=_SMOKE,
    smoke_data=smoke_data,
))
