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
patches in one sequence, one encoder, the answer read from the question's summary token. The recipe's defaults,
each measured below: a patch is **two tokens**, its shape (a conv stem over the silhouette, colour-blind) and its
colour (the foreground's mean colour, shape-blind) — ``patch_stem="shape,colour"``, 48 stem channels — so a
question's query meets keys that hold one or the other, and a kind training never showed (a purple bird) is two
parts it did; in the first layer a patch's two tokens attend only to each other; the patches never attend to the
question (``modality_mask="image-first"``: the lecture's picture — the question's query does the looking); and
counts and colours are answered as **points** (``answer_readout="points"``: a count is a position on a line, a
colour one in RGB, :class:`~tokennet.models.vqa.AnswerHead`), so that no question can learn to veto one answer
it never met with in training; and **the question reads the picture in layers 1 and 2, with a sink score**: a
patch's tokens attend only to each other in every layer (``modality_mask="patch-local"``), the question's tokens
meet patch keys only in layers 1 and 2 (``read_layers=[1, 2]``), and every layer and head has a learned score on
the sink, starting at 2 (``sink_logit=2.0``: somewhere to rest from the start, as the hand-built counter's sink
is). After training,
with ``baselines=true`` (the default), two CNNs answer the same questions, trained on the same batches for
the same number of steps, each with about the transformer's parameter count (``cnn_lr`` their peak rate;
``cnn_precision``: ``auto``, the default, trains them with bf16 autocast on a CPU with bf16 in hardware, else in
fp32 as the transformer; the metric ``cnn_precision`` says which; ``cnn_parallel``, the default, trains the two at
once, one thread each, where torch has two threads or more — the metric ``cnn_parallel`` says whether it did):

- ``cnn_…``: a small ResNet conditioned on the question by FiLM, whose units' receptive field covers the
  whole image (preset ``vqa-cnn``);
- ``shallow_cnn_…``: two FiLM-conditioned conv layers after a patchify stem, whose 20-pixel field is smaller
  than the 32 pixels between two corner cells (preset ``vqa-cnn-shallow``): its answer is a mean of local
  votes, additive in the two corners, so "same species?" is out of its reach — the lecture's x1 … x7.

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
``full``: under patch-local they never do, and the ratio is 0), ``patch_grouping_ratio``
(:func:`~tokennet.tasks.vqa.patch_grouping`; ``bench/results/vqa_patch8.json``). ``tokennet eval`` recomputes the
transformer's figures from the saved run (the same numbers as ``metrics.json``); the CNNs' come from training (they
are not saved).

**Measured, one change at a time** (seed 0, the transformer alone — ``--set baselines=false`` — 3000 steps of 64,
held-out test set of 2000 questions, exact match in %; ``bench/results/vqa_ablation.json`` has every row's
command, the metrics, the commits and the machine; the runs shared 2 cores, so no wall time is quoted here):

===================================================  =====  =====  =====  =====  =====  =====  ======  =====
change                                               all    count  c_col  same   spec   col    unseen  att
===================================================  =====  =====  =====  =====  =====  =====  ======  =====
conv stem, a logit per answer (the default before)   87.5   82.2   61.0   97.3   98.8   98.5   19.6    2.04
counts as points on a line                           88.2   81.5   63.7   98.7   99.0   98.3   58.4    2.34
and shape, colour apart, summed in one token         78.9   85.4   71.0   49.1   100    85.7   61.2    1.62
two tokens per patch (shape, colour)                 84.5   96.8   95.2   99.5   99.8   32.4   83.6    1.34
and the pair sees only itself in layer 0             92.8   96.1   93.2   99.5   100    75.4   87.2    2.12
and image-first                                      93.0   97.6   94.2   99.5   99.5   74.7   87.2    1.91
and colours as points too (the default before)       97.6   96.4   91.9   99.5   100    100    88.0    2.16
that, and a sink score per head (``= 2``)            97.3   97.8   89.9   99.5   100    99.0   82.8    3.30
that, patch-local instead of image-first             96.6   96.4   91.2   99.7   100    95.6   89.6    2.36
that, summary-reads instead of image-first           97.3   95.4   92.7   98.9   100    99.5   80.0    2.20
summary-reads, and a sink score per head (``= 2``)   92.6   95.4   83.6   91.9   100    91.6   83.6    3.97
summary-reads, reading in layer 2 only               94.9   99.0   96.7   77.1   100    100    95.2    5.62
summary-reads, reading in layers 1 and 2             97.6   99.3   99.5   90.6   100    97.8   98.4    4.81
that with 8 heads of 8 (the same parameters)         97.0   99.0   98.7   86.3   100    100    95.6    2.37
that with a sink score per head (``= 2``)            99.9   99.8   99.5   100    100    100    98.0    3.38
that with the words reading too: the default's model 99.6   99.0   99.5   99.5   100    99.8   98.0    3.70
===================================================  =====  =====  =====  =====  =====  =====  ======  =====

