"""Recipe ``vit``: a vision transformer classifier on real data; ``metrics.json`` holds ``test_accuracy``.

``--data`` picks the dataset, and the dataset picks its profile (model preset, training settings,
augmentation), tuned for 2 CPU cores:

- ``digits`` (default): scikit-learn's 8×8 digits, split as in scikit-learn's example (first half
  trains). The run also fits the classical baseline on the same split, an RBF SVM
  (``SVC(gamma=0.001)``, scikit-learn's example), and reports it as ``baseline_svm_accuracy``.
  Goal: at least the SVM's accuracy within 60 s. On any 2-D data, ``--set cnn_baseline=true`` also trains
  the ``cnn`` recipe's CNN for the ViT's steps, batch size, learning rate and augmentation, and reports
  ``baseline_cnn_accuracy`` (with ``baseline_cnn_parameters`` and what was trained, ``baseline_cnn``).
- ``fashion-mnist`` (or a directory with its idx files): 28×28 clothes, 60k/10k. Goal: ≥ 92% within
  10 minutes (the dataset's best classical baseline is 89.7%; later goal: past ResNet-18's 94.9%). The profile
  tokenizes with early convolutions (ViT_C, ``patch_embed=conv-stem``: 4×4 = 16 tokens), one block, label
  smoothing 0.1, a 540-s budget: ten CPU minutes are few epochs, so they go to epochs rather than depth.
  ``--set patch_embed=linear patch_size=7`` trains the plain ViT instead; ``--set num_layers=4`` a deeper one.
- ``mnist1d``: 1-D signals of length 40, 4k/1k, cut into overlapping 1-D patches of 8 at stride 2
  (17 tokens), 4 blocks × 64, 3,000 steps. Goal: ≥ 98% (the MNIST-1D paper's CNN 94%, human 96%).
  The generator's own changes can be drawn again for each training batch
  (:class:`~tokennet.data.signal_augment.SignalAugment`): ``roll`` (circular shift), ``scale`` (a resampling
  stretch), ``gain``, ``noise``, ``corr_noise`` (smoothed noise) and ``shear`` (a linear trend), beside
  ``translate`` (a shift with zero fill); ``patch_size``/``patch_stride`` set the patches. These are refused on
  2-D images.

How the profiles were chosen (depth, stems, patch sizes and strides, Swin and DeiT against the ViT, the ViT against a
CNN as data grows): ``docs/experiments/vit.md``.

The rest of the lecture's vision family is one setting away:

- ``--set arch=swin`` trains :class:`~tokennet.models.swin.Swin` (shifted windows, relative position bias,
  patch merging) from the shared settings (``dim`` = the first stage's width, ``num_heads`` its heads,
  ``patch_size``, ``patch_embed``, ``mlp_ratio``, ``dropout``, ``drop_path``, ``label_smoothing``, ...) and its
  own ``depths`` (blocks per stage, ``2,2,6,2``) and ``window_size``; ViT's own settings (``num_layers``,
  ``pool``, ``position``, ``patch_stride``, ...) are refused with it. The dataset's profile is ViT's, so
  give Swin its patch size: e.g. ``--set arch=swin patch_size=2 patch_embed=conv dim=32 num_heads=2
  depths=2,2,2`` on Fashion-MNIST (14 × 14 tokens, 7 × 7 windows).
- ``--set teacher=RUN_DIR`` trains DeiT: a distillation token beside the class token (``distill``), whose
  head learns the hard labels of any image classifier run on the same data (a CNN, a Swin, a longer ViT)
  while the class head learns the true labels; the test logits average the two heads. The teacher labels
  each training batch as the student sees it (augmented, mixed), and is fixed, so batches stay a pure
  function of their index (exact resume). A run that is no classifier, has other classes, or takes images
  of another size or channel count is refused in one line.
- ``--init RUN`` fine-tunes an image classifier run (a new head where the classes differ); a ``multimodal`` run gives
  its shared trunk instead: the data's ViT (its profile's patches, positions and head, all new) around the trunk's
  blocks, with the trunk's width, depth and heads (:func:`~tokennet.interop.init.from_trunk`).
- DeiT's augmentation: ``randaugment`` (operations per image, with ``magnitude`` 0–10), ``cutmix`` and
  ``mixup`` (Beta α; both: one per batch), ``erase``, ``repeats`` (repeated augmentation), ``drop_path``
  (stochastic depth); at test time, ``test_flips`` averages each image's class probabilities with its mirror's
  (2-D images; ``tokennet eval`` of the run does the same).
- ``train_size=N`` trains on the first N training images of one fixed shuffle
  (:func:`~tokennet.data.vision_data.training_subset`; the ``cnn`` recipe has it too, so a teacher and its student
  can learn from the same images); ``bench/deit.py --sizes`` measures DeiT as data shrinks.

The profile replaces the recipe's defaults through the recipe's ``data_defaults`` hook
(``tokennet train vit --data fashion-mnist --show-settings`` lists them); anything given with
``--set``/``--max-iters``/``--time-budget`` wins over it. ``image_size``, ``in_channels`` and
``num_classes`` come from the data; setting one to another value is an error. The test set is evaluated during
training for monitoring only: the trainer selects no checkpoint on it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from ..data.augment import Augment
from ..data.image_batches import ImageBatches, evaluate_classifier
from ..data.signal_augment import SignalAugment
from ..data.text import DataError
from ..data.vision_data import TRAIN_SIZE_HELP, ImageDataset, VisionData, dataset_kind, training_subset
from ..errors import ConfigError, RecipeError, RunError
from ..lifecycle import BuildContext, Job, Recipe, register_recipe
from ..models.multimodal import TRUNK_FIELDS
from ..models.registry import config_from_dict, create_model, model_from_config, preset_info
from ..models.swin import SwinConfig

__all__ = ["PROFILES", "ARCHS", "svm_baseline", "load_teacher"]

log = logging.getLogger(__name__)

DATA_FIELDS = ("image_size", "in_channels", "num_classes")

# Per dataset: the model preset whose fields replace the recipe defaults, then training settings and
# augmentation. max_iters is what an idle 2-core machine does within the goal's time; time_budget caps
# the training time on slower machines (the cosine schedule then follows the clock).
PROFILES: dict[str, dict[str, Any]] = {
    "digits": {
        "model": "vit-digits",
        "settings": {},  # the recipe defaults below are the digits profile
    },
    "fashion-mnist": {
        "model": "vit-fashion",
        "settings": {"max_iters": 20000, "time_budget": 540.0, "batch_size": 128, "lr": 2e-3, "warmup_iters": 300,
                     "weight_decay": 0.05, "eval_interval": 2000, "translate": 1, "flip": True, "erase": 0.0},
    },
    "mnist1d": {
        "model": "vit-1d",
        "settings": {"max_iters": 3000, "time_budget": 300.0, "batch_size": 64, "lr": 2e-3, "warmup_iters": 200,
                     "weight_decay": 0.05, "eval_interval": 1000, "translate": 4, "flip": False, "erase": 0.0},
    },
}

ARCHS = ("vit", "swin")
# The settings only one architecture reads: the other refuses them (Recipe.unused).
SWIN_ONLY = ("depths", "window_size")
VIT_ONLY = ("patch_stride", "num_layers", "pool", "position", "position_mode", "pos_dim", "patch_dropout", "distill",
            "teacher", "value_proj", "patch_projection")
# The MNIST-1D generator's augmentations (data/signal_augment.py): 1-D signals only, refused on images.
SIGNAL_ONLY = ("roll", "gain", "noise", "corr_noise", "shear")
SHARED = ("image_size", "patch_size", "in_channels", "num_classes", "dim", "num_heads", "mlp_ratio", "dropout",
          "drop_path", "patch_embed", "stem_width", "pad", "label_smoothing", "bias", "norm_eps", "backend")

_OPTIONS = {"arch": "vit", "depths": "2,2", "window_size": 7, "teacher": "",
            "translate": 1, "flip": False, "erase": 0.0, "rotate": 0.0, "scale": 0.0, "randaugment": 0,
            "magnitude": 9.0, "roll": 0, "gain": 0.0, "noise": 0.0, "corr_noise": 0.0, "shear": 0.0,
            "mixup": 0.0, "cutmix": 0.0, "repeats": 1, "svm_baseline": True, "cnn_baseline": False,
            "eval_batch_size": 500, "train_size": 0, "test_flips": False}
_TRAIN_DEFAULTS = {"max_iters": 2500, "time_budget": 45.0, "batch_size": 64, "lr": 2e-3, "warmup_iters": 100,
                   "weight_decay": 0.05, "beta2": 0.99, "eval_interval": 500, "log_interval": 50}


def data_defaults(data: str | None) -> dict[str, Any]:
    """The dataset's profile (:data:`PROFILES`): its model preset's fields (the preset fixes the data's
    nominal ``image_size``, ``in_channels`` and ``num_classes``) and its training settings.

    These replace the recipe defaults for ``--data data`` (``--show-settings --data ...`` lists them);
    whatever the user sets wins over them.
    """
    kind = dataset_kind(data)
    prof = PROFILES[kind]
    family, preset, _ = preset_info(prof["model"])
    model_cfg = config_from_dict({"family": family, **preset}).to_dict()  # every field, not just the preset's
    model_cfg.pop("family")
    return {**model_cfg, **prof["settings"]}


def svm_baseline(data: VisionData, gamma: float | str = 0.001) -> dict[str, Any]:
    """The classical baseline on the same split: an RBF SVM on raw pixels (scikit-learn's digits example)."""
    from sklearn.svm import SVC

    x = data.x_train.flatten(1).numpy() * 16.0  # the example's pixel scale 0..16 (gamma=0.001 is tuned to it)
    x_test = data.x_test.flatten(1).numpy() * 16.0
    clf = SVC(kernel="rbf", gamma=gamma).fit(x, data.y_train.numpy())
    return {"baseline_svm_accuracy": float(clf.score(x_test, data.y_test.numpy())),
            "baseline_svm": f"sklearn.svm.SVC(kernel='rbf', gamma={gamma!r}, C=1.0) on raw pixels 0..16"}


def _init_model(ctx: BuildContext, ds: VisionData):
    """An image classifier from ``--init`` for this data: its image size and channels must be the data's; a new
    head when the number of classes differs (:func:`~tokennet.interop.init.with_num_classes`). A multimodal run
    gives its shared trunk instead: a new ViT of the data's profile around the trunk's blocks
    (:func:`~tokennet.interop.init.from_trunk`). Returns ``(model, the new modules)``: with LoRA those train in
    full (``Job.new_modules``)."""
    from ..interop.init import from_trunk, modules_of, with_num_classes

    init = ctx.init
    config = init.model.config
    if config.family == "multimodal":
        if ctx.options["arch"] != "vit":
            raise RecipeError(f"a multimodal run's trunk starts a ViT, not a {ctx.options['arch']}: leave arch unset")
        for k in DATA_FIELDS:
            ctx.from_data(k, getattr(ds, k))
        model, fresh_modules = from_trunk(init.model, config_from_dict({"family": "vit", **ctx.model}))
        for k in TRUNK_FIELDS:  # run.json says the shape the model has: the trunk's
            ctx.settings[k] = ctx.model[k] = getattr(model.config, k)
        log.info("a new ViT for %s around the shared trunk of %s (%d × %d); new: %s", ds.name, init.path,
                 model.config.num_layers, model.config.dim, ", ".join(fresh_modules))
        return model, fresh_modules
    if not hasattr(config, "num_classes") or not hasattr(config, "image_size"):
        raise DataError(f"{init.path} is not an image classifier (a {config.family} model): vit fine-tunes one")
    for k in ("image_size", "in_channels"):
        if getattr(config, k) != getattr(ds, k):
            raise DataError(f"{init.path} takes {k}={getattr(config, k)}, but {ds.name} has {k}={getattr(ds, k)}")
    model, fresh = with_num_classes(init.model, ds.num_classes)
    if fresh:
        log.info("a new classification head for %d classes (%s)", ds.num_classes, ", ".join(fresh))
    return model, modules_of(fresh)


def _depths(text: str) -> list[int]:
    try:
        depths = [int(piece) for piece in str(text).replace(" ", "").split(",") if piece]
    except ValueError:
        depths = []
    if not depths or min(depths) < 1:
        raise RecipeError(f"depths={text}: expected Swin's blocks per stage as comma-separated positive integers, "
                          "e.g. depths=2,2,6,2")
    return depths


def _model(ctx: BuildContext):
    """The ViT of the settings, or (``arch=swin``) the Swin built from the shared settings and its own."""
    arch = ctx.options["arch"]
    if arch not in ARCHS:
        raise RecipeError(f"arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    if arch == "vit":
        return create_model("vit", **ctx.model)
    cfg = SwinConfig(**{k: ctx.model[k] for k in SHARED if k in ctx.model}, depths=_depths(ctx.options["depths"]),
                     window_size=int(ctx.options["window_size"]))
    return model_from_config(cfg)


def load_teacher(path: str, ds: VisionData, device) -> tuple[Callable[[torch.Tensor], torch.Tensor], dict[str, Any]]:
    """DeiT's teacher: a trained image classifier run, as ``teacher(images) → class ids`` (eval mode, frozen),
    and what the metrics say about it (its path and test accuracy).

    Raises:
        RecipeError: one line, when ``path`` is not a run, not a classifier, or classifies other classes or
            images of another size or channel count than ``ds``.
    """
    from ..run import load

    try:
        run = load(path, device=device)
    except RunError as err:  # "PATH is not a run directory ...": say it of teacher=PATH
        msg = str(err)
        raise RecipeError(f"teacher={path}{msg[len(str(path)):]}" if msg.startswith(str(path))
                          else f"teacher={path}: {msg}") from None
    if "classify" not in run.task.verbs:
        raise RecipeError(f"teacher={path} is {run.task.a_name} run, not an image classifier")
    model, config = run.model.eval(), run.model.config
    k = getattr(config, "num_classes", None)
    if k is not None and k != ds.num_classes:
        raise RecipeError(f"teacher={path} classifies {k} classes, but {ds.name} has {ds.num_classes}")
    for name in ("in_channels", "image_size"):
        have = getattr(config, name, None)
        if have is not None and have != getattr(ds, name):
            raise RecipeError(f"teacher={path} takes images with {name}={have}, but {ds.name} has "
                              f"{name}={getattr(ds, name)}")
    try:  # whatever its config says, it must classify this data's images into its classes
        with torch.no_grad():
            out = model(ds.x_train[:2].to(device)).logits
    except (ValueError, RuntimeError) as err:
        raise RecipeError(f"teacher={path} cannot classify {ds.name}'s images: {str(err).splitlines()[0]}") from None
    if tuple(out.shape) != (2, ds.num_classes):
        raise RecipeError(f"teacher={path} gives logits of shape {tuple(out.shape[1:])} per image; {ds.name} has "
                          f"{ds.num_classes} classes")
    for param in model.parameters():
        param.requires_grad_(False)

    def teacher(x: torch.Tensor) -> torch.Tensor:
        return model(x.to(device)).logits.argmax(-1).to(x.device)  # (B,) the teacher's hard labels

    info = {"teacher": str(path)}
    if "test_accuracy" in run.metrics:
        info["teacher_test_accuracy"] = run.metrics["test_accuracy"]
    return teacher, info


def _augment(opts: dict[str, Any], dataset: VisionData) -> Callable[[torch.Tensor, torch.Generator],
                                                                     torch.Tensor] | None:
    """The training batches' augmentation from the options, or None when every one is off: images get
    :class:`~tokennet.data.augment.Augment`; 1-D signals its shift and flip, then the MNIST-1D generator's changes
    (:class:`~tokennet.data.signal_augment.SignalAugment`: ``roll``, ``scale`` as a stretch, ``gain``, ``noise``,
    ``corr_noise``, ``shear``). The test set is never augmented.

    Raises:
        ConfigError: a negative setting, or a shift as long as the data or longer.
        RecipeError: a signal-only setting on 2-D images.
    """
    image = Augment(translate=int(opts["translate"]), flip=bool(opts["flip"]), erase=float(opts["erase"]),
                    rotate=float(opts["rotate"]), scale=float(opts["scale"]), randaugment=int(opts["randaugment"]),
                    magnitude=float(opts["magnitude"]))
    shortest = min(dataset.x_train.shape[2:])
    if image.translate >= shortest:
        raise ConfigError(f"translate={image.translate} shifts by the whole {shortest}-sample side or more: "
                          f"translate must be below {shortest}")
    signal_only = {k: opts[k] for k in SIGNAL_ONLY if opts[k]}
    if dataset.x_train.dim() == 4:
        if signal_only:
            raise RecipeError(f"{', '.join(signal_only)}: only for 1-D signals; this data is 2-D images")
        return image if image.active else None
    signal = SignalAugment(roll=int(opts["roll"]), scale=float(opts["scale"]), gain=float(opts["gain"]),
                           noise=float(opts["noise"]), corr_noise=float(opts["corr_noise"]),
                           shear=float(opts["shear"]))
    signal.check_length(shortest)
    if not signal.active:
        return image if image.active else None

    def augment(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return signal(image(x, generator), generator)

    return augment


def build(ctx: BuildContext) -> Job:
    spec: ImageDataset = ctx.data
    kind = dataset_kind(spec.source)
    opts, train, device = ctx.options, ctx.train, ctx.device
    dataset = training_subset(spec.load(), int(opts["train_size"]))
    teacher, teacher_info = None, {}
    if opts["teacher"]:
        if opts["arch"] != "vit":
            raise RecipeError("teacher= trains DeiT's distillation token, which is ViT's: set arch=vit")
        if "distill" in ctx.given and not ctx.settings["distill"]:
            raise RecipeError("teacher= trains the distillation token: leave distill unset (or true)")
        teacher, teacher_info = load_teacher(opts["teacher"], dataset, device)
        ctx.settings["distill"] = ctx.model["distill"] = True  # the teacher's labels are read by the distillation token
    torch.manual_seed(train.seed)
    new_modules: tuple[str, ...] = ()
    if ctx.init is not None:  # fine-tuning: the source's model, with a new head where the classes differ
        if teacher is not None and not getattr(ctx.init.model.config, "distill", False):
            raise RecipeError(f"teacher= trains DeiT's distillation token, which {ctx.init.path} does not have: "
                              "fine-tune without teacher=, or train from scratch with it")
        model, new_modules = _init_model(ctx, dataset)
    else:
        for k in DATA_FIELDS:  # e.g. a directory of idx files with another image size
            ctx.from_data(k, getattr(dataset, k))
        model = _model(ctx)
    if model.config.is_1d and opts["randaugment"]:
        raise RecipeError("randaugment applies to 2-D images; this data is 1-D signals")
    if model.config.is_1d and opts["cnn_baseline"]:
        raise RecipeError("cnn_baseline trains a 2-D CNN (the cnn recipe's); this data is 1-D signals")
    if model.config.is_1d and opts["test_flips"]:
        raise RecipeError("test_flips mirrors 2-D images left to right; this data is 1-D signals, whose mirror is "
                          "another signal")
    aug = _augment(opts, dataset)
    src = ImageBatches(dataset.x_train, dataset.y_train, train.batch_size, seed=train.seed,
                       augment=aug, mixup=float(opts["mixup"]), cutmix=float(opts["cutmix"]),
                       num_classes=dataset.num_classes,
                       repeats=int(opts["repeats"]), teacher=teacher)
    config = model.config
    log.info("%s: %d train / %d test, input %s; %s %.3fM parameters, %d tokens, %d steps per epoch", dataset.name,
             len(dataset.y_train), len(dataset.y_test), tuple(dataset.x_train.shape[1:]), opts["arch"],
             model.num_parameters() / 1e6, config.grid[0] * config.grid[1] + config.num_prefix, src.steps_per_epoch)

    def evaluate(m) -> dict[str, float]:
        return evaluate_classifier(m, dataset.x_test, dataset.y_test, batch_size=opts["eval_batch_size"],
                                   flips=bool(opts["test_flips"]))

    def finish(m) -> dict[str, Any]:  # noqa: ARG001
        out: dict[str, Any] = {"dataset": dataset.name, "arch": opts["arch"], "train_size": len(dataset.y_train),
                               "test_size": len(dataset.y_test),
                               "epochs": round((src.max_index + 1) / src.steps_per_epoch, 2), **teacher_info}
        if kind == "digits" and opts["svm_baseline"]:
            out.update(svm_baseline(dataset))
        if opts["cnn_baseline"]:  # the CNN of the dataset's cnn profile, the same steps, batch, rate and augmentation
            from .cnn import PROFILES as CNN_PROFILES
            from .cnn import cnn_baseline

            out.update(cnn_baseline(dataset, steps=src.max_index + 1, preset=CNN_PROFILES[kind]["model"],
                                    batch_size=train.batch_size, lr=train.lr, seed=train.seed,
                                    augment=aug, device=device))
        return out

    return Job(model=model.to(device), source=src, evaluate=evaluate, tokens_per_batch=train.batch_size,
               finish=finish, new_modules=new_modules)


def evaluate_run(run, data) -> dict[str, Any]:
    """``tokennet eval``: test accuracy of a trained run on its dataset's test split (or on another dataset)."""
    spec = run.data if data is None else ImageDataset(source=data)
    held = spec.held_out()
    config = run.model.config
    for k in DATA_FIELDS:
        have = getattr(held, k)
        if getattr(config, k) != have:
            raise DataError(f"{run.path} was trained with {k}={getattr(config, k)}, but {held.name} "
                            f"({spec.source}) has {k}={have}; evaluate it on data like its own")
    m = evaluate_classifier(run.model, held.x_test, held.y_test, batch_size=run.settings.get("eval_batch_size", 500),
                            flips=bool(run.settings.get("test_flips", False)))
    return {"dataset": held.name, "test_size": len(held.y_test), **m}


def unused(settings: dict[str, Any]) -> set[str]:
    """Swin reads the shared settings and its own (``depths``, ``window_size``); ViT does not read Swin's."""
    return set(VIT_ONLY) if settings.get("arch") == "swin" else set(SWIN_ONLY)


RECIPE = register_recipe(Recipe(
    name="vit",
    description="ViT classifier: digits (default; vs an RBF SVM), --data fashion-mnist | DIR, --data mnist1d",
    model="vit-digits",
    build=build,
    data=ImageDataset,
    default_data="digits",
    option_help={
        "arch": "vit, or swin (shifted windows, from the shared settings and depths, window_size)",
        "depths": "swin only: blocks per stage, comma-separated (e.g. 2,2,6,2)",
        "window_size": "swin only: attention windows of window_size x window_size tokens",
        "teacher": "a classifier run whose hard labels a distillation token learns (DeiT; empty = none)",
        "translate": "largest random shift of a training image in pixels (0 = none)",
        "flip": "mirror half of the training images left-right (right for clothes, wrong for digits)",
        "erase": "probability of erasing a random rectangle of a training image (0 = never)",
        "rotate": "largest random rotation of a training image in degrees",
        "scale": "largest random zoom of a training image, e.g. 0.1 for 0.9..1.1 (a 1-D signal: a resampling "
                 "stretch about its centre)",
        "roll": "1-D signals: largest random circular shift of a training signal in samples (below its length; "
                "0 = none; translate shifts with zero fill)",
        "gain": "1-D signals: largest random change of a training signal's amplitude, e.g. 0.2 for 0.8..1.2",
        "noise": "1-D signals: standard deviation of iid Gaussian noise added to training signals (0 = none)",
        "corr_noise": "1-D signals: standard deviation of smoothed (correlated) Gaussian noise added to training "
                      "signals (0 = none)",
        "shear": "1-D signals: largest rise of a random linear trend added across a training signal (0 = none)",
        "randaugment": "RandAugment's operations per training image (0 = off)",
        "magnitude": "RandAugment's magnitude on the 0-10 scale",
        "mixup": "mixup's Beta(α, α) parameter (0 = off; with cutmix, one of the two per batch)",
        "cutmix": "cutmix's Beta(α, α) parameter (0 = off; with mixup, one of the two per batch)",
        "repeats": "repeated augmentation: each image appears this many times per batch, augmented apart (1 = off)",
        "svm_baseline": "also fit an RBF SVM on the same split and report baseline_svm_accuracy",
        "cnn_baseline": "also train the cnn recipe's CNN for the same steps and report baseline_cnn_accuracy (2-D "
                        "data)",
        "eval_batch_size": "images per batch when evaluating (memory only; the metrics do not change)",
        "test_flips": "test-time augmentation: each test image's class probabilities averaged with its left-right "
        "mirror's (2-D images; for a model trained with flip=true); tokennet eval of the run does the same",
        "train_size": TRAIN_SIZE_HELP,
    },
    options=dict(_OPTIONS),
    model_defaults={},
    train_defaults=dict(_TRAIN_DEFAULTS),
    evaluate_run=evaluate_run,
    headline=("test_accuracy",),
    baselines={"RBF SVM": ("baseline_svm_accuracy",), "CNN": ("baseline_cnn_accuracy",)},
    data_defaults=data_defaults,
    init=True,
    unused=unused,
    variants={"swin": {"arch": "swin"}},
    smoke={"dim": 32, "num_layers": 1, "num_heads": 2, "batch_size": 32, "svm_baseline": False},
))
