"""Recipe ``multimodal``: one trunk, one checkpoint, trained on text, pictures, speech, spheres and graphs at once.

The lecture's claim — *turn any data into tokens, then one generic transformer processes the tokens* — as one run.
Each task is a single-task recipe reused as it is (its data spec, tokenizer, training batches, validation and
``evaluate_run``):

========  ============  ==========================================================================
task      recipe        tokens, positions, mask, head
========  ============  ==========================================================================
text      ``gpt-char``  Tiny Shakespeare characters, learned positions, causal mask, next-character
image     ``vit``       the 8×8 digits as patches, learned 2-D positions, full mask, digit head
audio     ``audio``     spoken digits (espeak-ng) as spectrogram patches, full mask, digit head
sphere    ``sphere``    digits projected onto the sphere, spherical-harmonic positions, digit head
graph     ``graph``     graph nodes, Laplacian spectral-kernel bias, distance classes
========  ============  ==========================================================================

Shared: one stack of blocks (:mod:`tokennet.models.multimodal`) and one 10-way head for the three digit tasks
("which digit is this?", drawn, spoken or on a sphere). Per task: only the domain step, the positions, the mask
and the head. ``tasks=text,image,graph`` trains a subset (without ``audio`` no espeak-ng is needed).

Mixing: step ``i`` trains one batch of one task, drawn with probabilities proportional to ``mix`` (``task=w``
pairs, the tasks not named weigh 1) from a generator seeded by ``(seed, i)`` — a pure function of ``i``, so resume
is exact; that task's loss is multiplied by its ``loss_weights`` entry (default 1). Each task's own settings are
settings here with the task's name in front (``text_block_size``, ``sphere_num_centres``, ``graph_test_size``).

``metrics.json`` holds, per task, what that task's recipe's ``evaluate_run`` computes from the saved run
(``text.val_loss``, ``image.test_accuracy``, ...), and, with two or more digit tasks, ``cross_modal``: how the shared
digit head answers the same digit in different modalities and whether the trunk's summaries of one modality find the
same digit in another (:func:`~tokennet.tasks.multimodal.cross_modal`); ``tokennet eval`` recomputes all of it.
During training each task's validation figures are logged as ``<name>_<task>`` (``val_loss_text``,
``test_accuracy_image``).

A new task can start from the trunk: ``tokennet train vit --data mnist1d --init RUN`` builds the data's ViT around
the run's blocks (:func:`~tokennet.interop.init.from_trunk`). ``bench/multimodal.py`` measures what sharing does.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from typing import Any

import torch

from ..data.multimodal import TASKS, MultimodalData, parse_tasks
from ..errors import RecipeError
from ..lifecycle import BuildContext, Job, Recipe, get_recipe, register_recipe
from ..models.multimodal import TRUNK_FIELDS
from ..models.registry import create_model
from ..tasks.multimodal import cross_modal, part_run
from ..train.trainer import TrainConfig
from . import audio, gpt, graph, sphere, vit  # noqa: F401 - the single-task recipes this one composes

__all__ = ["PARTS", "SHARED_HEAD", "parse_weights", "MixedBatches"]

log = logging.getLogger(__name__)

PARTS = {"text": "gpt-char", "image": "vit", "audio": "audio", "sphere": "sphere", "graph": "graph"}
SHARED_HEAD = ("image", "audio", "sphere")  # the digit tasks: one 10-way head
# What this recipe changes in each single recipe's defaults: the trunk's block kind (the GPT's bias and QK-norm
# are the shared Decoder's), and the extras that would retrain other models or measure other data.
PART_DEFAULTS: dict[str, dict[str, Any]] = {
    "text": {"bias": True, "qk_norm": False, "block_size": 64, "eval_iters": 10, "sample_tokens": 200},
    "image": {"svm_baseline": False, "cnn_baseline": False},
    "audio": {"wave_augment": "none", "baseline": False, "robustness": False},
    "sphere": {"ablation": False},
    "graph": {"ablation": False},
}
_TRAIN_ONLY = {f.name for f in dataclasses.fields(TrainConfig)}
_LORA = {"lora_rank", "lora_alpha", "lora_dropout", "lora_targets", "lora_save", "lora_modules_to_save"}


def _part_defaults(task: str) -> dict[str, Any]:
    """Task ``task``'s settings when nothing sets them: its recipe's defaults with :data:`PART_DEFAULTS`."""
    return {**get_recipe(PARTS[task]).defaults(None), **PART_DEFAULTS[task]}


def _part_options(task: str) -> dict[str, Any]:
    """The task's own settings this recipe exposes as ``<task>_<name>``: its model, data and recipe settings with a
    scalar default (not the trunk's shape, the trainer's or fine-tuning's, nor those its recipe says do not apply)."""
    sub = get_recipe(PARTS[task])
    defaults = _part_defaults(task)
    skip = set(TRUNK_FIELDS) | _TRAIN_ONLY | _LORA | (sub.unused(defaults) if sub.unused else set())
    return {f"{task}_{k}": v for k, v in defaults.items() if k not in skip and isinstance(v, (bool, int, float, str))}


def _part_help() -> tuple[dict[str, str], dict[str, str]]:
    """``--show-settings``' description and heading of each ``<task>_<name>`` setting: its own recipe's words."""
    helps = {"mix": "how often each task's batch is drawn: task=weight pairs (the tasks not named: 1)",
             "loss_weights": "each task's loss multiplier: task=weight pairs (the tasks not named: 1)"}
    groups = {}
    for t in TASKS:
        docs = get_recipe(PARTS[t]).setting_docs()
        for k in _part_options(t):
            helps[k] = docs[k.removeprefix(f"{t}_")][1]
            groups[k] = f"task {t} (recipe {PARTS[t]}'s settings)"
    return helps, groups


def parse_weights(text: str, tasks: list[str], what: str) -> dict[str, float]:
    """``"text=2,image=0.5"`` → a positive weight per task (the tasks not named: 1); anything else is one line."""
    out = dict.fromkeys(tasks, 1.0)
    for item in (piece.strip() for piece in str(text).split(",") if piece.strip()):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or name not in TASKS:
            raise RecipeError(f"{what}: expected task=weight pairs with tasks from {', '.join(TASKS)}, got {item!r}")
        if name not in tasks:
            raise RecipeError(f"{what} names {name!r}, which is not among tasks={','.join(tasks)}")
        try:
            weight = float(value)
        except ValueError:
            weight = float("nan")
        if not weight > 0 or weight == float("inf"):
            raise RecipeError(f"{what}: the weight of {name!r} must be a positive number, got {value.strip()!r}")
        out[name] = weight
    return out


def make_data(source: str | None, settings: dict[str, Any]) -> MultimodalData:
    """The tasks and, per task, its recipe, data spec and settings; every mixing setting is checked here, before the
    run directory is written."""
    if source not in (None, ""):
        raise RecipeError("the multimodal recipe trains on each task's own data; it takes no --data (set tasks=...)")
    names = parse_tasks(settings["tasks"])
    parse_weights(settings["mix"], names, "mix")
    parse_weights(settings["loss_weights"], names, "loss_weights")
    parts = {}
    for t in names:
        sub = get_recipe(PARTS[t])
        defaults = _part_defaults(t)
        defaults.update({k: settings[k] for k in (*TRUNK_FIELDS, "seed", "batch_size")})
        defaults.update({k.removeprefix(f"{t}_"): v for k, v in settings.items() if k in _part_options(t)})
        spec = sub.data_spec(None, defaults)
        parts[t] = {"recipe": sub.name, "spec": spec.to_dict(), "settings": defaults}
    return MultimodalData(tasks=",".join(names), parts=parts)


class MixedBatches:
    """Batch ``i``: ``((task, x), y)`` from the task drawn for step ``i`` (probabilities ∝ ``mix``, a generator
    seeded by ``(seed, i)``: a pure function of ``i``); the task's own source gives its batch ``i``."""

    def __init__(self, sources: dict[str, Any], mix: dict[str, float], seed: int):
        self.sources, self.seed = sources, seed
        self.names = list(sources)
        self.weights = [mix[t] for t in self.names]

    def task(self, index: int) -> str:
        return random.Random(self.seed * 1_000_003 + index).choices(self.names, self.weights)[0]

    def batch(self, index: int):
        name = self.task(index)
        x, y = self.sources[name].batch(index)
        return (name, x), y


def _build_part(ctx: BuildContext, name: str, part: dict[str, Any]) -> Job:
    """Task ``name``'s single recipe's ``build`` on its own settings and spec (its model is rebuilt in the trunk)."""
    from ..data.spec import spec_from_dict

    sub = get_recipe(part["recipe"])
    settings = dict(part["settings"])
    model, train, opts = sub.split(settings)
    sub_ctx = BuildContext(recipe=sub, settings=settings, given=set(), model=model, train=train, options=opts,
                           data=spec_from_dict(part["spec"]), source=None, device=ctx.device, out_dir=ctx.out_dir,
                           tokenizer=ctx.tokenizer if name == "text" else None)
    job = sub.build(sub_ctx)
    part["settings"] = settings  # with what its data decided (vocab_size, num_classes, ...)
    if job.data is not None:
        part["spec"] = job.data.to_dict()
    return job


def build(ctx: BuildContext) -> Job:
    spec: MultimodalData = ctx.data
    names = spec.names()
    parts = {t: dict(spec.parts[t]) for t in names}
    jobs = {t: _build_part(ctx, t, parts[t]) for t in names}
    torch.manual_seed(ctx.train.seed)
    model = create_model("multimodal", **{**ctx.model, "parts": {t: j.model.config.to_dict() for t, j in jobs.items()},
                                          "shared_head": [t for t in SHARED_HEAD if t in names],
                                          "weights": parse_weights(ctx.options["loss_weights"], names, "loss_weights")})
    mix = parse_weights(ctx.options["mix"], names, "mix")
    src = MixedBatches({t: j.source for t, j in jobs.items()}, mix, ctx.train.seed)
    log.info("multimodal: %s; one trunk of %d × %d, %.3fM parameters in all; mix %s", ", ".join(names),
             ctx.settings["num_layers"], ctx.settings["dim"], model.num_parameters() / 1e6, mix)

    def evaluate(m) -> dict[str, float]:
        return {f"{k}_{t}": v for t, j in jobs.items() for k, v in j.evaluate(m.part(t)).items()}

    def finish(m) -> dict[str, Any]:
        out: dict[str, Any] = {"tasks": ",".join(names)}
        for t, j in jobs.items():
            if j.finish is not None:  # (epochs: the part's batch indices are the run's steps, not its own)
                out.update({f"{t}_{k}": v for k, v in j.finish(m.part(t)).items() if k not in ("epochs",)})
        return out

    return Job(model=model.to(ctx.device), source=src, evaluate=evaluate, tokens_per_batch=ctx.train.batch_size,
               tokenizer=jobs["text"].tokenizer if "text" in jobs else None, finish=finish,
               data=dataclasses.replace(spec, parts=parts))


def evaluate_run(run, data) -> dict[str, Any]:
    """``tokennet eval``: per task, its own recipe's ``evaluate_run`` on that task's part of the saved run; with two
    or more digit tasks, ``cross_modal``: how the shared digit head agrees across them
    (:func:`~tokennet.tasks.multimodal.cross_modal`)."""
    if data is not None:
        raise RecipeError("the multimodal recipe evaluates each task on its own held-out data; it takes no --data")
    out: dict[str, Any] = {t: get_recipe(PARTS[t]).evaluate_run(part_run(run, t), None) for t in run.data.names()}
    if sum(t in run.model.config.shared_head for t in run.model.tasks) >= 2:
        out["cross_modal"] = cross_modal(run)
    return out


def unused(settings: dict[str, Any]) -> set[str]:
    """The model config's composition fields are decided by ``tasks``, ``mix`` and ``loss_weights``, and the parts'
    settings of the tasks not trained do not apply."""
    names = set(parse_tasks(settings["tasks"])) if settings.get("tasks") else set(TASKS)
    return {"parts", "shared_head", "weights"} | {k for t in TASKS if t not in names for k in _part_options(t)}


_SMOKE = {"dim": 32, "num_layers": 1, "num_heads": 2, "batch_size": 8, "tasks": "text,image,sphere,graph",
          "text_block_size": 16, "text_eval_iters": 2, "text_sample_tokens": 8,
          "sphere_num_centres": 48, "sphere_num_samples": 256, "sphere_patch_size": 8, "sphere_rings": 2,
          "sphere_sh_degree": 3, "sphere_test_size": 40, "sphere_val_size": 16,
          "graph_test_size": 64, "graph_val_size": 16, "graph_pe_dim": 8}

_HELP, _GROUPS = _part_help()

register_recipe(Recipe(
    name="multimodal",
    description="one trunk on text, digits images, spoken digits, digits on the sphere and graphs at once "
    "(tasks=..., mix=..., loss_weights=...)",
    model="multimodal",
    build=build,
    data=MultimodalData,
    make_data=make_data,
    options={"mix": "", "loss_weights": "", **{k: v for t in TASKS for k, v in _part_options(t).items()}},
    option_help=_HELP,
    option_groups=_GROUPS,
    model_defaults={"dim": 64, "num_layers": 2, "num_heads": 4, "mlp_ratio": 2.0},
    train_defaults={"max_iters": 3000, "time_budget": 290.0, "batch_size": 32, "lr": 2e-3, "warmup_iters": 100,
                    "weight_decay": 0.05, "eval_interval": 500, "log_interval": 50},
    evaluate_run=evaluate_run,
    headline=("text.val_loss", "image.test_accuracy", "audio.test_accuracy", "sphere.test_accuracy",
              "graph.test_accuracy"),
    unused=unused,
    smoke=_SMOKE,
))
