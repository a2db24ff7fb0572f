"""Recipe ``vqa``: the lecture's own argument — questions about a picture, a transformer, and CNNs beside it.

Data (:mod:`tokennet.data.vqa`): generated 64×64 scenes of 1–9 animals (five species, five colours) with
clutter, and template questions — *how many birds are there?*, *how many red animals are there?*, *is the
top right animal the same species as the bottom left animal?*, *what colour is the impala?* — with
one-word answers. Five (species, colour) kinds and one count per count question are held out of training;
the test questions are drawn as the training ones are (the same templates, answers and numbers of animals, in
the same proportions), except that one animal of every test picture is a held-out kind, put in on purpose, and
the held-out counts are asked only by a test set of their own (``unseen_count``). ``--data DIR`` trains on a
directory of your own pictures and questions (``answers.tsv``; the format is in :mod:`tokennet.data.vqa`).

The model (:class:`~tokennet.models.vqa.VQATransformer`): the question's words and the image's 16×16
patches in one sequence, one encoder, the answer read from the question's summary token; a patch is embedded
by a two-level conv stem (``patch_stem="conv"``, 48 hidden channels: the recipe's default, measured below)
instead of one linear map. After training,
with ``baselines=true`` (the default), two CNNs answer the same questions, trained on the same batches for
the same number of steps, each with about the transformer's parameter count (``cnn_lr`` their peak rate):

- ``cnn_…``: a small ResNet conditioned on the question by FiLM, whose units' receptive field covers the
  whole image (preset ``vqa-cnn``);
- ``shallow_cnn_…``: two FiLM-conditioned conv layers after a patchify stem, whose 20-pixel field is smaller
  than the 32 pixels between two corner cells (preset ``vqa-cnn-shallow``): its answer is a mean of local
  votes, additive in the two corners, so "same species?" is out of its reach — the lecture's x1 … x7.

``metrics.json``: ``exact_match`` (%) and ``exact_match_<template>`` (``count``, ``count_colour``,
``same_species``, ``colour``), ``exact_match_unseen_count`` (count questions asking a held-out
(question, count) pair), the same with the ``cnn_`` and ``shallow_cnn_`` prefixes, each CNN's
``…receptive_field`` and ``…num_parameters``, and ``attention_mass_ratio``: on the questions about one or
two objects, the share of the question's rolled-out attention over the patches that falls on the patches
of those objects, divided by their share of the image (per template and per layer too;
:func:`~tokennet.tasks.vqa.attention_mass`); ``attention_vs_other_animals`` (``…_<template>``, ``…_layer<ℓ>``):
the mass on one asked animal over the mass on one of the picture's *other* animals — 1 for a model that looks
at every animal alike whatever is asked, the control ``attention_mass_ratio`` lacks — and
``attention_image_share``, the share of the question's attention that reaches the image
(:func:`~tokennet.tasks.vqa.attention_vs_others`); the learned counter, ``sink_weight_k<k>``: the mean weight
on the sink of the head that tracks ``1/(k+1)`` best (``sink_head``, correlation ``sink_vs_inverse_count_r``,
``sink_max_gap`` from the curve; :func:`~tokennet.tasks.vqa.sink_weights`) over the test set's count questions
and the held-out counts; with patches smaller than an animal (``patch_size=8``), ``patch_grouping_ratio``
(:func:`~tokennet.tasks.vqa.patch_grouping`). ``tokennet eval`` recomputes the transformer's figures from the
saved run (the same numbers as ``metrics.json``); the CNNs' come from training (they are not saved).

**Measured, one change at a time** (seed 0, 1 thread, held-out test set of 2000 questions, exact match in %;
the transformer alone, ``--set baselines=false``, unless said; the recipe has no time budget, so the steps are
exact on any machine; wall times were taken on 2 cores shared with ~8 other jobs and are not idle figures;
``bench/results/vqa_patch_stem.json``, ``vqa_transformer.json``, ``vqa_default.json`` record the commands,
commits and machine):

=============================  =====  ======  ====  =====  =====  =====  =====  =====  ======  =====
change                         steps  params  all   count  c_col  same   spec   col    unseen  att
=============================  =====  ======  ====  =====  =====  =====  =====  =====  ======  =====
linear patch embed (before)    3000   155.4k  78.1  79.8   62.0   76.5   76.6   95.1   5.6     4.01
linear, half the steps         1500   155.4k  71.6  74.7   53.4   56.9   76.8   94.1   5.6     3.08
conv patch stem, 32 channels   1500   140.6k  83.5  81.5   62.5   96.2   95.9   81.8   7.6     3.64
conv stem, 48 ch, 3000 steps   3000   157.8k  87.5  82.2   61.0   97.3   98.8   98.5   19.6    3.80
=============================  =====  ======  ====  =====  =====  =====  =====  =====  ======  =====

(``c_col``: ``count_colour``; ``same``: ``same_species``; ``spec``: ``species``; ``col``: ``colour``; ``unseen``:
``unseen_count``; ``att``: ``attention_mass_ratio``. The first row is the transformer of the default run before
this change, commit 670130c, with both CNNs beside it: ``cnn_`` 77.6 overall, 49.1 on the corner pairs; ``shallow_cnn_``
77.2, 49.1.) The conv stem is the change that moves the corner pairs, from 57 to 96 % at 1500 steps, and the
species from 77 to 96 %: a linear embedding of ``α ⊙ (colour − background)`` is one vector bilinear in shape and
colour, and the held-out kinds are new (shape, colour) pairs. It costs on colour (94 → 82 % at 1500 steps:
the nonlinear stem binds colour to shape the way the linear one did not) — ``patch_stem="conv+colour"`` gives
the foreground's mean colour a path of its own, not measured (the run was stopped for CPU time).
The last row is the recipe's default transformer (two changes from the row above: 48 stem channels restore the
parameter budget, and the default 3000 steps; ``vqa_transformer.json``, 3301 s on the shared cores, without the
CNNs): corner pairs 97.3 and species 98.8, colour back to 98.5, held-out counts 19.6, but counting 82.2 and
colour counts 61.0. ``attention_vs_other_animals`` 2.04 rolled out (``same_species`` 2.75, ``species`` 2.53,
``colour`` 2.41, ``count`` 0.97), 10.5 in layer 0 alone — layers 1 and 2 look elsewhere, so the rollout
dilutes it; ``attention_image_share`` 0.35; the sink's best head has ``r = 0.25`` with ``1/(k+1)``, its weight
0.055 at ``k = 0`` and 0.029 at ``k = 9``.
The issue's goals are not all reached: corner pairs (≥ 95 %) are, but counting (≥ 97 %), overall (≥ 95 %),
held-out counts (≥ 80 %) and ``attention_vs_other_animals`` (≥ 3, rolled out) are not; the full default run
with both CNNs has not been measured with the conv stem (CPU time), so "above both CNNs" is unmeasured.

**The new measurements on the 1500-step conv-stem run** (``tokennet eval``, ``vqa_patch_stem.json``):
``attention_vs_other_animals`` 2.99 rolled out (``colour`` 4.49, ``same_species`` 4.06, ``species`` 3.02, but
``count`` 1.19 and ``count_colour`` 1.41: a count question looks at all animals about alike), 17.0 in layer 0
alone; ``attention_image_share`` 0.51. **The learned counter does not count with the sink**: the head whose
sink weight tracks ``1/(k+1)`` best (layer 0, head 1) has ``r = 0.44`` and puts 0.034 on the sink at
``k = 0`` falling to 0.014 at ``k = 9`` (the construction puts 1 … 0.1); the sink is barely used, the count
questions spread their attention over the animals (asked 1.19× the others), and the count is read off the
summary token as a class, which is why held-out counts are answered at 7.6 % — a readout of ``1/(k+1)`` would
carry over. **Grouping** (8-px patches, four per animal; a 500-step run, undertrained — 46 % overall —
``vqa_patch8.json``): a patch's attention falls on its own animal's other patches 1.51× their share (layer 2;
1.36 and 1.31 in layers 0 and 1): above, not far above.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from typing import Any

import torch

from ..data.vqa import COLOURS, GENERATED, AnimalQuestions, QABatches, QASet, tokenize_question
from ..errors import RecipeError
from ..lifecycle import BuildContext, Job, Recipe, register_recipe
from ..models.registry import create_model
from ..models.vqa import answer_points
from ..tasks.vqa import attention_mass, attention_vs_others, exact_match, patch_grouping, sink_weights
from ..train.trainer import Trainer

__all__ = ["evaluate", "train_baseline", "BASELINES"]

log = logging.getLogger(__name__)

BASELINES = {"cnn_": "vqa-cnn", "shallow_cnn_": "vqa-cnn-shallow"}
DATA_FIELDS = ("vocab_size", "num_answers", "image_size", "pixel_mean", "pixel_std", "answer_points")


def evaluate(model, spec: AnimalQuestions, qa: QASet | None = None, prefix: str = "") -> dict[str, float]:
    """Exact match overall and per template on the test questions (``qa``, default the spec's), and on the
    held-out counts (``…exact_match_unseen_count``; generated data)."""
    qa = spec.held_out() if qa is None else qa
    out = exact_match(model, qa, spec.words, model.config.max_question_len, prefix=prefix)
    unseen = spec.unseen_counts()
    if len(unseen):
        out[f"{prefix}exact_match_unseen_count"] = exact_match(model, unseen, spec.words, model.config.max_question_len,
                                                               prefix=prefix)[f"{prefix}exact_match"]
    return out


def _check_lengths(spec: AnimalQuestions, max_len: int) -> None:
    if spec.generated:
        return
    u = spec.user()
    longest = max(len(tokenize_question(q)) for q in u.train.questions + u.test.questions)
    if longest > max_len:
        raise RecipeError(f"{spec.source} has questions of {longest} words; set max_question_len={longest} or more")


def train_baseline(preset: str, model_settings: dict[str, Any], train, source, device, *, lr: float):
    """Train a CNN baseline like the transformer: the same batches, the same number of steps (``train``'s
    ``max_iters``), its own peak learning rate ``lr``; returns the trained model."""
    steps = dataclasses.replace(train, lr=lr, time_budget=None, eval_interval=0, checkpoint_interval=0,
                                progress=False, log_interval=0, report=False, tensorboard=False)
    torch.manual_seed(train.seed)
    m = create_model(preset, **model_settings).to(device)
    with tempfile.TemporaryDirectory() as scratch:  # the baselines' checkpoints are not part of the run
        Trainer(m, steps, source, out_dir=scratch, device=device).fit()
    return m.eval()


def build(ctx: BuildContext) -> Job:
    spec: AnimalQuestions = ctx.data.filled()  # a bad --data directory fails here, before anything is written
    ctx.from_data("vocab_size", len(spec.words))
    ctx.from_data("num_answers", len(spec.answers))
    # counts as points on a line, the generator's colours as their RGB (AnswerHead); a user's data: numbers only
    ctx.from_data("answer_points", answer_points(spec.answers, COLOURS if spec.generated else None))
    ctx.from_data("image_size", spec.image_size)
    mean, std = spec.pixel_stats()
    ctx.from_data("pixel_mean", mean)
    ctx.from_data("pixel_std", std)
    train, opts, device = ctx.train, ctx.options, ctx.device
    max_len = ctx.model["max_question_len"]
    _check_lengths(spec, max_len)
    torch.manual_seed(train.seed)
    model = create_model("vqa-transformer", **ctx.model)
    src = QABatches(spec, train.batch_size, max_len)
    val = spec.val()
    log.info("vqa: %s data, %d words, %d answers; transformer %.3fM parameters, %d tokens",
             "generated" if spec.generated else spec.source, len(spec.words), len(spec.answers),
             model.num_parameters() / 1e6,
             model.config.num_text + model.config.num_patches * model.config.tokens_per_patch)

    def monitor(m) -> dict[str, float]:
        out = exact_match(m, val, spec.words, max_len, prefix="val_")
        return {k: v for k, v in out.items() if k == "val_exact_match" or k.startswith("val_exact_match_")}

    def finish(m) -> dict[str, Any]:  # noqa: ARG001
        out: dict[str, Any] = {}
        if not opts["baselines"]:
            return out
        steps = dataclasses.replace(train, max_iters=src.max_index + 1)  # what the transformer trained
        qa = spec.held_out()
        shared = {k: ctx.settings[k] for k in (*DATA_FIELDS, "max_question_len", "answer_readout")}
        for prefix, preset in BASELINES.items():
            cnn = train_baseline(preset, shared, steps, src, device, lr=opts["cnn_lr"])
            out.update(evaluate(cnn, spec, qa, prefix=prefix))
            out[f"{prefix}num_parameters"] = cnn.num_parameters()
            out[f"{prefix}receptive_field"] = cnn.receptive_field().size
            log.info("vqa baseline %s: %s", preset, {k: v for k, v in out.items() if k.startswith(prefix)})
        return out

    return Job(model=model.to(device), source=src, evaluate=monitor, tokens_per_batch=train.batch_size,
               finish=finish, data=spec)


def evaluate_run(run, data) -> dict[str, Any]:
    """``tokennet eval``: exact match per template on the run's held-out questions, and the attention mass."""
    if data is not None and data != run.data.source:
        raise RecipeError("the vqa recipe evaluates on the run's own held-out questions; it takes no other data")
    spec, qa = run.data, run.data.held_out()
    out: dict[str, Any] = {**evaluate(run.model, spec, qa), "test_size": len(qa)}
    if hasattr(run.model, "question_attention"):
        out.update(attention_mass(run.model, qa, spec.words))
        out.update(attention_vs_others(run.model, qa, spec.words))
        out.update(patch_grouping(run.model, qa, spec.words))
        out.update(sink_summary(sink_weights(run.model, _count_questions(spec, qa), spec.words)))
    return out


def _count_questions(spec: AnimalQuestions, qa: QASet) -> QASet:
    """The test set's count questions, and the held-out counts' (all the ``k`` a counter must handle)."""
    unseen = spec.unseen_counts() if spec.generated else None
    keep = [i for i, t in enumerate(qa.templates) if t in ("count", "count_colour")]
    parts = [(qa, keep)] + ([(unseen, list(range(len(unseen))))] if unseen is not None and len(unseen) else [])
    return QASet(torch.cat([q.images[i] for q, i in parts]), [q.questions[j] for q, i in parts for j in i],
                 torch.cat([q.answers[i] for q, i in parts]), [q.templates[j] for q, i in parts for j in i],
                 [q.boxes[j] for q, i in parts for j in i] if qa.boxes else [],
                 [q.other_boxes[j] for q, i in parts for j in i] if qa.other_boxes else [])


def sink_summary(sw: dict[str, Any]) -> dict[str, float]:
    """:func:`~tokennet.tasks.vqa.sink_weights` as flat metrics: the head whose sink weight tracks ``1/(k+1)``
    best (``sink_head`` = ``layer + head / 10``, e.g. ``2.1``), its correlation ``sink_vs_inverse_count_r``, its
    mean weight per count ``sink_weight_k<k>`` and the largest gap from ``1/(k+1)``, ``sink_max_gap``."""
    if not sw:
        return {}
    best = sw["heads"][sw["best"]]
    layer, head = sw["best"].split(".")
    out = {"sink_head": float(f"{layer}.{head}"), "sink_vs_inverse_count_r": best["r"]}
    out.update({f"sink_weight_k{k}": w for k, w in best["by_k"].items()})
    out["sink_max_gap"] = round(max(abs(w - 1 / (k + 1)) for k, w in best["by_k"].items()), 4)
    return out


register_recipe(Recipe(
    name="vqa",
    description="questions about pictures of animals (how many birds? is the top right animal the same species as "
    "the bottom left one?): a transformer over question + patch tokens, against FiLM CNNs",
    model="vqa-transformer",
    build=build,
    data=AnimalQuestions,
    default_data=GENERATED,
    options={"baselines": True, "cnn_lr": 3e-3},
    model_defaults={"patch_stem": "shape,colour", "stem_channels": 48, "modality_mask": "image-first",
                    "answer_readout": "points"},
    train_defaults={"max_iters": 3000, "batch_size": 64, "lr": 3e-3, "warmup_iters": 100, "eval_interval": 1000,
                    "weight_decay": 0.05, "log_interval": 50, "optimizer": "muon", "muon_lr": 0.02},
    evaluate_run=evaluate_run,
    smoke={"dim": 32, "num_layers": 1, "num_heads": 2, "batch_size": 16, "test_size": 48, "val_size": 16},
))
