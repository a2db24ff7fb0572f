"""Recipe ``seq2seq``: translate human-written dates into ISO 8601 with an encoder–decoder.

Data: the embedded generator of :mod:`tokennet.data.dates` ("3rd of March 1999", "Mar 3, 99",
"Wednesday, March 3rd, 1999", "3 mars 1999", ... → "1999-03-03"), fresh pairs every batch from the
training dates; validation and test pairs come from dates never seen in training. A character
tokenizer over the generator's alphabet serves source and target.

``--set arch=transformer`` (default) trains :class:`~tokennet.models.seq2seq.Seq2Seq`;
``--set arch=bahdanau`` trains the GRU + additive attention baseline
(:class:`~tokennet.models.bahdanau.Bahdanau`) on the same data, built from the shared settings
``dim``, ``num_layers``, ``dropout``, ``label_smoothing``, ``max_source_len``, ``max_target_len``;
the Transformer-only settings (``num_heads``, ``mlp_ratio``, ``norm``, ...) are then ignored.

``metrics.json``: ``exact_match``, ``bleu`` and ``chrf`` (sacrebleu; BLEU over characters, since an
ISO date is one word) on the test set with beam search (``beam_size``, ``alpha``), plus
``exact_match_greedy`` and the exact match of each source format. ``--data FILE`` for
``tokennet eval`` takes a TSV file of ``source<TAB>target`` lines.

Inference lives below the recipes, in :mod:`tokennet.tasks.translation` (``run.translate(text)``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from ..data.dates import DatePairs, DateTranslations, alphabet, encode_pairs
from ..data.text import DataError
from ..errors import RecipeError
from ..lifecycle import BuildContext, Job, Recipe, register_recipe
from ..models.registry import create_model, preset_info
from ..tasks.translation import translate_batch
from ..tokens.text import CharTokenizer

__all__ = ["text_metrics", "ARCHS"]

log = logging.getLogger(__name__)

ARCHS = ("transformer", "bahdanau")
_SHARED = ("dim", "num_layers", "dropout", "label_smoothing", "max_source_len", "max_target_len")


def _check_sacrebleu():
    try:
        import sacrebleu  # noqa: F401
    except ImportError:
        raise RecipeError("the seq2seq recipe reports BLEU and chrF with sacrebleu: pip install sacrebleu "
                          "(or pip install 'tokennet[data]')") from None


def text_metrics(hyps: list[str], refs: list[str]) -> dict[str, float]:
    """Exact match (%), BLEU over characters and chrF (sacrebleu), for single-reference outputs."""
    import sacrebleu

    if len(hyps) != len(refs) or not refs:
        raise ValueError(f"need as many hypotheses as references (> 0), got {len(hyps)} and {len(refs)}")
    exact_match = 100.0 * sum(hyp == ref for hyp, ref in zip(hyps, refs, strict=True)) / len(refs)
    bleu = sacrebleu.corpus_bleu(hyps, [refs], tokenize="char").score
    chrf = sacrebleu.corpus_chrf(hyps, [refs]).score
    return {"exact_match": exact_match, "bleu": bleu, "chrf": chrf}


def _evaluate_pairs(model, tok, triples, options) -> dict[str, Any]:
    srcs, refs = [t[0] for t in triples], [t[1] for t in triples]
    k, alpha = options["beam_size"], options["alpha"]
    hyps = translate_batch(model, tok, srcs, beam_size=k, alpha=alpha)
    m = text_metrics(hyps, refs)
    if k != 1:
        m["exact_match_greedy"] = text_metrics(translate_batch(model, tok, srcs, beam_size=1, alpha=0.0),
                                             refs)["exact_match"]
    by_fmt: dict[str, list[bool]] = {}
    for (_, ref, fmt), hyp in zip(triples, hyps, strict=True):
        by_fmt.setdefault(fmt, []).append(hyp == ref)
    if len(by_fmt) > 1:
        m["exact_match_by_format"] = {name: round(100.0 * sum(hits) / len(hits), 2)
                                       for name, hits in sorted(by_fmt.items())}
    m["errors"] = [f"{source!r} -> {output!r} (expected {expected!r})"
                   for source, output, expected in zip(srcs, hyps, refs, strict=True) if output != expected][:10]
    m["test_size"] = len(refs)
    return m


def build(ctx: BuildContext) -> Job:
    _check_sacrebleu()
    if ctx.source not in (None, "", "embedded"):
        raise RecipeError("the seq2seq recipe trains on its embedded date generator; a data file is only for "
                          "evaluating a run")
    options, train, spec = ctx.options, ctx.train, ctx.data
    arch = options["arch"]
    if arch not in ARCHS:
        raise RecipeError(f"arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    if options["beam_size"] < 1:
        raise RecipeError("beam_size must be >= 1")
    tok = ctx.tokenizer or CharTokenizer(alphabet())
    for k in ("vocab_size", "pad_id", "bos_id", "eos_id"):
        ctx.from_data(k, getattr(tok, k))
    ids = {k: ctx.model[k] for k in ("vocab_size", "pad_id", "bos_id", "eos_id")}
    if arch == "transformer":
        model = create_model("seq2seq-small", **ctx.model)
    else:
        model = create_model("bahdanau-small", **{k: ctx.model[k] for k in _SHARED if k in ctx.model}, **ids)
    seed = train.seed
    train_dates, val_dates, _ = spec.split()
    src = DatePairs(train_dates, tok, train.batch_size, seed=seed)
    val_pairs = spec.val_pairs()
    val_batch = encode_pairs(val_pairs, tok, tok.pad_id)
    torch.manual_seed(seed)
    log.info("seq2seq (%s): %d train / %d val dates, vocab %d, %.2fM parameters", arch, len(train_dates),
             len(val_dates), tok.vocab_size, sum(param.numel() for param in model.parameters()) / 1e6)

    def evaluate(m) -> dict[str, float]:
        dev = next(m.parameters()).device
        (sources, targets), y = val_batch
        loss = float(m((sources.to(dev), targets.to(dev)), y.to(dev)).loss)
        hyps = translate_batch(m, tok, [pair[0] for pair in val_pairs], beam_size=1, alpha=0.0)
        exact_match = 100.0 * sum(hyp == ref for hyp, (_, ref) in zip(hyps, val_pairs, strict=True)) / len(val_pairs)
        return {"val_loss": loss, "val_exact_match": exact_match}

    def finish(m) -> dict[str, Any]:  # noqa: ARG001
        return {"arch": arch}

    return Job(model=model.to(ctx.device), source=src, evaluate=evaluate, tokens_per_batch=train.batch_size,
               tokenizer=tok, finish=finish)


def unused(settings: dict[str, Any]) -> set[str]:
    """The GRU baseline (``arch=bahdanau``) is built from the shared settings only: the Transformer's own
    settings (heads, MLP, norms, positions, ...) do not apply to it."""
    if settings.get("arch") != "bahdanau":
        return set()
    family, preset, _ = preset_info("seq2seq-small")
    from ..models.registry import config_from_dict

    transformer = set(config_from_dict({"family": family, **preset}).to_dict()) - {"family"}
    return transformer - set(_SHARED) - {"vocab_size", "pad_id", "bos_id", "eos_id"}


def _read_tsv(path: str) -> list[tuple[str, str, str]]:
    tsv = Path(path)
    if not tsv.is_file():
        raise DataError(f"data file {path} does not exist (expected a TSV of source<TAB>target lines)")
    triples = []
    for n, line in enumerate(tsv.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 2:
            raise DataError(f"{path}:{n}: expected 'source<TAB>target', got {len(parts)} field(s)")
        triples.append((parts[0].strip(), parts[1].strip(), "file"))
    if not triples:
        raise DataError(f"{path} has no source<TAB>target lines")
    return triples


def evaluate_run(run, data) -> dict[str, Any]:
    """``tokennet eval``: test-set metrics of a trained run (or on a TSV file given as data)."""
    settings, model, tok = run.settings, run.model, run.tokenizer
    if data is None:
        triples = run.data.held_out()
    else:
        triples = _read_tsv(data)
        limit = model.config.max_source_len
        too_long = [t[0] for t in triples if not t[0] or len(tok.encode(t[0])) > limit]
        if too_long:
            raise DataError(f"{len(too_long)} source(s) are empty or longer than {limit} characters, "
                            f"e.g. {too_long[0]!r}")
    return _evaluate_pairs(model, tok, triples, settings)


register_recipe(Recipe(
    name="seq2seq",
    description="encoder–decoder translation of dates into ISO 8601 (embedded generator); arch=bahdanau for the "
    "RNN baseline",
    model="seq2seq-small",
    build=build,
    data=DateTranslations,
    option_help={
        "arch": "transformer (the encoder-decoder) or bahdanau (the RNN with additive attention)",
        "beam_size": "beam width when translating (1 = greedy)",
        "alpha": "beam search's length penalty exponent (0 = none)",
    },
    options={"arch": "transformer", "beam_size": 4, "alpha": 0.6},
    model_defaults={"dim": 128, "num_layers": 2, "num_heads": 4, "max_source_len": 40, "max_target_len": 16,
                    "dropout": 0.0},
    train_defaults={"max_iters": 1800, "batch_size": 64, "lr": 2e-3, "warmup_iters": 100, "eval_interval": 600,
                    "weight_decay": 0.01},
    evaluate_run=evaluate_run,
    headline=("exact_match", "bleu", "chrf"),
    unused=unused,
    variants={"bahdanau": {"arch": "bahdanau"}},
    smoke={"dim": 32, "num_layers": 1, "num_heads": 2, "batch_size": 16, "test_size": 40, "val_size": 16,
           "beam_size": 2},
))