Seeds 1 and 2 of the best of these (same settings, 1 thread), against the default before's (``vqa_default.json``,
whose seeds 1 and 2 were 1-thread runs too):

===================================================  =====  =====  =====  =====  =====  =====  ======  =====
run                                                  all    count  c_col  same   spec   col    unseen  att
===================================================  =====  =====  =====  =====  =====  =====  ======  =====
the default before, seed 1                           93.5   95.4   92.7   99.7   100    78.8   74.0    3.58
the default before, seed 2                           98.7   98.2   97.2   99.7   99.8   98.8   93.2    2.35
summary-reads, layers 1 and 2, sink score: seed 1    94.4   99.2   93.4   85.8   93.8   100    88.0    6.21
summary-reads, layers 1 and 2, sink score: seed 2    91.2   99.0   100    52.5   100    99.8   97.6    2.35
the default before and a sink score: seed 1          95.9   96.4   90.2   97.1   100    96.2   70.0    2.10
the default's model, seed 1                          98.6   98.2   97.5   100    100    97.3   96.0    4.69
the default's model, seed 2                          96.9   98.7   88.3   99.7   99.8   98.6   80.8    2.64
that, 4000 steps (**the default**), seed 2           99.1   100    96.5   99.7   100    99.3   93.6    3.15
``pair_binding=shape-reads-colour``: seed 0          99.2   99.5   99.7   97.6   100    98.8   96.8    3.39
``pair_binding=shape-reads-colour``: seed 1          99.3   98.5   98.9   99.2   100    99.7   96.0    2.78
``pair_binding=shape-reads-colour``: seed 2          99.0   99.2   98.6   96.9   100    100    91.2    2.36
that, 4000 steps, seed 2                             98.5   99.5   98.4   97.2   100    97.1   91.6    2.66
===================================================  =====  =====  =====  =====  =====  =====  ======  =====

