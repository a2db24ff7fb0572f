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

from ..data.shapes import (
    IMAGE_SIZE,
    ShapeCaptions,
    caption,
    caption_corpus,
    encode_captions,
    held_out_scenes,
    images_of,
    sample_scenes,
)
from ..models.registry import create_model
from ..run import read_tokenizer
from ..tasks.captioning import caption_images
from ..tokens.text import train_tokenizer
from .base import Job, Recipe, RecipeError, register_recipe

__all__ = ["FORMS"]

log = logging.getLogger(__name__)

FORMS = {"encoder-decoder": "captioner-small", "decoder-only": "captioner-prefix-small"}
TOKENIZER_VOCAB = 320


def _test_scenes(settings: dict[str, Any]):
    """The held-out test scenes of a run's settings."""
    return held_out_scenes(settings["seed"], settings["test_size"], settings["held_out_fraction"])


def _evaluate(model, tok, scenes, beam_size: int) -> dict[str, Any]:
    refs = [caption(s) for s in scenes]
    images = images_of(scenes, model.config.image_size)
    hyps = caption_images(model, tok, images, beam_size=beam_size)
    hits = [h == r for h, r in zip(hyps, refs, strict=True)]
    by_n: dict[int, list[bool]] = {}
    for s, ok in zip(scenes, hits, strict=True):
        by_n.setdefault(len(s.objects), []).append(ok)
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
        "errors": [f"{h!r} (expected {r!r})" for h, r, ok in zip(hyps, refs, hits, strict=True) if not ok][:10],
    }


def build(*, settings, model_overrides, train, options, data, device, out_dir) -> Job:
    if data not in (None, "", "embedded"):
        raise RecipeError("the caption recipe trains on its embedded shapes generator; it takes no data "
                          "(leave data unset)")
    form = options["form"]
    if form not in FORMS:
        raise RecipeError(f"form must be one of {', '.join(FORMS)}, got {form!r}")
    if model_overrides.get("image_size", IMAGE_SIZE) != IMAGE_SIZE or model_overrides.get("in_channels", 3) != 3:
        raise RecipeError(f"the shapes generator draws 3×{IMAGE_SIZE}×{IMAGE_SIZE} images; keep image_size="
                          f"{IMAGE_SIZE} and in_channels=3")
    if not 0 < options["held_out_fraction"] < 1 or options["test_size"] < 1 or options["val_size"] < 1:
        raise RecipeError("held_out_fraction must be in (0, 1); test_size and val_size >= 1")
    tok = read_tokenizer(out_dir) or train_tokenizer("bpe", caption_corpus(), vocab_size=TOKENIZER_VOCAB)
    ids = dict(vocab_size=tok.vocab_size, pad_id=tok.pad_id, bos_id=tok.bos_id, eos_id=tok.eos_id)
    model = create_model(FORMS[form], **{**model_overrides, **ids})
    seed, frac = train.seed, options["held_out_fraction"]
    src = ShapeCaptions(tok, train.batch_size, seed=seed, split_seed=seed, fraction=frac)
    # Validation: held-out combinations too (a different draw from the test set), for monitoring only.
    val = sample_scenes(options["val_size"], f"val-{seed}", held_out=True, split_seed=seed, fraction=frac)
    val_images = images_of(val)
    val_in, val_out = encode_captions([caption(s) for s in val], tok, tok.pad_id)
    val_refs = [caption(s) for s in val]
    torch.manual_seed(seed)
    log.info("caption (%s): vocab %d, %.2fM parameters", form, tok.vocab_size,
             sum(p.numel() for p in model.parameters()) / 1e6)

    def evaluate(m) -> dict[str, float]:
        dev = next(m.parameters()).device
        loss = float(m((val_images.to(dev), val_in.to(dev)), val_out.to(dev)).loss)
        hyps = caption_images(m, tok, val_images)
        em = 100.0 * sum(h == r for h, r in zip(hyps, val_refs, strict=True)) / len(val_refs)
        return {"val_loss": loss, "val_exact_match": em}

    def finish(m) -> dict[str, Any]:
        m.eval()
        s = {**settings, "seed": seed}
        return {"form": form, **_evaluate(m, tok, _test_scenes(s), options["beam_size"])}

    return Job(model=model.to(device), source=src, evaluate=evaluate, tokens_per_batch=train.batch_size,
               tokenizer=tok, finish=finish)


def evaluate_run(run, data) -> dict[str, Any]:
    """``tokennet eval``: exact caption match on the run's held-out test scenes."""
    if data is not None:
        raise RecipeError("the caption recipe evaluates on its embedded held-out scenes; it takes no other data")
    s = run.settings
    return _evaluate(run.model, run.tokenizer, _test_scenes(s), s["beam_size"])


register_recipe(Recipe(
    name="caption",
    description="image captioning of coloured shapes with held-out combinations; form=decoder-only for the "
    "prefix-mask form",
    model="captioner-small",
    build=build,
    options={"form": "encoder-decoder", "held_out_fraction": 0.2, "test_size": 1000, "val_size": 250,
             "beam_size": 1},
    model_defaults={"dim": 128, "num_layers": 2, "num_heads": 4, "dropout": 0.0},
    train_defaults={"max_iters": 4000, "batch_size": 64, "lr": 2e-3, "warmup_iters": 100, "eval_interval": 500,
                    "weight_decay": 0.05},
    evaluate_run=evaluate_run,
))
