"""Recipe ``vqa``: the lecture's own argument — questions about a picture, a transformer, and CNNs beside it.

Data (:mod:`tokennet.data.vqa`): generated 64×64 scenes of 1–9 animals (five species, five colours) with
clutter, and template questions — *how many birds are there?*, *how many red animals are there?*, *is the
top right animal the same species as the bottom left animal?*, *what colour is the impala?* — with
one-word answers. Five (species, colour) kinds and one count per count question are held out of training;
the test questions are drawn as the training ones are (the same templates, answers and numbers of animals, in
the same proportions), except that one animal of every test picture is a held-out kind, put in on purpose, and
the held-out counts are asked only by a test set of their own (``unseen_count``). ``--data DIR`` trains on a
directory of your own pictures and questions (``answers.tsv``; the format is in :mod:`tokennet.data.vqa`).

The model (:class:`~tokennet.models.vqa.VQATransformer`) is the lecture's: the question's words and the image's
16×16 patches, each patch flattened and mapped to a token by one linear map (the notes' ``tokenize(x, K)``), with
learned positions, in one sequence; full self-attention through pre-norm blocks; the answer read from the question's
summary token by one linear map (preset ``vqa-generic``; its width, learning rate and schedule chosen by the trials of
``bench/vqa_generic.py``, ``bench/results/vqa_generic_tuning.json``). Nothing in it is made for this task.

``transformer=tuned`` trains the model the recipe had before (``TUNED``, at its own width and training,
``TUNED_TRAIN``): a patch is **two tokens**, its shape (a conv stem over the silhouette, colour-blind) and its colour
(the foreground's mean colour, shape-blind) — ``patch_stem="shape,colour"``, 48 stem channels; a patch's tokens
attend only to each other (``modality_mask="patch-local"``); the question's tokens meet the patches only in layers
1 and 2 (``read_layers=[1, 2]``); a sink token with a learned score per layer and head, starting at 2
(``sink_logit=2.0``); counts and colours answered as **points** (``answer_readout="points"``: a count is a position
on a line, a colour one in RGB, :class:`~tokennet.models.vqa.AnswerHead`). Each piece can be added to the generic
default alone (``--set modality_mask=patch-local``); ``bench/vqa_pieces.py`` measures what each adds
(``bench/results/vqa_pieces.json``). After training,
with ``baselines=true`` (the default), two CNNs answer the same questions, trained on the same batches for
the same number of steps with the same schedule, the covering one with about the transformer's parameter count and
the other, one stage fewer, with about half (``cnn_lr``
their peak rate, Muon's scaled alike;
``cnn_precision``: ``auto``, the default, trains them with bf16 autocast on a CPU with bf16 in hardware, else in
fp32 as the transformer; the metric ``cnn_precision`` says which; ``cnn_parallel``, the default, trains the two at
once, one thread each, where torch has two threads or more — the metric ``cnn_parallel`` says whether it did):

one family of CNNs that differ only in their receptive field — the lecture's *"if the receptive fields are big
enough, it can do it"* asked of the baselines a user gets. A GRU reads the question and FiLM conditions every
stage; a 4×4 patchify stem, then plain 3×3 stages, each after the first at stride 2, so a unit's field doubles per
stage; coordinate channels; the answer read from every unit of the final map by one linear map
(``readout="flatten"``, the classic CNN's fully connected readout: each position has weights of its own, so the
units that see two corners are read, not averaged away — yet the answer is still a sum of the units' votes):

- ``cnn_…``: four stages, a 68-pixel field: each unit of its 2×2 map sees both corners of any pair (preset
  ``vqa-cnn``);
- ``shallow_cnn_…``: the same with three stages, a 36-pixel field, less than the 48 pixels from one corner cell to
  the next: no unit sees two corners, so its answer is additive in them and "same species?" is out of its reach —
  the lecture's x1 … x7 — while "what species is the top right animal?" is not (preset ``vqa-cnn-shallow``).

``cnn_readout`` says how both read their answer: ``flatten`` (the default, above), ``mean`` (global average pooling,
which dilutes the few units that see both corners among those that do not), ``coords`` (coordinate channels, then
pooling) or ``unit`` (nothing pooled: an all-convolutional trunk strided down to one unit whose field is the
preset's, at most the picture — 64 px and 36 px; :mod:`tokennet.models.strided_cnn`); the metric ``cnn_readout``
says which. The baselines before this family — a small ResNet with global pooling (92 px) and two pooled layers
(20 px), which both stayed at chance on the corner pairs — are the presets ``vqa-cnn-resnet`` and
``vqa-cnn-local``; ``bench/vqa_receptive_field.py --curves`` measures the family's fields against the transformer
(``bench/results/vqa_field_curves.json``).

``metrics.json``: ``exact_match`` (%) and ``exact_match_<template>`` (``count``, ``count_colour``, ``same_species``,
``colour``), ``exact_match_unseen_count`` (count questions asking a held-out (question, count) pair), the same with
the ``cnn_`` and ``shallow_cnn_`` prefixes, each CNN's ``…receptive_field`` and ``…num_parameters``, and
``attention_mass_ratio``: on the questions about one or two objects, the share of the question's rolled-out attention
over the patches that falls on the patches of those objects, divided by their share of the image (per template and per
layer too; :func:`~tokennet.tasks.vqa.attention_mass`); ``attention_vs_other_animals`` (``…_<template>``,
``…_layer<ℓ>``): the mass on one asked animal over the mass on one of the picture's *other* animals — 1 for a model
that looks at every animal alike whatever is asked, the control ``attention_mass_ratio`` lacks — and
``attention_image_share``, the share of the question's attention that reaches the image
(:func:`~tokennet.tasks.vqa.attention_vs_others`); the learned counter, ``sink_weight_k<k>``: the mean weight on the
sink of the head that tracks ``1/(k+1)`` best (``sink_head``, correlation ``sink_vs_inverse_count_r``,
``sink_max_gap`` from the curve; :func:`~tokennet.tasks.vqa.sink_weights`) over the test set's count questions and the
held-out counts; what the trained counter does instead, ``counted_mass_k<k>``: the summary token's weight on the ``k``
counted animals in the layer that counts (``counted_mass_layer``), and the ``c`` of the curve ``k / (k + c)`` it
follows (``counted_mass_c``: 1 for the hand-built counter, whose sink weighs as much as one animal; larger when the
weight rests on the empty patches and the words instead; :func:`~tokennet.tasks.vqa.counted_mass`); with patches
smaller than an animal (``patch_size=8``) and a mask that lets patches meet (``modality_mask=image-first`` or
``full``: under patch-local they never do, and nothing is reported), ``patch_grouping_ratio``
(:func:`~tokennet.tasks.vqa.patch_grouping`; ``bench/results/vqa_patch8.json``); where patches meet, each head's
mean attention distance in pixels, ``head_distance_layer<ℓ>_head<h>`` (the ViT paper's measure; ``head_distance_min``
and ``…_max`` over the heads) and, with patches smaller than an animal, its grouping ratio
``head_grouping_layer<ℓ>_head<h>`` (:func:`~tokennet.tasks.vqa_heads.head_statistics`; ``tokennet viz`` draws both
as ``attention_heads.png``). ``grouping=false`` skips these; ``grouping=true`` under a mask that keeps every patch to
itself is refused in one line. ``tokennet eval`` recomputes the
transformer's figures from the saved run (the same numbers as ``metrics.json``); the CNNs' come from training (they
are not saved).

How the defaults were chosen — one change at a time, three seeds, the default with both CNNs beside it, the
receptive-field sweep — is in ``docs/experiments/vqa.md``, each figure cited from its ``bench/results/`` file
(``vqa_ablation.json``, ``vqa_default.json``, ``vqa_receptive_field.json``, ...).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..data.vqa import COLOURS, GENERATED, AnimalQuestions, QABatches, QASet, tokenize_question
from ..device import native_bf16, one_thread
from ..errors import RecipeError, one_line
from ..lifecycle import BuildContext, Job, Recipe, register_recipe
from ..models.registry import config_from_dict, create_model, preset_info
from ..models.vqa import CNN_READOUTS, answer_points
from ..tasks.vqa import attention_mass, attention_vs_others, counted_mass, exact_match, patch_grouping, sink_weights
from ..tasks.vqa_heads import head_statistics, head_summary, patches_meet
from ..train.trainer import Trainer

__all__ = ["evaluate", "train_baseline", "train_baselines", "train_baselines_timed", "baseline_settings",
           "baseline_step_seconds", "check_transformer", "derive_settings", "BASELINES", "GENERIC", "GENERIC_TRAIN",
           "TUNED", "TUNED_TRAIN"]

log = logging.getLogger(__name__)

BASELINES = {"cnn_": "vqa-cnn", "shallow_cnn_": "vqa-cnn-shallow"}
DATA_FIELDS = ("vocab_size", "num_answers", "image_size", "pixel_mean", "pixel_std", "answer_points")
# The tuned transformer (``--set transformer=tuned``): its task-specific pieces, each measured in
# docs/experiments/vqa.md, and the training they were tuned with (the width is the generic model's, 64).
TUNED = {"patch_stem": "shape,colour", "stem_channels": 48, "modality_mask": "patch-local", "read_layers": [1, 2],
         "sink": True, "sink_logit": 2.0, "answer_readout": "points", "pair_binding": "both"}
TUNED_TRAIN = {"lr": 3e-3, "muon_lr": 0.02, "schedule": "cosine"}
MODEL_DEFAULTS = {name: TUNED[name] for name in ("patch_stem", "stem_channels", "modality_mask", "read_layers",
                                                 "sink_logit", "answer_readout")}  # the pieces built for the task


def _generic() -> dict[str, Any]:
    family, preset, _ = preset_info("vqa-generic")
    config = config_from_dict({"family": family, **preset}).to_dict()
    return {name: config[name] for name in TUNED}


# The lecture's transformer, the recipe's default (``transformer=generic``): the ``vqa-generic`` preset's value of every
# setting the tuned model changes — linear patch embeddings, full self-attention, no sink, the answer read from the
# summary token by one linear map — and the training its tuning chose (bench/results/vqa_generic_tuning.json).
GENERIC = _generic()
GENERIC_TRAIN = {"lr": 2e-3, "muon_lr": 0.02 * 2e-3 / 3e-3, "schedule": "wsd"}
TRANSFORMERS = ("generic", "tuned")


def derive_settings(settings: dict[str, Any], given: set[str]) -> dict[str, Any]:
    """``transformer=tuned``: the :data:`TUNED` model settings and :data:`TUNED_TRAIN`, each unless the user set it;
    ``generic`` (the default) keeps the recipe's defaults, the lecture's model — so one task-specific piece can be
    added to it at a time (``--set modality_mask=patch-local``). The recipe's ``derive`` hook: ``--show-settings`` and
    ``run.json`` show what the run trains."""
    if _transformer_kind(settings["transformer"]) == "generic":
        return {}
    return {name: value for name, value in {**TUNED, **TUNED_TRAIN}.items() if name not in given}


def _transformer_kind(kind: str) -> str:
    if kind not in TRANSFORMERS:
        raise RecipeError(f"transformer must be one of {', '.join(TRANSFORMERS)}, got {kind!r}")
    return kind


def check_transformer(ctx: BuildContext) -> None:
    """The transformer's settings, before anything is built: its kind (a resumed run's too, which
    :func:`derive_settings` does not see), and a grouping measurement asked for under a mask that keeps every patch to
    itself is refused."""
    _transformer_kind(ctx.options["transformer"])
    mask = ctx.model["modality_mask"]
    if "grouping" in ctx.given and ctx.options["grouping"] and mask in ("patch-local", "summary-reads"):
        raise RecipeError(f"grouping=true measures how patches attend to other patches, which needs a mask that lets "
                          f"them meet (modality_mask=full or image-first); modality_mask={mask} keeps each patch to "
                          "itself")


def evaluate(model, spec: AnimalQuestions, qa: QASet | None = None, prefix: str = "") -> dict[str, float]:
    """Exact match overall and per template on the test questions (``qa``, default the spec's), and on the
    held-out counts (``…exact_match_unseen_count``; generated data)."""
    questions = spec.held_out() if qa is None else qa
    out = exact_match(model, questions, spec.words, model.config.max_question_len, prefix=prefix)
    unseen = spec.unseen_counts()
    if len(unseen):
        out[f"{prefix}exact_match_unseen_count"] = exact_match(model, unseen, spec.words, model.config.max_question_len,
                                                               prefix=prefix)[f"{prefix}exact_match"]
    return out


def _check_lengths(spec: AnimalQuestions, max_len: int) -> None:
    if spec.generated:
        return
    user = spec.user()
    longest = max(len(tokenize_question(q)) for q in user.train.questions + user.test.questions)
    if longest > max_len:
        raise RecipeError(f"{spec.source} has questions of {longest} words; set max_question_len={longest} or more")


def _percent(value) -> str:
    return "–" if value is None else f"{value:.1f} %"


CNN_PRECISIONS = ("auto", "fp32", "bf16")


def cnn_precision(setting: str, device) -> str:
    """The baselines' training precision: ``"auto"`` is bf16 autocast on a CPU that multiplies bf16 in hardware
    (AMX or AVX-512 BF16: a training step of the two vqa CNNs took 1.5× and 1.7× less time there, 1 thread,
    measured on a loaded machine), else
    fp32; ``"fp32"`` or ``"bf16"`` as said."""
    if setting not in CNN_PRECISIONS:
        raise RecipeError(f"cnn_precision must be one of {', '.join(CNN_PRECISIONS)}, got {setting!r}")
    if setting != "auto":
        return setting
    return "bf16" if torch.device(device).type == "cpu" and native_bf16() else "fp32"


def train_baseline(preset: str, model_settings: dict[str, Any], train, source, device, *, lr: float,
                   precision: str = "fp32"):
    """Train a CNN baseline like the transformer: the same batches, the same number of steps (``train``'s
    ``max_iters``) and schedule, its own peak learning rate ``lr`` (Muon's scaled alike) and ``precision``; returns
    the trained model."""
    steps = dataclasses.replace(train, lr=lr, muon_lr=train.muon_lr * lr / train.lr, time_budget=None,
                                eval_interval=0, checkpoint_interval=0,
                                progress=False, log_interval=0, report=False, tensorboard=False, precision=precision)
    torch.manual_seed(train.seed)
    m = create_model(preset, **model_settings).to(device)
    with tempfile.TemporaryDirectory() as scratch:  # the baselines' checkpoints are not part of the run
        Trainer(m, steps, source, out_dir=scratch, device=device, tokens_per_batch=train.batch_size,
                label=f"{preset} baseline").fit()
    return m.eval()


def _baseline_in_worker(conn, preset: str, model_settings: dict[str, Any], train, source, lr: float,
                        precision: str) -> None:
    """A spawned process's share of :func:`train_baselines`: one CNN on one thread; sends ``("ok", (its state dict
    as torch.save's bytes, the seconds its training took))`` or ``("error", message)`` back through ``conn``."""
    torch.set_num_threads(1)
    try:
        started = time.perf_counter()
        m = train_baseline(preset, model_settings, train, source, "cpu", lr=lr, precision=precision)
        took = time.perf_counter() - started
        buf = io.BytesIO()  # bytes, not tensors: torch's shared-memory handles die with this process
        torch.save(m.state_dict(), buf)
        conn.send(("ok", (buf.getvalue(), took)))
    except BaseException as err:  # noqa: BLE001 - reported in the parent, whatever it was
        conn.send(("error", f"{type(err).__name__}: {one_line(err)}"))
    finally:
        conn.close()


def _step_seconds_in_worker(conn, preset: str, model_settings: dict[str, Any], train, source, lr: float,
                            precision: str, steps: tuple[int, int]) -> None:
    """A spawned process's share of :func:`baseline_step_seconds`: says ``("ready", None)`` once started, then
    measures one CNN's seconds per step on one thread and sends ``("ok", seconds)`` (or ``("error", message)``)."""
    torch.set_num_threads(1)
    try:
        conn.send(("ready", None))
        conn.send(("ok", _one_step_seconds(preset, model_settings, train, source, "cpu", lr, precision, steps)))
    except BaseException as err:  # noqa: BLE001 - reported in the parent, whatever it was
        conn.send(("error", f"{type(err).__name__}: {one_line(err)}"))
    finally:
        conn.close()


@contextlib.contextmanager
def _worker(target, preset: str, *args) -> Iterator[Callable[[str], Any]]:
    """A spawned process (not forked: this process's thread pools do not survive a fork) running ``target(conn,
    *args)`` for the baseline ``preset``; yields ``receive(status)``, the payload of its next message, which must
    carry that status. A worker that reports an error or dies is a one-line :class:`RecipeError`. On leaving, the
    worker is joined, or stopped if this process failed or was stopped first."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    pipe, send = ctx.Pipe(duplex=False)
    worker = ctx.Process(target=target, daemon=True, name=f"tokennet-{preset}", args=(send, *args))
    worker.start()
    send.close()  # the worker holds the only sending end: its death ends the pipe (EOFError below)
    finished = False

    def receive(expected: str) -> Any:
        nonlocal finished
        try:
            status, payload = pipe.recv()
        except EOFError:
            worker.join()
            raise RecipeError(f"the {preset} baseline's worker process died (exit code {worker.exitcode}); "
                              "--set cnn_parallel=false trains the baselines one after the other") from None
        if status != expected:
            raise RecipeError(f"the {preset} baseline failed in its worker process: {payload}")
        finished = status == "ok"
        return payload

    try:
        yield receive
    finally:
        pipe.close()
        worker.join(timeout=30 if finished else 0)
        if worker.is_alive():
            worker.terminate()
            worker.join()


def baseline_settings(preset: str, model_settings: dict[str, Any], readout: str = "flatten") -> dict[str, Any]:
    """A baseline's model settings with the readout ``cnn_readout`` asks for: ``"flatten"`` as the presets have it
    (coordinate channels, then one linear map over every unit of the final map), ``"mean"`` (global average
    pooling), ``"coords"`` (coordinate channels, then pooling), or ``"unit"``: no pooling, an all-convolutional trunk
    strided down to one unit whose window is the preset's receptive field, at most the picture
    (:mod:`tokennet.models.strided_cnn`: 64 px for ``vqa-cnn``, 36 px for ``vqa-cnn-shallow``)."""
    if readout not in CNN_READOUTS:
        raise RecipeError(f"cnn_readout must be one of {', '.join(CNN_READOUTS)}, got {readout!r}")
    if readout != "unit":
        return {**model_settings, "readout": readout}
    pooled = create_model(preset, **model_settings)
    window = min(pooled.receptive_field().size, pooled.config.image_size)
    return {**model_settings, "readout": "unit", "window": window}


def train_baselines(model_settings: dict[str, Any], train, source, device, *, lr: float, precision: str = "fp32",
                    parallel: bool = False, readout: str = "flatten") -> dict[str, torch.nn.Module]:
    """Both CNN baselines (:data:`BASELINES`, by prefix), each as :func:`train_baseline` trains it, with the
    readout :func:`baseline_settings` gives.

    ``parallel`` (CPU only): the two train at once, one thread each — the first in a spawned process, the second
    here — instead of one after the other on all threads. A CNN this small gains little from a second thread, so
    this takes about the time of one of them (the weights are those of training each on one thread). If this
    process fails or is stopped, the worker is stopped too; a worker that fails or dies is a one-line error."""
    return train_baselines_timed(model_settings, train, source, device, lr=lr, precision=precision,
                                 parallel=parallel, readout=readout)[0]


def train_baselines_timed(model_settings: dict[str, Any], train, source, device, *, lr: float,
                          precision: str = "fp32", parallel: bool = False, readout: str = "flatten"
                          ) -> tuple[dict[str, torch.nn.Module], float]:
    """:func:`train_baselines`, and the seconds their training took per step (``train.max_iters``): in parallel
    the slower one's, one after the other the two added — the worker's start apart (what a time budget keeps per
    step, :func:`baseline_step_seconds` its estimate before training)."""
    settings = {preset: baseline_settings(preset, model_settings, readout) for preset in BASELINES.values()}
    if not parallel or torch.device(device).type != "cpu":
        started = time.perf_counter()
        models = {prefix: train_baseline(preset, settings[preset], train, source, device, lr=lr,
                                         precision=precision) for prefix, preset in BASELINES.items()}
        return models, (time.perf_counter() - started) / max(1, train.max_iters)
    (far, far_preset), (near, near_preset) = BASELINES.items()
    with _worker(_baseline_in_worker, far_preset, far_preset, settings[far_preset], train, source, lr,
                 precision) as receive:
        with one_thread():
            started = time.perf_counter()
            here = train_baseline(near_preset, settings[near_preset], train, source, device, lr=lr,
                                  precision=precision)
            took_here = time.perf_counter() - started
        state, took_there = receive("ok")
    m = create_model(far_preset, **settings[far_preset])
    m.load_state_dict(torch.load(io.BytesIO(state), weights_only=True))
    return {far: m.to(device).eval(), near: here}, max(took_here, took_there) / max(1, train.max_iters)


def _one_step_seconds(preset: str, settings: dict[str, Any], train, source, device, lr: float, precision: str,
                      steps: tuple[int, int]) -> float:
    """One baseline's seconds per step: trained for ``steps[0]`` and for ``steps[1]`` steps, the difference over the
    extra steps (building the model and the trainer cancel out), after ``steps[0]`` untimed (a fresh process's first
    steps pay for setting up its kernels: timed, they made the difference negative)."""
    few, more = steps
    took = []
    for n in (few, few, more):
        started = time.perf_counter()
        train_baseline(preset, settings, dataclasses.replace(train, max_iters=n), source, device, lr=lr,
                       precision=precision)
        took.append(time.perf_counter() - started)
    return max(0.0, took[2] - took[1]) / (more - few)


def baseline_step_seconds(model_settings: dict[str, Any], train, source, device, *, lr: float,
                          precision: str = "fp32", parallel: bool = False, readout: str = "flatten",
                          steps: tuple[int, int] = (2, 20)) -> float:
    """The seconds :func:`train_baselines` takes per step trained, measured here as it trains them: each baseline
    trained for ``steps[0]`` and for ``steps[1]`` steps, the difference over the extra steps. In parallel both at
    once on one thread each, the first in a spawned process (its start, a few seconds, is not counted), so a step
    costs the slower one's; one after the other, the two added. ``source`` must be a copy of the run's batches, not
    the one training reads (its furthest batch decides how many steps the baselines train). 18 extra steps, not 6,
    and both at once, not one at a time: either way the estimate fell short of what the run's steps then took
    (``docs/tutorials/vqa.md`` cites the budgeted runs)."""
    settings = {preset: baseline_settings(preset, model_settings, readout) for preset in BASELINES.values()}
    if not parallel or torch.device(device).type != "cpu":
        return sum(_one_step_seconds(preset, settings[preset], train, source, device, lr, precision, steps)
                   for preset in BASELINES.values())
    far_preset, near_preset = BASELINES.values()
    with _worker(_step_seconds_in_worker, far_preset, far_preset, settings[far_preset], train, source, lr,
                 precision, steps) as receive:
        receive("ready")  # both measure from here, at once
        with one_thread():
            here = _one_step_seconds(near_preset, settings[near_preset], train, source, device, lr, precision, steps)
        return max(here, receive("ok"))


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
    check_transformer(ctx)
    precision = cnn_precision(opts["cnn_precision"], device)  # a bad setting fails before training
    if opts["cnn_readout"] not in CNN_READOUTS:
        raise RecipeError(f"cnn_readout must be one of {', '.join(CNN_READOUTS)}, got {opts['cnn_readout']!r}")
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

    shared = {k: ctx.settings[k] for k in (*DATA_FIELDS, "max_question_len", "answer_readout")}
    parallel = opts["cnn_parallel"] and torch.get_num_threads() >= 2 and torch.device(device).type == "cpu"
    baselines = {"lr": opts["cnn_lr"], "precision": precision, "parallel": parallel, "readout": opts["cnn_readout"]}

    def finish(m) -> dict[str, Any]:  # noqa: ARG001
        out: dict[str, Any] = {}
        if not opts["baselines"]:
            return out
        steps = dataclasses.replace(train, max_iters=src.max_index + 1)  # what the transformer trained
        out["cnn_precision"] = precision
        held = spec.held_out()
        out["cnn_parallel"] = parallel
        out["cnn_readout"] = opts["cnn_readout"]
        cnns, out["cnn_seconds_per_step"] = train_baselines_timed(shared, steps, src, device, **baselines)
        for prefix, preset in BASELINES.items():
            cnn = cnns[prefix]
            out.update(evaluate(cnn, spec, held, prefix=prefix))
            out[f"{prefix}num_parameters"] = cnn.num_parameters()
            out[f"{prefix}receptive_field"] = cnn.receptive_field().size
            log.info("vqa baseline %s: exact match %.1f %% (unseen counts %s), %s parameters", preset,
                     out[f"{prefix}exact_match"], _percent(out.get(f"{prefix}exact_match_unseen_count")),
                     f"{out[f'{prefix}num_parameters']:,}")
        return out

    def finish_step_seconds() -> float:  # for a time budget: the baselines train the transformer's steps after it
        return baseline_step_seconds(shared, train, QABatches(spec, train.batch_size, max_len), device, **baselines)

    return Job(model=model.to(device), source=src, evaluate=monitor, tokens_per_batch=train.batch_size,
               finish=finish, finish_step_seconds=finish_step_seconds if opts["baselines"] else None,
               finish_step_metric="cnn_seconds_per_step", data=spec)


def evaluate_run(run, data) -> dict[str, Any]:
    """``tokennet eval``: exact match per template on the run's held-out questions, and the attention mass."""
    if data is not None and data != run.data.source:
        raise RecipeError("the vqa recipe evaluates on the run's own held-out questions; it takes no other data")
    spec, held = run.data, run.data.held_out()
    out: dict[str, Any] = {**evaluate(run.model, spec, held), "test_size": len(held)}
    if hasattr(run.model, "question_attention"):
        out.update(attention_mass(run.model, held, spec.words))
        out.update(attention_vs_others(run.model, held, spec.words))
        if run.settings.get("grouping", True) and patches_meet(run.model.config):
            out.update(patch_grouping(run.model, held, spec.words))
            out.update(head_summary(head_statistics(run.model, held, spec.words)))
        counts = _count_questions(spec, held)
        out.update(sink_summary(sink_weights(run.model, counts, spec.words)))
        out.update(counted_summary(counted_mass(run.model, counts, spec.words)))
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
    out.update({f"sink_weight_k{k}": weight for k, weight in best["by_k"].items()})
    out["sink_max_gap"] = round(max(abs(weight - 1 / (k + 1)) for k, weight in best["by_k"].items()), 4)
    return out


def counted_summary(cm: dict[str, Any]) -> dict[str, float]:
    """:func:`~tokennet.tasks.vqa.counted_mass` as flat metrics, for the layer whose weight on the counted animals
    follows ``k / (k + c)`` best (``counted_mass_layer``): ``counted_mass_k<k>`` (its mean per ``k``),
    ``counted_mass_c`` (the fitted ``c``: 1 for the hand-built counter, whose sink weighs one animal),
    ``counted_mass_gap`` (the largest gap from that curve) and ``counted_mass_r``."""
    if not cm:
        return {}
    layer = cm["best"]
    best = cm["layers"][layer]
    out = {"counted_mass_layer": float(layer), "counted_mass_c": best["c"], "counted_mass_gap": best["gap"],
           "counted_mass_r": best["r"]}
    out.update({f"counted_mass_k{k}": weight for k, weight in best["by_k"].items()})
    return out


register_recipe(Recipe(
    name="vqa",
    description="questions about pictures of animals (how many birds? is the top right animal the same species as "
    "the bottom left one?): a transformer over question + patch tokens, against FiLM CNNs",
    model="vqa-transformer",
    build=build,
    data=AnimalQuestions,
    default_data=GENERATED,
    option_help={
        "baselines": "also train the two CNN baselines on the same batches and report their exact match",
        "cnn_lr": "the CNN baselines' peak learning rate (Muon's scaled alike)",
        "cnn_precision": "the CNN baselines' precision: auto (bf16 where the CPU has it), bf16 or fp32",
        "cnn_parallel": "train the two CNN baselines at once, one thread each, where torch has two threads",
        "cnn_readout": "how the CNN baselines read their answer: flatten (every unit of the final map, by one linear "
        "map), mean (pooling), coords (coordinate channels, then pooling) or unit (one unit, nothing pooled)",
        "transformer": "generic (the lecture's transformer) or tuned (the task-specific pieces and their training)",
        "grouping": "measure how patches group by animal and each head's attention distance (where patches meet)",
    },
    options={"baselines": True, "cnn_lr": 3e-3, "cnn_precision": "auto", "cnn_parallel": True, "cnn_readout": "flatten",
             "transformer": "generic", "grouping": True},
    model_defaults=dict(GENERIC),
    train_defaults={"max_iters": 4000, "batch_size": 64, "warmup_iters": 100, "eval_interval": 1000,
                    "weight_decay": 0.05, "log_interval": 50, "optimizer": "muon", **GENERIC_TRAIN},
    evaluate_run=evaluate_run,
    headline=("exact_match", "exact_match_unseen_count"),
    baselines={"vqa-cnn": ("cnn_exact_match", "cnn_exact_match_unseen_count"),
               "vqa-cnn-shallow": ("shallow_cnn_exact_match", "shallow_cnn_exact_match_unseen_count")},
    variants={"tuned": {"transformer": "tuned"}},
    derive=derive_settings,
    smoke={"dim": 32, "num_layers": 1, "read_layers": [0], "num_heads": 2, "batch_size": 16, "test_size": 48,
           "val_size": 16},
))