(``c_col``: ``count_colour``; ``same``: ``same_species``, the corner pairs; ``spec``: ``species``; ``col``:
``colour``; ``unseen``: ``unseen_count``; ``att``: ``attention_vs_other_animals``, rolled out. The first row is
``bench/results/vqa_transformer.json``; colours as points with the full mask instead of image-first: 95.9 overall,
colour 88.9, ``bench/results/vqa_ablation.json``. A sink score: ``sink_logit=2``; patch-local, summary-reads, reading
layers: ``modality_mask``, ``read_layers``. ``att`` is rolled out; per layer (in the JSON): 3.73 / 2.55 / 1.81 in
layers 0 / 1 / 2 for the default before, 5.86 and 3.18 in layers 1 and 2 for the default's model, its only reading
layers. Medians of the default's model's seeds 0–2 at 3000 steps (1 thread): count 98.7, count_colour 97.5, corner
pairs 99.7, held-out counts 96.0, attention 3.70; the default before's (``vqa_default.json`` as of 031a042, seed 0 on
2 threads): 95.9, 94.5, 99.7, 92.0, 2.35.)
What each change fixed, read off the misses: with a logit per answer, the test's held-out (question,
answer) pairs are answered at or below chance — *how many fish?* never answered 7 in training, *what colour is the
bird?* never *purple* (a held-out kind) — because a question learns its own "never" for them (the second row moves
the held-out counts from 20 to 58 %; colours as points, the colours from 75 to 100 %). With one token per patch,
counting missed by one exactly the held-out kind in the picture: its token is a new vector as a whole (a conv over
the pixels binds colour to shape); apart but summed in one token, the query's score is still a sum of a shape term
and a colour term, and a green impala scores between; as two tokens, each key is pure, and counting by colour went
from 64 to 95 %. The layer-0 pair mask lets a shape token take in its colour for *what colour is the impala?* (32 →
75 %). Where the question reads: when the summary token alone reads the image, and only from layer 1 on (where the
patches' keys have been through one or two per-patch layers), the counts are answered at 99 %, held-out ones
included; reading in layer 2 alone leaves one MLP after the read, and the corner pairs train late (77 %). With the
sink score, on seed 0, they train in time (validation at step 2000: 82 % without it, 92 % with it) and every goal is
met (count 99.8, attention 3.38) — but not on seeds 1 and 2: the corner pairs stay at 86 % and at chance (the
species of two corners on seed 1, 94 %). Letting the words read too (patch-local: the words meet patch keys too, in
layers 1 and 2) keeps the corner pairs at 99.5–100 % on every seed: the default's model. Its seed 2 is the weak one:
counting by colour 88 %, held-out counts 81 %, attention 2.64. The default before with the sink score alone lifts
seed 0 over both goals (count 97.8, attention 3.30), not seed 1 (96.4, 2.10). The default before's seed 1 misses on
colours (78.8 %) are all held-out kinds: the blue turtle answered *purple* 36 times in 38, the red cat 20 in 30, the
purple bird (*blue*) 18 in 44 — the binding of colour to shape that two tokens per patch were to undo, back on one
seed; summary-reads with layers 1 and 2 and the sink score answers every colour of seed 1 (100 %); the default's
model misses 10 yellow impalas in 43 (colour 97.3 %). Its seed 2's colour counts miss the same way: one short on
*yellow* and *purple* (50 of 426), the colours of that seed's held-out kinds (a yellow impala, a purple turtle) — a
colour token that has read its shape is a new vector for a kind training never showed. A colour token that reads only
itself (``pair_binding="shape-reads-colour"``: the shape token still takes in its colour) counts them (6 misses of
426; colour counts 98.6–99.7 % on seeds 0–2, held-out counts 91–97 %) but the corner pairs drop (96.9–99.2 %) and
so does the attention on the asked animal (2.36–3.39: the colour counts' question puts *less* weight on the counted
animals than on the others, 0.6–2.0×) — measured, not the default. 1000 more steps do more for seed 2 (count colour
96.5, held-out counts 93.6, attention 3.15): **the default is the default's model at 4000 steps**. Its seeds 0–2 with
the CNNs beside it are in ``bench/results/vqa_default.json``: every seed at 99 % overall or more and its attention
on the asked animal at 3× or more; against 3000 steps, the colour counts and held-out counts of seeds 0 and 1 move
by a few points either way (per seed in the JSON).

The default run, with both CNNs beside the transformer (same batches, same steps, ``cnn_lr``), seeds 0–2: the
figures are in ``bench/results/vqa_default.json`` (the commands, the commit, the machine, the time of the whole
run). ``tokennet eval`` on a run recomputes its transformer's figures; the receptive-field sweep
(``bench/vqa_receptive_field.py --into RUN``, ``bench/results/vqa_receptive_field.json``) shows in the run's report.
In that sweep every CNN, whatever its field, answers the corner pairs at chance, and so do residual CNNs
(``--arch resnet``, ``bench/results/vqa_receptive_field_resnet.json``) that do learn the one-corner *species*
question, and one with an 84-pixel field trained 4× as long: a field that holds both corners is needed, not
enough.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import tempfile
from typing import Any

import torch

from ..data.vqa import COLOURS, GENERATED, AnimalQuestions, QABatches, QASet, tokenize_question
from ..device import native_bf16
from ..errors import RecipeError, one_line
from ..lifecycle import BuildContext, Job, Recipe, register_recipe
from ..models.registry import create_model
from ..models.vqa import answer_points
from ..tasks.vqa import attention_mass, attention_vs_others, counted_mass, exact_match, patch_grouping, sink_weights
from ..train.trainer import Trainer

__all__ = ["evaluate", "train_baseline", "train_baselines", "BASELINES"]

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
    ``max_iters``), its own peak learning rate ``lr`` and ``precision``; returns the trained model."""
    steps = dataclasses.replace(train, lr=lr, time_budget=None, eval_interval=0, checkpoint_interval=0,
                                progress=False, log_interval=0, report=False, tensorboard=False, precision=precision)
    torch.manual_seed(train.seed)
    m = create_model(preset, **model_settings).to(device)
    with tempfile.TemporaryDirectory() as scratch:  # the baselines' checkpoints are not part of the run
        Trainer(m, steps, source, out_dir=scratch, device=device, tokens_per_batch=train.batch_size).fit()
    return m.eval()


def _baseline_in_worker(conn, preset: str, model_settings: dict[str, Any], train, source, lr: float,
                        precision: str) -> None:
    """A spawned process's share of :func:`train_baselines`: one CNN on one thread; sends ``("ok", its state dict
    as torch.save's bytes)`` or ``("error", message)`` back through ``conn``."""
    torch.set_num_threads(1)
    try:
        m = train_baseline(preset, model_settings, train, source, "cpu", lr=lr, precision=precision)
        buf = io.BytesIO()  # bytes, not tensors: torch's shared-memory handles die with this process
        torch.save(m.state_dict(), buf)
        conn.send(("ok", buf.getvalue()))
    except BaseException as e:  # noqa: BLE001 - reported in the parent, whatever it was
        conn.send(("error", f"{type(e).__name__}: {one_line(e)}"))
    finally:
        conn.close()


