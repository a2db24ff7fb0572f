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

import json
import logging
from pathlib import Path
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
from ..data.text import DataError
from ..decode import beam_search, greedy_search, strip_special
from ..models.registry import create_model, load_pretrained
from ..tokens.text import load_tokenizer, train_tokenizer
from .base import Job, Recipe, RecipeError, register_recipe

__all__ = ["FORMS", "caption_images", "load_caption_images", "caption_files"]

log = logging.getLogger(__name__)

FORMS = {"encoder-decoder": "captioner-small", "decoder-only": "captioner-prefix-small"}
TOKENIZER_VOCAB = 320


def caption_images(model, tok, images: torch.Tensor, *, beam_size: int = 1, batch_size: int = 256) -> list[str]:
    """Generate a caption for each image ``(B, 3, H, W)`` (greedy, or beam search when beam_size > 1)."""
    dev = next(model.parameters()).device
    out: list[str] = []
    for i in range(0, len(images), batch_size):
        x = images[i : i + batch_size].to(dev)
        ids = greedy_search(model, x) if beam_size == 1 else beam_search(model, x, beam_size=beam_size)
        out.extend(tok.decode(r) for r in strip_special(ids, model.config.eos_id, model.config.pad_id))
    return out


def load_caption_images(paths, image_size: int = IMAGE_SIZE, in_channels: int = 3) -> torch.Tensor:
    """Read image files for a captioning model: ``(B, C, H, W)`` in [0, 1].

    Grey images are repeated to 3 channels, an alpha channel is dropped (see
    :func:`~tokennet.data.image_files.read_image`); the size must be the model's ``image_size`` — nothing is
    resized, a different size is a ``DataError`` that says what is expected.
    """
    from ..data.image_files import read_image

    out = []
    for p in paths:
        x = read_image(p, channels=in_channels)
        if tuple(x.shape[1:]) != (image_size, image_size):
            raise DataError(f"{p}: the model takes {image_size}×{image_size} images, got {x.shape[1]}×{x.shape[2]}; "
                            "resize it first")
        out.append(x)
    if not out:
        raise DataError("no image given")
    return torch.stack(out)


def caption_files(run_dir: str | Path, paths, *, beam_size: int | None = None,
                  device: str | torch.device = "cpu") -> list[str]:
    """Caption image files with a trained ``caption`` run (its model, tokenizer and beam size)."""
    run_dir = Path(run_dir)
    run_file = run_dir / "run.json"
    settings = json.loads(run_file.read_text())["settings"] if run_file.is_file() else {}
    model = load_pretrained(run_dir).to(device).eval()
    tok = load_tokenizer(run_dir)
    images = load_caption_images(paths, model.config.image_size, model.config.in_channels)
    k = beam_size if beam_size is not None else settings.get("beam_size", 1)
    with torch.no_grad():
        return caption_images(model, tok, images, beam_size=k)


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
        raise RecipeError("the caption recipe trains on its embedded shapes generator; --data is not supported")
    form = options["form"]
    if form not in FORMS:
        raise RecipeError(f"form must be one of {', '.join(FORMS)}, got {form!r}")
    if model_overrides.get("image_size", IMAGE_SIZE) != IMAGE_SIZE or model_overrides.get("in_channels", 3) != 3:
        raise RecipeError(f"the shapes generator draws 3×{IMAGE_SIZE}×{IMAGE_SIZE} images; keep image_size="
                          f"{IMAGE_SIZE} and in_channels=3")
    if not 0 < options["held_out_fraction"] < 1 or options["test_size"] < 1 or options["val_size"] < 1:
        raise RecipeError("held_out_fraction must be in (0, 1); test_size and val_size >= 1")
    tok_path = out_dir / "tokenizer.json"
    tok = load_tokenizer(tok_path) if tok_path.is_file() else train_tokenizer("bpe", caption_corpus(),
                                                                              vocab_size=TOKENIZER_VOCAB)
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


def evaluate_run(run_dir, data, device) -> dict[str, Any]:
    """``tokennet eval``: exact caption match on the run's held-out test scenes."""
    if data is not None:
        raise RecipeError("the caption recipe evaluates on its embedded held-out scenes; --data is not supported")
    run_dir = Path(run_dir)
    s = json.loads((run_dir / "run.json").read_text())["settings"]
    model = load_pretrained(run_dir).to(device).eval()
    tok = load_tokenizer(run_dir)
    return _evaluate(model, tok, _test_scenes(s), s["beam_size"])


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
