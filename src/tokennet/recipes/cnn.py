"""Recipe ``cnn``: a CNN image classifier on the ``vit`` recipe's data — the baseline a ViT is measured against.

``--data`` as for ``vit`` (:mod:`tokennet.data.vision_data`): ``digits`` (default; preset ``cnn-digits``) or
``fashion-mnist`` (or a directory of its idx files; preset ``cnn-fashion``). 1-D signals (``mnist1d``) are not
for this 2-D CNN. The run is an image-classifier run like a ViT's (``run.classify``, ``tokennet generate
--image``); ``metrics.json`` holds ``test_accuracy``.

:func:`cnn_baseline` trains a CNN on any :class:`~tokennet.data.vision_data.VisionData` split for a given
number of steps and returns its test accuracy (``baseline_cnn_accuracy``), for other recipes to report beside
their own model (the ``vit`` recipe's SVM has a CNN beside it this way), and for ``bench/vit_vs_cnn.py``.
"""

from __future__ import annotations

import logging
import tempfile
from typing import Any

import torch

from ..data.augment import Augment
from ..data.image_batches import ImageBatches, evaluate_classifier
from ..data.vision_data import TRAIN_SIZE_HELP, ImageDataset, VisionData, dataset_kind, training_subset
from ..errors import DataError
from ..lifecycle import BuildContext, Job, Recipe, register_recipe
from ..models.registry import config_from_dict, create_model, preset_info
from ..train.trainer import TrainConfig, Trainer

__all__ = ["cnn_baseline", "fit_classifier", "PROFILES"]

log = logging.getLogger(__name__)

PROFILES: dict[str, dict[str, Any]] = {
    "digits": {"model": "cnn-digits", "settings": {}},
    "fashion-mnist": {"model": "cnn-fashion",
                      "settings": {"max_iters": 6000, "time_budget": 540.0, "batch_size": 128, "lr": 2e-3,
                                   "warmup_iters": 300, "eval_interval": 1000, "translate": 1, "flip": True}},
}
_OPTIONS = {"translate": 1, "flip": False, "eval_batch_size": 500, "train_size": 0}
_TRAIN_DEFAULTS = {"max_iters": 1500, "time_budget": 60.0, "batch_size": 64, "lr": 2e-3, "warmup_iters": 100,
                   "weight_decay": 0.05, "eval_interval": 500, "log_interval": 50}
DATA_FIELDS = ("image_size", "in_channels", "num_classes")


def _kind(data: str | None) -> str:
    kind = dataset_kind(data)
    if kind not in PROFILES:
        raise DataError(f"the cnn recipe classifies images (digits, fashion-mnist or a directory of idx files), not "
                        f"{kind}'s 1-D signals")
    return kind


def data_defaults(data: str | None) -> dict[str, Any]:
    """The dataset's profile: its CNN preset's fields and its training settings."""
    prof = PROFILES[_kind(data)]
    family, preset, _ = preset_info(prof["model"])
    cfg = config_from_dict({"family": family, **preset}).to_dict()
    cfg.pop("family")
    return {**cfg, **prof["settings"]}


def _data_fields(ds: VisionData) -> dict[str, Any]:
    return {"image_size": ds.image_size, "in_channels": ds.in_channels, "num_classes": ds.num_classes}