def train_baselines(model_settings: dict[str, Any], train, source, device, *, lr: float, precision: str = "fp32",
                    parallel: bool = False) -> dict[str, torch.nn.Module]:
    """Both CNN baselines (:data:`BASELINES`, by prefix), each as :func:`train_baseline` trains it.

    ``parallel`` (CPU only): the two train at once, one thread each — the first in a spawned process, the second
    here — instead of one after the other on all threads. A CNN this small gains little from a second thread, so
    this takes about the time of one of them (the weights are those of training each on one thread). If this
    process fails or is stopped, the worker is stopped too; a worker that fails or dies is a one-line error."""
    if not parallel or torch.device(device).type != "cpu":
        return {prefix: train_baseline(preset, model_settings, train, source, device, lr=lr, precision=precision)
                for prefix, preset in BASELINES.items()}
    import multiprocessing

    (far, far_preset), (near, near_preset) = BASELINES.items()
    ctx = multiprocessing.get_context("spawn")  # not fork: this process's thread pools do not survive a fork
    receive, send = ctx.Pipe(duplex=False)
    worker = ctx.Process(target=_baseline_in_worker, daemon=True, name=f"tokennet-{far_preset}",
                         args=(send, far_preset, model_settings, train, source, lr, precision))
    worker.start()
    send.close()  # the worker holds the only sending end: its death ends the pipe (EOFError below)
    threads, done = torch.get_num_threads(), False
    try:
        torch.set_num_threads(1)
        try:
            here = train_baseline(near_preset, model_settings, train, source, device, lr=lr, precision=precision)
        finally:
            torch.set_num_threads(threads)
        try:
            status, payload = receive.recv()
        except EOFError:
            worker.join()
            raise RecipeError(f"the {far_preset} baseline's worker process died (exit code {worker.exitcode}); "
                              "--set cnn_parallel=false trains the baselines one after the other") from None
        if status != "ok":
            raise RecipeError(f"the {far_preset} baseline failed in its worker process: {payload}")
        done = True
    finally:
        receive.close()
        worker.join(timeout=30 if done else 0)
        if worker.is_alive():
            worker.terminate()
            worker.join()
    m = create_model(far_preset, **model_settings)
    m.load_state_dict(torch.load(io.BytesIO(payload), weights_only=True))
    return {far: m.to(device).eval(), near: here}


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
    precision = cnn_precision(opts["cnn_precision"], device)  # a bad setting fails before training
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
        out["cnn_precision"] = precision
        qa = spec.held_out()
        shared = {k: ctx.settings[k] for k in (*DATA_FIELDS, "max_question_len", "answer_readout")}
        parallel = opts["cnn_parallel"] and torch.get_num_threads() >= 2 and torch.device(device).type == "cpu"
        out["cnn_parallel"] = parallel
        cnns = train_baselines(shared, steps, src, device, lr=opts["cnn_lr"], precision=precision, parallel=parallel)
        for prefix, preset in BASELINES.items():
            cnn = cnns[prefix]
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
        counts = _count_questions(spec, qa)
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
    out.update({f"sink_weight_k{k}": w for k, w in best["by_k"].items()})
    out["sink_max_gap"] = round(max(abs(w - 1 / (k + 1)) for k, w in best["by_k"].items()), 4)
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
    out.update({f"counted_mass_k{k}": w for k, w in best["by_k"].items()})
    return out


register_recipe(Recipe(
    name="vqa",
    description="questions about pictures of animals (how many birds? is the top right animal the same species as "
    "the bottom left one?): a transformer over question + patch tokens, against FiLM CNNs",
    model="vqa-transformer",
    build=build,
    data=AnimalQuestions,
    default_data=GENERATED,
    options={"baselines": True, "cnn_lr": 3e-3, "cnn_precision": "auto", "cnn_parallel": True},
    model_defaults={"patch_stem": "shape,colour", "stem_channels": 48, "modality_mask": "patch-local",
                    "read_layers": [1, 2], "sink_logit": 2.0, "answer_readout": "points"},
    train_defaults={"max_iters": 4000, "batch_size": 64, "lr": 3e-3, "warmup_iters": 100, "eval_interval": 1000,
                    "weight_decay": 0.05, "log_interval": 50, "optimizer": "muon", "muon_lr": 0.02},
    evaluate_run=evaluate_run,
    smoke={"dim": 32, "num_layers": 1, "read_layers": [0], "num_heads": 2, "batch_size": 16, "test_size": 48,
           "val_size": 16},
))
