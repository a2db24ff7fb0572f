"""Questions about a picture: ``run.answer(images, questions)``, where the question looks, and the report panel.

The task serves the question-answering transformer and its CNN baseline (:mod:`tokennet.models.vqa`). Its
verb answers questions (text) about images (tensors or files of the model's size, RGB); ``tokennet generate
RUN --image FILE --prompt "how many birds are there?"`` prints the answer. Its pictures are the lecture's
claim made visible — *"when you get a new question, you'll just attend to the parts of the input signal
that matter"*: the summary token's row of each layer's attention, over the patches, drawn on the image, per
layer and head and rolled out through the layers (Abnar & Zuidema 2020). For a CNN run the picture is the
answer's class activation map (each unit's vote) and one unit's receptive field.

:func:`attention_mass` measures what the pictures show: the share of the question's attention to the image
that lands on the patches of the objects it asks about, divided by those patches' share of the image.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..data.image_files import read_images
from ..data.vqa import QASet, encode_questions, object_patches
from ..errors import DataError, RunError
from ..viz.explore.pictures import QuestionExplorer
from ..viz.vqa import question_rollout
from .base import HELP, Input, Option, Task, as_paths, image_file_bad_inputs, register_task, verb
from .example_files import Example, take
from .vqa_heads import EVAL_BATCH, head_statistics, predict, question_maps

if TYPE_CHECKING:
    from ..run import Run

__all__ = ["VisualQuestionAnswering", "predict", "exact_match", "attention_mass", "attention_vs_others",
           "sink_weights", "counted_mass", "fit_rest", "patch_grouping", "two_corner_picture", "question_rollout",
           "object_patches", "load_question_images"]



# -- evaluation -------------------------------------------------------------------------------------------------
def exact_match(model, qa: QASet, words, max_len: int, *, prefix: str = "") -> dict[str, float]:
    """``exact_match`` (% of questions answered exactly) and ``exact_match_<template>`` per template, each
    named with ``prefix`` (``cnn_exact_match_count``, ...)."""
    pred = predict(model, qa.images, encode_questions(qa.questions, words, max_len))
    hit = (pred == qa.answers).float()
    out = {f"{prefix}exact_match": round(100.0 * float(hit.mean()), 3)}
    for t in sorted(set(qa.templates)):
        sel = torch.tensor([x == t for x in qa.templates])
        out[f"{prefix}exact_match_{t}"] = round(100.0 * float(hit[sel].mean()), 3)
    return out


SPARSE = 2  # questions about at most this many objects: where "looking at them" can be far above their share


@torch.no_grad()
def attention_mass(model, qa: QASet, words, *, limit: int = 500) -> dict[str, float]:
    """How much of the question's attention to the image lands on the objects it asks about.

    For each held-out question with objects (a count of 0 has none): ``mass`` = the share of the summary
    token's attention over the patches (renormalized over the patches) that falls on the patches its objects
    overlap; ``share`` = those patches' share of all patches; the ratio of their means is 1 for a model that
    looks everywhere alike and at most ``1 / share``. Attention is rolled out through the layers
    (:func:`~tokennet.viz.vqa.question_rollout`), or taken in one layer (the mean of its heads).

    Returns:
        ``attention_mass_ratio``: the rolled-out ratio over the questions about one or two objects (a colour, a
        species, two corners, a count of 1 or 2 — a question about many objects has a low ceiling);
        ``attention_mass`` and ``attention_object_share``, its two means; ``attention_mass_ratio_<template>``:
        the rolled-out ratio over all of a template's questions; ``attention_mass_ratio_layer<ℓ>``: layer ℓ's
        ratio over the questions about one or two objects.
    """
    config = model.config
    idx = [i for i in range(min(limit, len(qa))) if qa.boxes and qa.boxes[i]]
    if not idx:
        return {}
    images = qa.images[idx]
    questions = encode_questions([qa.questions[i] for i in idx], words, config.max_question_len)
    dev = next(model.parameters()).device
    rolls, layers = [], []
    for start in range(0, len(idx), EVAL_BATCH):
        maps = [m.float() for m in model.attention_maps((images[start:start + EVAL_BATCH].to(dev),
                                                         questions[start:start + EVAL_BATCH].to(dev)))["self"]]
        rolls.append(question_rollout(maps, config.num_text).cpu())
        # per layer (b, N): the summary's row, mean of heads
        rows = [m[:, :, 0, config.num_text:].mean(1) for m in maps]
        layers.append(torch.stack([layer_row / layer_row.sum(-1, keepdim=True).clamp_min(1e-12)
                                   for layer_row in rows], 1).cpu())
    roll, per_layer = torch.cat(rolls), torch.cat(layers)  # (n, N), (n, L, N)
    mass, share, sparse, templates, layer_mass = [], [], [], [], []
    for row, lrow, i in zip(roll, per_layer, idx, strict=True):
        patches = object_patches(qa.boxes[i], config.grid, config.patch_size)
        mass.append(float(row[patches].sum()))
        layer_mass.append(lrow[:, patches].sum(-1))  # (L,)
        share.append(len(patches) / config.num_patches)
        sparse.append(len(qa.boxes[i]) <= SPARSE)
        templates.append(qa.templates[i])
    mass_t, share_t, sparse_t, layer_mass_t = (torch.tensor(mass), torch.tensor(share), torch.tensor(sparse),
                                               torch.stack(layer_mass))
    out = {}
    if sparse_t.any():
        out.update({"attention_mass_ratio": round(float(mass_t[sparse_t].mean() / share_t[sparse_t].mean()), 4),
                    "attention_mass": round(float(mass_t[sparse_t].mean()), 4),
                    "attention_object_share": round(float(share_t[sparse_t].mean()), 4)})
        for layer in range(layer_mass_t.shape[1]):
            out[f"attention_mass_ratio_layer{layer}"] = round(
                float(layer_mass_t[sparse_t, layer].mean() / share_t[sparse_t].mean()), 4)
    for template in sorted(set(templates)):
        sel = torch.tensor([x == template for x in templates])
        out[f"attention_mass_ratio_{template}"] = round(float(mass_t[sel].mean() / share_t[sel].mean()), 4)
    return out


@torch.no_grad()
def attention_vs_others(model, qa: QASet, words, *, limit: int = 500) -> dict[str, float]:
    """Does the question's attention follow *the question*, or just the animals? The control is the picture's
    other animals.

    For each held-out question about at least one animal, in a picture with at least one other animal: ``a`` =
    the mean, over the animals it asks about, of the mass that the summary token's rolled-out attention over the
    patches (:func:`~tokennet.viz.vqa.question_rollout`) puts on one animal's patches; ``o`` = the same mean over
    the picture's *other* animals. A model that looks at every animal alike, whatever is asked, has
    ``E[a] / E[o] = 1`` however well it finds animals; one that looks only at the asked ones, ``∞``.

    Returns:
        ``attention_vs_other_animals`` (``E[a] / E[o]`` over those questions), ``…_<template>`` per template,
        ``…_layer<ℓ>`` from layer ℓ alone (the mean of its heads, renormalized over the patches); and
        ``attention_image_share`` (``…_layer<ℓ>``): the share of the summary token's attention row (each layer,
        mean of heads) that goes to the patches at all, the rest staying on the question's words and the sink.
    """
    config = model.config
    n = min(limit, len(qa))
    idx = [i for i in range(n) if qa.boxes and qa.boxes[i] and qa.other_boxes and qa.other_boxes[i]]
    out: dict[str, float] = {}
    if n:
        maps = question_maps(model, qa, list(range(n)), words)
        share = torch.stack([m[:, :, 0, config.num_text:].sum(-1).mean(1) for m in maps], 1)  # (n, L)
        out["attention_image_share"] = round(float(share.mean()), 4)
        for layer in range(share.shape[1]):
            out[f"attention_image_share_layer{layer}"] = round(float(share[:, layer].mean()), 4)
    if not idx:
        return out
    maps = question_maps(model, qa, idx, words)
    roll = question_rollout(maps, config.num_text)  # (n, N)
    rows = [m[:, :, 0, config.num_text:].mean(1) for m in maps]
    layers = torch.stack([layer_row / layer_row.sum(-1, keepdim=True).clamp_min(1e-12)
                          for layer_row in rows], 1)  # (n, L, N)

    def per_animal(row: Tensor, boxes) -> Tensor:  # (..., N) → mean over the animals of their patches' mass
        return torch.stack([row[..., object_patches([box], config.grid, config.patch_size)].sum(-1)
                            for box in boxes]).mean(0)

    asked = torch.stack([per_animal(roll[j], qa.boxes[i]) for j, i in enumerate(idx)])  # (n,)
    other = torch.stack([per_animal(roll[j], qa.other_boxes[i]) for j, i in enumerate(idx)])
    asked_l = torch.stack([per_animal(layers[j], qa.boxes[i]) for j, i in enumerate(idx)])  # (n, L)
    other_l = torch.stack([per_animal(layers[j], qa.other_boxes[i]) for j, i in enumerate(idx)])
    out["attention_vs_other_animals"] = round(float(asked.mean() / other.mean().clamp_min(1e-12)), 4)
    templates = [qa.templates[i] for i in idx]
    for template in sorted(set(templates)):
        sel = torch.tensor([x == template for x in templates])
        out[f"attention_vs_other_animals_{template}"] = round(
            float(asked[sel].mean() / other[sel].mean().clamp_min(1e-12)), 4)
    for layer in range(asked_l.shape[1]):
        out[f"attention_vs_other_animals_layer{layer}"] = round(
            float(asked_l[:, layer].mean() / other_l[:, layer].mean().clamp_min(1e-12)), 4)
    return out


COUNT_TEMPLATES = ("count", "count_colour", "unseen_count")
REPORT_HEAD_QUESTIONS = 400  # the report's "Heads' jobs": every head zeroed, on this many questions


@torch.no_grad()
def sink_weights(model, qa: QASet, words, *, limit: int = 1000) -> dict[str, Any]:
    """Does the trained summary token count as the hand-built counter does (``tokennet demo counting``)?

    The construction puts equal weight on the ``k`` counted animals and on the sink, so the sink's weight is
    ``1 / (k + 1)``. Here, on the count questions of ``qa`` (``k`` = the answer, the number of animals
    counted): the summary token's weight on the sink (its row of ``A``, the sink's column) in every layer and
    head, its mean per ``k``, and for each head the correlation (Pearson ``r``, over questions) of its weight
    with ``1 / (k + 1)``.

    Returns:
        ``{"heads": {"<ℓ>.<h>": {"r": r, "by_k": {k: mean weight}}}, "best": "<ℓ>.<h>", "k": [...]}``; an empty
        dict for a model without a sink or questions without counts.
    """
    config = model.config
    if not getattr(config, "sink", False):
        return {}
    idx = [i for i in range(min(limit, len(qa))) if qa.templates[i] in COUNT_TEMPLATES and qa.boxes]
    if len(idx) < 2:
        return {}
    k = torch.tensor([len(qa.boxes[i]) for i in idx], dtype=torch.float)  # (n,): the animals counted
    target = 1 / (k + 1)
    heads: dict[str, Any] = {}
    for layer, m in enumerate(question_maps(model, qa, idx, words)):
        for head in range(m.shape[1]):
            weight = m[:, head, 0, 1]  # (n,): the summary token's weight on the sink
            corr = float(torch.corrcoef(torch.stack([weight, target]))[0, 1]) if weight.std() > 0 else 0.0
            heads[f"{layer}.{head}"] = {"r": round(corr, 4), "by_k": {int(v): round(float(weight[k == v].mean()), 4)
                                                               for v in sorted(set(k.tolist()))}}
    best = max(heads, key=lambda key: heads[key]["r"])
    return {"heads": heads, "best": best, "k": sorted(int(v) for v in set(k.tolist()))}


def fit_rest(ks: list[int], mass: list[float]) -> tuple[float, float]:
    """The ``c`` of the curve ``k / (k + c)`` closest to ``mass`` (least squares over ``c`` on a log grid from 0.05
    to 100, then refined twice around the best), and the largest gap from it: ``(c, gap)``. A counter that puts equal
    weight ``w`` on each of ``k`` counted animals and ``W`` on the rest has mass ``k / (k + W/w)``: ``c`` is how
    many animals' worth of weight rests elsewhere (the hand-built counter: its sink, ``c = 1``)."""
    k = torch.tensor(ks, dtype=torch.float64)
    m = torch.tensor(mass, dtype=torch.float64)

    def best(grid: torch.Tensor) -> float:
        err = ((k[None] / (k[None] + grid[:, None]) - m[None]) ** 2).sum(1)
        return float(grid[err.argmin()])

    c_fit = best(torch.logspace(math.log10(0.05), 2, 400, dtype=torch.float64))
    c_fit = best(torch.linspace(max(0.05, c_fit * 0.97), min(100.0, c_fit * 1.03), 121, dtype=torch.float64))
    c_fit = best(torch.linspace(max(0.05, c_fit * 0.999), min(100.0, c_fit * 1.001), 101, dtype=torch.float64))
    return c_fit, float((k / (k + c_fit) - m).abs().max())