def fit_classifier(data: VisionData, *, steps: int, preset: str = "cnn", batch_size: int = 64, lr: float = 2e-3,
                   weight_decay: float = 0.05, warmup_iters: int = 100, seed: int = 0, augment: Augment | None = None,
                   device: str | torch.device = "cpu", **model) -> dict[str, Any]:
    """Train any image classifier preset (a CNN, a ViT) on ``data``'s training split for ``steps`` optimizer
    steps — AdamW, warm-up then cosine, as every tokennet run — and test it.

    Args:
        data: the split (``x_train``, ``y_train``, ``x_test``, ``y_test``).
        steps: the step budget.
        preset: the model preset; ``image_size``, ``in_channels`` and ``num_classes`` come from the data, and
            ``**model`` replaces any other config field (``widths=[16, 32]``, ``dim=64``).
        batch_size, lr, weight_decay, warmup_iters, seed: training settings.
        augment: an :class:`~tokennet.data.augment.Augment` for the training batches (None: none).
        device: where to train.

    Returns:
        ``test_accuracy`` (in [0, 1]), ``test_loss``, ``parameters`` and the trained ``model`` (eval mode).
    """
    torch.manual_seed(seed)
    m = create_model(preset, **{**_data_fields(data), **model}).to(device)
    src = ImageBatches(data.x_train, data.y_train, min(batch_size, len(data.y_train)), seed=seed, augment=augment)
    cfg = TrainConfig(max_iters=steps, batch_size=src.batch_size, lr=lr, weight_decay=weight_decay,
                      warmup_iters=min(warmup_iters, max(0, steps // 5)), eval_interval=0, checkpoint_interval=0,
                      log_interval=0, progress=False, report=False, seed=seed)
    with tempfile.TemporaryDirectory() as scratch:  # a baseline's checkpoints are not kept
        Trainer(m, cfg, src, out_dir=scratch, device=device, label=f"{preset} baseline").fit()
    m.eval()
    scores = evaluate_classifier(m, data.x_test, data.y_test)
    return {**scores, "parameters": sum(param.numel() for param in m.parameters()), "model": m}


def cnn_baseline(data: VisionData, *, steps: int, preset: str = "cnn", batch_size: int = 64, lr: float = 2e-3,
                 seed: int = 0, augment: Augment | None = None, device: str | torch.device = "cpu",
                 **model) -> dict[str, Any]:
    """A CNN baseline for another recipe's report: :func:`fit_classifier` with a CNN preset.

    Returns ``baseline_cnn_accuracy`` (test accuracy in [0, 1]), ``baseline_cnn_loss``,
    ``baseline_cnn_parameters`` and ``baseline_cnn`` (a description of what was trained).
    """
    result = fit_classifier(data, steps=steps, preset=preset, batch_size=batch_size, lr=lr, seed=seed, augment=augment,
                       device=device, **model)
    m = result["model"]
    config = m.config
    return {"baseline_cnn_accuracy": result["test_accuracy"], "baseline_cnn_loss": result["test_loss"],
            "baseline_cnn_parameters": result["parameters"],
            "baseline_cnn": f"{preset} ({config.arch}, widths {config.widths}, depths {config.depths}; receptive field "
                            f"{m.receptive_field().size} px), {steps} steps of batch "
                            f"{min(batch_size, len(data.y_train))}, lr {lr}"}


def build(ctx: BuildContext) -> Job:
    spec: ImageDataset = ctx.data
    _kind(spec.source)
    dataset = training_subset(spec.load(), int(ctx.options["train_size"]))
    for k, v in _data_fields(dataset).items():
        ctx.from_data(k, v)
    opts, train = ctx.options, ctx.train
    torch.manual_seed(train.seed)
    model = create_model("cnn", **ctx.model)
    aug = Augment(translate=int(opts["translate"]), flip=bool(opts["flip"]))
    src = ImageBatches(dataset.x_train, dataset.y_train, train.batch_size, seed=train.seed,
                       augment=aug if aug.active else None)
    log.info("%s: %d train / %d test; CNN (%s) %.3fM parameters, receptive field %d px", dataset.name,
             len(dataset.y_train), len(dataset.y_test), model.config.arch, model.num_parameters() / 1e6,
             model.receptive_field().size)

    def evaluate(m) -> dict[str, float]:
        return evaluate_classifier(m, dataset.x_test, dataset.y_test, batch_size=opts["eval_batch_size"])

    def finish(m) -> dict[str, Any]:
        return {"dataset": dataset.name, "train_size": len(dataset.y_train),
                "receptive_field": m.receptive_field().size,
                "epochs": round((src.max_index + 1) / src.steps_per_epoch, 2)}

    return Job(model=model.to(ctx.device), source=src, evaluate=evaluate, tokens_per_batch=train.batch_size,
               finish=finish)


def evaluate_run(run, data) -> dict[str, Any]:
    """``tokennet eval``: test accuracy on the run's dataset (or another of the same shape)."""
    spec = run.data if data is None else ImageDataset(source=data)
    held = spec.held_out()
    config = run.model.config
    for k, have in _data_fields(held).items():
        if getattr(config, k) != have:
            raise DataError(f"{run.path} was trained with {k}={getattr(config, k)}, but {held.name} has {k}={have}")
    m = evaluate_classifier(run.model, held.x_test, held.y_test, batch_size=run.settings.get("eval_batch_size", 500))
    return {"dataset": held.name, "test_size": len(held.y_test), **m}


register_recipe(Recipe(
    name="cnn",
    description="CNN image classifier (a small ResNet): digits (default), --data fashion-mnist | DIR; the ViT's "
    "baseline",
    model="cnn",
    build=build,
    data=ImageDataset,
    default_data="digits",
    option_help={
        "translate": "largest random shift of a training image in pixels (0 = none)",
        "flip": "mirror half of the training images left-right (right for clothes, wrong for digits)",
        "eval_batch_size": "images per batch when evaluating (memory only; the metrics do not change)",
        "train_size": TRAIN_SIZE_HELP,
    },
    options=dict(_OPTIONS),
    train_defaults=dict(_TRAIN_DEFAULTS),
    evaluate_run=evaluate_run,
    headline=("test_accuracy",),
    data_defaults=data_defaults,
    smoke={"widths": [8, 16], "depths": [1, 1], "batch_size": 32},
))
