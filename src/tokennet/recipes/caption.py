"""Recipe ``caption``: describe images of coloured shapes, with held-out combinations of objects.

Data: the embedded generator of :mod:`tokennet.data.shapes` (48×48 images, one to three shapes,
captions such as "a small red circle above a large blue square"); training scenes never contain a
held-out combination of object kinds, the test set contains only those. A byte-level BPE tokenizer is
trained on the caption language, so each caption word is one token.

``--set form=encoder-decoder`` (default) trains :class:`~tokennet.models.captioner.Captioner`
(ViT encoder + text decoder with cross-attention); ``--set form=decoder-only`` trains
:class:`~tokennet.models.captioner.PrefixCaptioner` (one stack over ``[image; text]`` under the prefix
mask) from the same settings.

``metrics.json``: ``exact_match`` (% of held-out test images whose generated caption equals the
reference exactly), ``exact_match_by_objects`` (by number of shapes), ``token_accuracy`` and a few
errors. ``tokennet eval RUN_DIR`` recomputes them.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from ..data.shapes import IMAGE_SIZE, ShapeCaptions, ShapeScenes, caption, caption_corpus, encode_captions, images_of
from ..errors import RecipeError
from ..lifecycle import BuildContext, Job, Recipe, register_recipe
from ..models.registry import create_model
from ..tasks.captioning import caption_images
from ..tokens.text import train_tokenizer

__all__ = ["FORMS"]

log = logging.getLogger(__name__)

FORMS = {"encoder-decoder": "captioner-small", "decoder-only": "captioner-prefix-small"}
TOKENIZER_VOCAB = 320


def _evaluate(model, tok, scenes, beam_size: int) -> dict[str, Any]:
    refs = [caption(scene) for scene in scenes]
    images = images_of(scenes, model.config.image_size)
    hyps = caption_images(model, tok, images, beam_size=beam_size)
    hits = [hyp == ref for hyp, ref in zip(hyps, refs, strict=True)]
    by_n: dict[int, list[bool]] = {}
    for scene, ok in zip(scenes, hits, strict=True):
        by_n.setdefault(len(scene.objects), []).append(ok)
    # Token accuracy under teacher forcing: how close the misses are.
    dev = next(model.parameters()).device
    tgt_in, tgt_out = encode_captions(refs, tok, tok.pad_id)
    with torch.no_grad():
        logits = model((images.to(dev), tgt_in.to(dev))).logits
    keep = tgt_out.to(dev) != -100
    tok_acc = float((logits.argmax(-1) == tgt_out.to(dev))[keep].float().mean())
    return {
        "exact_match": 100.0 * sum(hits) / len(hits),
        "exact_match_by_objects": {str(n): round(100.0 * sum(v) / len(v), 2) for n, v in sorted(by_n.items())},
        "token_accuracy": 100.0 * tok_acc,
        "test_size": len(scenes),
        "errors": [f"{hyp!r} (expected {ref!r})" for hyp, ref, ok in zip(hyps, refs, hits, strict=True) if not ok][:10],
    }


def build(ctx: BuildContext) -> Job:
    if ctx.source not in (None, "", "embedded"):
        raise RecipeError("the caption recipe trains on its embedded shapes generator; it takes no data "
                          "(leave data unset)")
    options, train, spec = ctx.options, ctx.train, ctx.data
    form = options["form"]
    if form not in FORMS:
        raise RecipeError(f"form must be one of {', '.join(FORMS)}, got {form!r}")
    ctx.from_data("image_size", IMAGE_SIZE)  # the generator draws 3 × 48 × 48 images
    ctx.from_data("in_channels", 3)
    tok = ctx.tokenizer or train_tokenizer("bpe", caption_corpus(), vocab_size=TOKENIZER_VOCAB)
    for k in ("vocab_size", "pad_id", "bos_id", "eos_id"):
        ctx.from_data(k, getattr(tok, k))
    model = create_model(FORMS[form], **ctx.model)
    seed, frac = spec.seed, spec.held_out_fraction
    src = ShapeCaptions(tok, train.batch_size, seed=seed, split_seed=seed, fraction=frac)
    # Validation: held-out combinations too (a different draw from the test set), for monitoring only.
    val = spec.val_scenes()
    val_images = images_of(val)
    val_in, val_out = encode_captions([caption(scene) for scene in val], tok, tok.pad_id)
    val_refs = [caption(scene) for scene in val]
    torch.manual_seed(seed)
    log.info("caption (%s): vocab %d, %.2fM parameters", form, tok.vocab_size,
             sum(param.numel() for param in model.parameters()) / 1e6)

    def evaluate(m) -> dict[str, float]:
        dev = next(m.parameters()).device
        loss = float(m((val_images.to(dev), val_in.to(dev)), val_out.to(dev)).loss)
        hyps = caption_images(m, tok, val_images)
        exact = 100.0 * sum(hyp == ref for hyp, ref in zip(hyps, val_refs, strict=True)) / len(val_refs)
        return {"val_loss": loss, "val_exact_match": exact}

    def finish(m) -> dict[str, Any]:  # noqa: ARG001
        return {"form": form}

    return Job(model=model.to(ctx.device), source=src, evaluate=evaluate, tokens_per_batch=train.batch_size,
               tokenizer=tok, finish=finish)


def evaluate_run(run, data) -> dict[str, Any]:
    """``tokennet eval``: exact caption match on the run's held-out test scenes."""
    if data is not None:
        raise RecipeError("the caption recipe evaluates on its embedded held-out scenes; it takes no other data")
    return _evaluate(run.model, run.tokenizer, run.data.held_out(), run.settings["beam_size"])


register_recipe(Recipe(
    name="caption",
    description="image captioning of coloured shapes with held-out combinations; form=decoder-only for the "
    "prefix-mask form",
    model="captioner-small",
    build=build,
    data=ShapeScenes,
    option_help={
        "form": "encoder-decoder (a ViT encoder, a text decoder with cross-attention) or decoder-only (one stack "
                "over image and text)",
        "beam_size": "beam width when captioning (1 = greedy)",
    },
    options={"form": "encoder-decoder", "beam_size": 1},
    model_defaults={"dim": 128, "num_layers": 2, "num_heads": 4, "dropout": 0.0},
    train_defaults={"max_iters": 4000, "batch_size": 64, "lr": 2e-3, "warmup_iters": 100, "eval_interval": 500,
                    "weight_decay": 0.05},
    evaluate_run=evaluate_run,
    headline=("exact_match", "token_accuracy"),
    variants={"decoder-only": {"form": "decoder-only"}},
    smoke={"dim": 32, "num_layers": 1, "num_heads": 2, "batch_size": 16, "test_size": 24, "val_size": 8},
))