@torch.no_grad()
def counted_mass(model, qa: QASet, words, *, limit: int = 1000) -> dict[str, Any]:
    """How the trained summary token counts, sink or not: on the count questions of ``qa`` (``k`` = the animals
    counted, ``k ≥ 1``), per layer, its weight (mean of heads) on the counted animals' patches — the hand-built
    counter's is ``k / (k + 1)``, the sink taking the rest — its mean per ``k``, and the ``c`` of the curve
    ``k / (k + c)`` that fits it (:func:`fit_rest`): how many animals' worth of weight rests *elsewhere* (the sink,
    the empty patches, the words). ``best`` is the layer whose weight follows ``k`` most closely (Pearson ``r`` of
    the weight with ``k / (k + c)`` over questions).

    Returns:
        ``{"layers": {ℓ: {"by_k": {k: mean}, "c": c, "gap": largest |mean − k/(k+c)|, "r": r}}, "best": ℓ,
        "k": [...]}``; an empty dict for questions without counts.
    """
    config = model.config
    idx = [i for i in range(min(limit, len(qa))) if qa.templates[i] in COUNT_TEMPLATES and qa.boxes and qa.boxes[i]]
    if len(idx) < 2:
        return {}
    k = torch.tensor([len(qa.boxes[i]) for i in idx], dtype=torch.float)  # (n,)
    cols = [[config.num_text + patch for patch in object_patches(qa.boxes[i], config.grid, config.patch_size)]
            for i in idx]
    counts = sorted(int(v) for v in set(k.tolist()))
    layers: dict[int, Any] = {}
    for layer, m in enumerate(question_maps(model, qa, idx, words)):
        row = m.mean(1)[:, 0]  # (n, L): the summary token's row, mean of heads
        weight = torch.stack([row[j, patch_cols].sum() for j, patch_cols in enumerate(cols)])  # (n,)
        by_k = {v: round(float(weight[k == v].mean()), 4) for v in counts}
        rest, gap = fit_rest(counts, list(by_k.values()))
        target = k / (k + rest)
        corr = float(torch.corrcoef(torch.stack([weight, target]))[0, 1]) if weight.std() > 0 else 0.0
        layers[layer] = {"by_k": by_k, "c": round(rest, 3), "gap": round(gap, 4), "r": round(corr, 4)}
    return {"layers": layers, "best": max(layers, key=lambda ell: layers[ell]["r"]), "k": counts}


@torch.no_grad()
def patch_grouping(model, qa: QASet, words, *, limit: int = 200) -> dict[str, float]:
    """Do objects group themselves? For each patch of an animal that covers several patches, the share of that
    patch token's attention over the patches (each layer, mean of heads, renormalized over the patches) that
    falls on *its own animal's other patches*, divided by their share of the other patches (``(m − 1)/(N − 1)``
    for an animal of ``m`` patches): 1 for attention blind to objects; ``patch_grouping_ratio_layer<ℓ>`` per
    layer and ``patch_grouping_ratio`` their maximum. Empty when every animal fits in one patch."""
    config = model.config
    N, n_text = config.num_patches, config.num_text
    idx = [i for i in range(min(limit, len(qa))) if qa.boxes or qa.other_boxes]
    items = []  # (question position, the animal's patches)
    for j, i in enumerate(idx):
        for box in [*(qa.boxes[i] if qa.boxes else []), *(qa.other_boxes[i] if qa.other_boxes else [])]:
            patches = object_patches([box], config.grid, config.patch_size)
            if len(patches) > 1:
                items.append((j, patches))
    if not items:
        return {}
    out, ratios = {}, []
    for layer, m in enumerate(question_maps(model, qa, idx, words)):
        attn = m.mean(1)[:, n_text:, n_text:]  # (n, N, N): patch → patch, mean of heads
        attn = attn / attn.sum(-1, keepdim=True).clamp_min(1e-12)
        mass, share = [], []
        for j, patches in items:
            for src in patches:
                own = [other_patch for other_patch in patches if other_patch != src]
                mass.append(float(attn[j, src, own].sum() / (1 - attn[j, src, src]).clamp_min(1e-12)))
                share.append(len(own) / (N - 1))
        ratio = sum(mass) / sum(share)
        ratios.append(ratio)
        out[f"patch_grouping_ratio_layer{layer}"] = round(ratio, 4)
    out["patch_grouping_ratio"] = round(max(ratios), 4)
    return out


def two_corner_picture(qa: QASet, corners=("top right", "bottom left")):
    """The first picture of ``qa`` with animals in both ``corners``: ``(index, {corner: box})``, or None. A box's
    cell is ``(top // 16, left // 16)`` (an animal sits inside its 16-pixel cell)."""
    from ..data.vqa import CELL, CORNERS

    for i in range(len(qa)):
        boxes = (qa.boxes[i] if qa.boxes else []) + (qa.other_boxes[i] if qa.other_boxes else [])
        by_cell = {(box[0] // CELL, box[1] // CELL): box for box in boxes}
        if all(CORNERS[k] in by_cell for k in corners):
            return i, {k: by_cell[CORNERS[k]] for k in corners}
    return None


# -- inputs -----------------------------------------------------------------------------------------------------
def load_question_images(paths, image_size: int) -> torch.Tensor:
    """RGB image files of the model's size as ``(B, 3, H, W)``; another size or a grey image (the answers depend on
    colour) is a one-line error."""
    return read_images(paths, image_size, 3, grey="refuse")


# -- the task ---------------------------------------------------------------------------------------------------
@register_task
class VisualQuestionAnswering(Task):
    """``run.answer(images, questions)`` → one answer word per (image, question)."""

    name = "visual question answering"
    kind = "vqa"
    families = ("vqa-transformer", "vqa-cnn")
    viz_uses = ("index", "layer", "head", "image")
    explorer = QuestionExplorer
    inputs = (Input("image", HELP["image"]), Input("prompt", HELP["prompt"], file=False))
    viz_options = (Option("question", "question-answering runs: with --image, the question whose attention to "
                          "draw (default: held-out questions, one per template)"),)

    def _spec(self, run: Run):
        if run.data is None or not run.data.words:
            raise RunError(f"{run.path} has no question vocabulary (no data spec in run.json); it was not trained "
                           "by tokennet train vqa")
        return run.data

    def images(self, run: Run, images) -> torch.Tensor:
        if torch.is_tensor(images):
            return images[None] if images.dim() == 3 else images
        return load_question_images(as_paths(images), run.model.config.image_size)

    @verb
    @torch.no_grad()
    def answer(self, run: Run, images, questions) -> list[str]:
        """The answer to each question about each image: images (a tensor ``(B, 3, H, W)`` or files) and
        questions (one text, or one per image); one image with several questions, or several images with one
        question, pair up by repetition."""
        spec = self._spec(run)
        x = self.images(run, images)
        asked = [questions] if isinstance(questions, str) else list(questions)
        if not asked:
            raise DataError("no question given")
        if len(asked) == 1 and len(x) > 1:
            asked = asked * len(x)
        elif len(x) == 1 and len(asked) > 1:
            x = x.expand(len(asked), -1, -1, -1)
        if len(asked) != len(x):
            raise DataError(f"{len(x)} images but {len(asked)} questions; give one question per image (or one for all)")
        ids = encode_questions(asked, spec.words, run.model.config.max_question_len)
        return [spec.answers[int(i)] for i in predict(run.model, x, ids)]

    def respond(self, run: Run, values: dict[str, Any]) -> Iterator[str]:
        """The answer (``PATH<TAB>answer`` per ``--image`` when there are several)."""
        paths = values["image"]
        for path, answer in zip(paths, self.answer(run, paths, values["prompt"]), strict=True):
            yield (answer if len(paths) == 1 else f"{path}\t{answer}") + "\n"

    # -- pictures ---------------------------------------------------------------------------------------------
    def _items(self, run: Run, index, image, question) -> list[tuple[torch.Tensor, str, str | None, list]]:
        """``(image, question, expected answer, object boxes)`` to draw."""
        if image is not None:
            if not question:
                raise DataError("drawing an image file needs --question (what to ask about it)")
            x = load_question_images([image], run.model.config.image_size)[0]
            return [(x, question, None, [])]
        held = run.data.held_out()
        if index is not None:
            if not 0 <= index < len(held):
                raise DataError(f"index {index} out of range: 0..{len(held) - 1}")
            picks = [index]
        else:  # one held-out question of each template
            picks = [held.templates.index(template) for template in dict.fromkeys(held.templates)]
        return [(held.images[i], held.questions[i], run.data.answers[int(held.answers[i])],
                 held.boxes[i] if held.boxes else []) for i in picks]

    def draw(self, run: Run, out_dir: Path, *, index: int | None = None, image=None, question: str | None = None,
             layer: int | None = None, head: int | None = None, **_) -> list[Path]:
        """Transformer: ``question_attention_<k>.png`` per question — the summary token's attention over the
        patches per layer and head, their mean, and the rollout. CNN: ``answer_map_<k>.png`` — each unit's vote
        for the answer, and one unit's receptive field."""
        from ..viz.vqa import draw_cnn_item, draw_transformer_item

        spec = self._spec(run)
        files = []
        if index is None and image is None and run.family != "vqa-cnn":
            files += self._extras(run, spec, Path(out_dir))
        for k, (x, question_text, expected, boxes) in enumerate(self._items(run, index, image, question)):
            got = self.answer(run, x[None], question_text)[0]
            if run.family == "vqa-cnn":
                files.append(draw_cnn_item(run.model, spec, x, question_text, got, expected,
                                           Path(out_dir) / f"answer_map_{k}.png"))
            else:
                files.append(draw_transformer_item(run.model, spec, x, question_text, got, expected, boxes,
                                                   Path(out_dir) / f"question_attention_{k}.png", layer=layer,
                                                   head=head))
        return files

    def _extras(self, run: Run, spec, out_dir: Path) -> list[Path]:
        """``two_questions.png`` (one held-out picture asked about two corners), ``sink_curve.png`` (the sink's
        weight against the count, and the weight on the counted animals), with patches smaller than an animal,
        ``patch_grouping.png``, and where patches attend to patches, ``attention_heads.png`` (each head's mean
        attention distance and grouping, :func:`~tokennet.tasks.vqa_heads.head_statistics`)."""
        from ..viz.vqa import draw_head_statistics, draw_patch_grouping, draw_sink_curve, draw_two_questions

        held, config, files = run.data.held_out(), run.model.config, []
        pick = two_corner_picture(held)
        if pick is not None:
            i, corner_boxes = pick
            corner_questions = [f"what species is the {name} animal?" for name in corner_boxes]
            got = self.answer(run, held.images[i][None], corner_questions)
            files.append(draw_two_questions(run.model, spec, held.images[i], corner_questions, got,
                                            [[box] for box in corner_boxes.values()], out_dir / "two_questions.png"))
        counts = [i for i, template in enumerate(held.templates) if template in COUNT_TEMPLATES]
        sink = sink_weights(run.model, held.subset(counts), spec.words) if counts else {}
        if sink:
            counted = counted_mass(run.model, held.subset(counts), spec.words)
            files.append(draw_sink_curve(sink, out_dir / "sink_curve.png", counted=counted or None))
        if held.boxes and config.patch_size < 16:
            i = max(range(min(len(held), 50)), key=lambda j: len(held.boxes[j]) + len(held.other_boxes[j]))
            by_layer = {int(k.rsplit("layer", 1)[1]): v for k, v in (run.metrics or {}).items()
                        if k.startswith("patch_grouping_ratio_layer")}
            layer = max(by_layer, key=by_layer.get) if by_layer else config.num_layers - 1  # the layer that groups most
            files.append(draw_patch_grouping(run.model, spec, held.images[i], held.questions[i],
                                             held.boxes[i] + held.other_boxes[i], out_dir / "patch_grouping.png",
                                             layer=layer))
        stats = head_statistics(run.model, held, spec.words)
        if stats:
            files.append(draw_head_statistics(stats, out_dir / "attention_heads.png"))
        return files

    def panel(self, run: Run, log) -> list[tuple[str, str]]:
        from ..viz.report.vqa import vqa_panel

        return vqa_panel(run) + self._heads_section(run)

    def _heads_section(self, run: Run) -> list[tuple[str, str]]:
        """The report's section "Heads' jobs": each head zeroed in turn on the first :data:`REPORT_HEAD_QUESTIONS`
        held-out questions (``tokennet heads``; a CNN has no heads, and no section)."""
        from ..attention.ablation import self_attention_layers
        from ..viz.report.heads import heads_section
        from .heads import head_jobs

        if not self_attention_layers(run.model):
            return []
        jobs = head_jobs(run, ablation="zero", limit=REPORT_HEAD_QUESTIONS)
        return [("Heads' jobs", heads_section([jobs.to_dict()]))]

    # -- for tests and documentation ------------------------------------------------------------------------
    def examples(self, run: Run, directory: Path, count: int = 1) -> list[Example]:
        """``scene-K.png`` per held-out picture and ``scene-K.json``, the held-out questions about it with their
        answers; the example asks the first of them."""
        from ..data.image_files import write_image

        held, answers = run.data.held_out(), run.data.answers
        pictures: dict[bytes, list[int]] = {}  # a picture's bytes → the held-out questions about it, in order
        for i in range(len(held)):
            pictures.setdefault(held.images[i].numpy().tobytes(), []).append(i)
        groups = list(pictures.values())
        out = []
        for k in take(count, len(groups), run.path):
            image = write_image(held.images[groups[k][0]], Path(directory) / f"scene-{k}.png")
            asked = [{"question": held.questions[i], "answer": answers[int(held.answers[i])],
                      "template": held.templates[i]} for i in groups[k]]
            questions = Path(directory) / f"scene-{k}.json"
            questions.write_text(json.dumps({"image": image.name, "questions": asked}, indent=1) + "\n")
            out.append(Example({"image": [str(image)], "prompt": asked[0]["question"]}, asked[0]["answer"],
                               (image, questions)))
        return out

    def bad_inputs(self, run: Run, directory: Path) -> list[tuple[dict[str, Any], str]]:
        import numpy as np

        root = Path(directory)
        held = run.data.held_out()
        good = str(root / "good.npy")
        np.save(good, held.images[0].numpy())
        wrong = root / "wrong_size.npy"
        np.save(wrong, np.zeros((3, 7, 7), np.float32))
        grey = root / "grey.npy"
        side = run.model.config.image_size
        np.save(grey, np.zeros((side, side), np.float32))
        question = held.questions[0]
        return [({"image": [good], "prompt": "how many dragons are there?"}, "outside the model's vocabulary"),
                ({"image": [good], "prompt": " ? "}, "is empty"),
                ({"image": [str(wrong)], "prompt": question}, "resize it first"),
                ({"image": [str(grey)], "prompt": question}, "RGB"),
                *(({**v, "prompt": question}, frag) for v, frag in image_file_bad_inputs(root))]
