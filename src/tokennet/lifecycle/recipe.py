"""What a recipe is: a declaration — which data, which model preset, which training settings, which metrics.

A recipe says *what* to train and nothing about *how* a run directory is locked, resumed, saved or
reported (that is :func:`tokennet.lifecycle.train`). Its settings are one flat namespace, so ``--set``
needs no prefixes (``--set dim=256 lr=3e-4 val_fraction=0.2``):

- the model config's fields (the preset's family), typed by the config dataclass;
- :class:`~tokennet.train.TrainConfig`'s fields;
- the data spec's fields (:mod:`tokennet.data.spec`: split fractions, sizes, ...), typed by the spec;
- the recipe's own ``options`` (typed by their defaults).

``build(ctx: BuildContext) -> Job`` turns resolved settings into a model, a batch source and the
functions that evaluate it; ``evaluate_run(run, data)`` computes the metrics of a *saved* run — the same
function at the end of training (on the run reloaded from disk) and in ``tokennet eval``, so
``metrics.json`` is what a fresh process recomputes, by construction.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from ..data.spec import DataSpec
from ..errors import RecipeError, unknown_name
from ..fields import field_docs, field_types
from ..models.registry import config_from_dict, preset_info
from ..train.trainer import TrainConfig

__all__ = ["Recipe", "Job", "BuildContext", "FineTune", "register_recipe", "get_recipe", "list_recipes"]


@dataclass
class FineTune:
    """The settings of fine-tuning, which every recipe that can start from existing weights
    (``tokennet train RECIPE --init SOURCE``, ``Recipe.init``) takes.

    Args:
        lora_rank: 0: train every weight (full fine-tuning); r > 0: freeze them and train LoRA adapters of rank
            r on the ``lora_targets`` layers (:mod:`tokennet.layers.lora`).
        lora_alpha: α, the adapters' update is scaled by α / r.
        lora_dropout: dropout on the adapters' input.
        lora_targets: the layers to adapt: leaf names (``qkv_proj``, ``out_proj``, ``fc1``, ``fc2``, ``gate``) or
            the groups ``attn`` and ``mlp``, comma-separated.
        lora_save: ``merged``: the run holds the merged weights ``W + (α/r) B A`` (every command works on it
            unchanged); ``adapter``: also write the adapters alone (``adapter.safetensors``, with the base's
            SHA-256, refused on another base).
        lora_modules_to_save: modules that train in full beside the adapters and are saved whole with them
            (peft's ``modules_to_save``), comma-separated dotted names (``head``). The modules the recipe
            creates afresh rather than loads from ``--init`` (a classifier's new head, :attr:`Job.new_modules`)
            are always among them: adapters cannot correct a random projection.
    """

    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    lora_targets: str = "attn,mlp"
    lora_save: str = "merged"
    lora_modules_to_save: str = ""

    def __post_init__(self):
        if self.lora_save not in ("merged", "adapter"):
            raise RecipeError(f"lora_save must be 'merged' or 'adapter', got {self.lora_save!r}")
        if self.lora_rank < 0:
            raise RecipeError(f"lora_rank must be >= 0 (0: no adapters), got {self.lora_rank}")

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> FineTune:
        return cls(**{spec_field.name: settings[spec_field.name] for spec_field in dataclasses.fields(cls)
                      if spec_field.name in settings})

    def lora(self, new_modules: tuple[str, ...] | list[str] = ()):
        """The adapters' :class:`~tokennet.layers.lora.LoRAConfig` (None without adapters); ``new_modules`` (the
        modules the build created afresh) train in full beside ``lora_modules_to_save``."""
        from ..layers.lora import LoRAConfig

        if self.lora_rank == 0:
            return None
        given = [t.strip() for t in self.lora_modules_to_save.split(",") if t.strip()]
        return LoRAConfig(self.lora_rank, self.lora_alpha, self.lora_dropout, self.lora_targets,
                          modules_to_save=tuple(dict.fromkeys([*given, *new_modules])))


@dataclass
class Job:
    """What a recipe's ``build`` hands to the lifecycle.

    Args:
        model: the model to train (on the context's device).
        source: the training batch source (``batch(i)``, a pure function of ``i``).
        evaluate: ``evaluate(model) -> metrics`` during training (validation; monitoring only).
        tokens_per_batch: items (tokens, images, ...) per micro-batch, for the throughput figure.
        tokenizer: the text tokenizer to save with the run (text models).
        finish: ``finish(model) -> metrics`` after training, for what only the training process can
            measure (a sample, an ablation that trains other models, the epochs seen); the held-out metrics
            come from the recipe's ``evaluate_run`` on the saved run.
        finish_step_seconds: for a ``finish`` whose work repeats the run's steps (``vqa`` trains its CNN baselines
            on the transformer's batches after it): measures here, before training, the seconds ``finish`` adds per
            step trained. A time budget then keeps them for every step (the first run of a setting on a machine;
            later ones reuse what ``finish`` took, per step, in the last runs).
        finish_step_metric: the metric of ``finish``'s that holds the seconds its repeated steps took per step,
            what it spends once (a worker started, its models built and evaluated) apart; a time budget keeps that
            for the next run's steps and the rest with the fixed seconds after training. None: ``finish``'s
            seconds over the steps trained.
        data: the data spec to save with the run (default: the context's; a recipe whose data fills in
            derived fields, such as class names, returns the filled spec).
        new_modules: dotted names of the modules of ``model`` that ``build`` created afresh instead of loading
            them from ``--init`` (a classifier's head for other classes). With LoRA they train in full and are
            saved with the adapters (:class:`FineTune`), instead of staying frozen at their initialization.
    """

    model: nn.Module
    source: Any
    evaluate: Callable[[nn.Module], dict[str, float]]
    tokens_per_batch: int
    tokenizer: Any = None
    finish: Callable[[nn.Module], dict[str, Any]] | None = None
    finish_step_seconds: Callable[[], float] | None = None
    finish_step_metric: str | None = None
    data: DataSpec | None = None
    new_modules: tuple[str, ...] = ()


@dataclass
class BuildContext:
    """Everything a recipe's ``build`` may read: resolved settings, split by kind, and where to build.

    Attributes:
        recipe: the recipe being built.
        settings: every setting, resolved (recipe defaults < the dataset's profile < the saved run < the user).
        given: the names the user set on this invocation (``--set``, ``--max-iters``, ...).
        model: the settings that are fields of the preset's model config.
        train: the :class:`~tokennet.train.TrainConfig`.
        options: the recipe's own options.
        data: the data spec (None for a recipe without one).
        source: ``--data`` as given (None: the recipe's default).
        device: where the model goes.
        out_dir: the run directory.
        tokenizer: the run's saved tokenizer when resuming (a resumed run keeps its vocabulary), else None.
        init: the starting weights of a fine-tuning run (``--init``: an
            :class:`~tokennet.interop.init.InitSource` with ``model`` and ``tokenizer``), else None.
    """

    recipe: Recipe
    settings: dict[str, Any]
    given: set[str]
    model: dict[str, Any]
    train: TrainConfig
    options: dict[str, Any]
    data: DataSpec | None
    source: str | None
    device: Any
    out_dir: Path
    tokenizer: Any = None
    init: Any = None

    def from_data(self, name: str, value: Any) -> Any:
        """Fill a setting the data decides (``vocab_size`` from the tokenizer, ``num_classes`` from the labels,
        ``image_size`` from the images): a value the user set to something else is a ``RecipeError``."""
        if name in self.given and self.settings.get(name) != value:
            raise RecipeError(f"{name}={self.settings[name]} does not match the data, which has {name}={value!r} "
                              f"(the data sets it; leave {name} unset)")
        self.settings[name] = value
        if name in self.model or name in self.recipe.model_fields():
            self.model[name] = value
        return value


@dataclass
class Recipe:
    """A named training recipe (see the module docstring).

    Args:
        name: what ``tokennet train NAME`` looks up.
        description: one line for ``tokennet list``.
        model: the model preset.
        build: ``build(ctx: BuildContext) -> Job``.
        data: the data spec class; its fields are settings, and the spec is saved with the run.
        default_data: the data source when ``--data`` is not given (None: the spec's default).
        options: the recipe's own settings and their defaults (a tokenizer, a decoding beam, ...).
        model_defaults: config values replacing the preset's.
        train_defaults: TrainConfig values replacing the trainer's defaults.
        evaluate_run: ``evaluate_run(run, data) -> metrics`` of a saved run (``data``: another source, or None
            for the run's own held-out split): ``tokennet eval``, and the end of training.
        data_defaults: ``data_defaults(source) -> settings`` replacing the recipe defaults for that data (a
            dataset's profile: model size, steps, augmentation). Precedence, lowest first: the preset,
            ``model_defaults``/``train_defaults``/``options``/the spec's defaults, ``data_defaults(data)``,
            then what the user sets.
        unused: ``unused(settings) -> names`` of settings that do not apply given the others (``vocab_size``
            with a character tokenizer): setting one of them is an error, not silently ignored.
        smoke: tiny settings with which the recipe trains in seconds (the registry tests use them).
        smoke_data: ``smoke_data(directory) -> --data`` writes a tiny dataset for those tests (None: the
            recipe's default data is small or generated).
        make_data: ``make_data(source, settings) -> DataSpec`` where the kind of data depends on ``--data``
            (``graph``: generated graphs, or QM9); default: ``data.from_settings``.
        variants: named settings that select another architecture or form of the recipe
            (``{"bahdanau": {"arch": "bahdanau"}}``); the registry tests train each one too.
        init: the recipe can start from existing weights (``--init``: ``build`` reads ``ctx.init``), and takes
            the :class:`FineTune` settings.
        derive: ``derive(settings, given) -> settings`` that follow from others unless the user set them
            (``given``: the names set); applied as the settings are resolved, so ``--show-settings`` and
            ``run.json`` show them (``vqa``: ``transformer=generic`` sets the generic model's pieces).
        headline: the metrics a person reads first (``metrics.json`` keys; ``task.key`` inside a run of several
            tasks): the columns of the end-of-training summary, whose full set stays in ``metrics.json``.
        baselines: each baseline the run trains or fits beside the model, as a row of that summary: its name →
            its metrics' keys in the ``headline`` columns' order (None where it has no such metric).
        preparation: ``preparation(spec, settings) -> Preparation | None``: what the run must still compute before
            its first step where that can take long (clips to synthesize), with an estimate measured now; None when
            it is cached. A time budget that cannot hold it is refused before anything is built
            (:mod:`tokennet.lifecycle.budget`).
        option_help: one line describing each of ``options`` (``--show-settings`` prints it; the other settings
            are described in their dataclasses' docstrings, :func:`~tokennet.fields.field_docs`).
        option_groups: the heading ``--show-settings`` lists an option under (default: ``recipe NAME``).
    """

    name: str
    description: str
    model: str
    build: Callable[[BuildContext], Job]
    data: type[DataSpec] | None = None
    default_data: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    model_defaults: dict[str, Any] = field(default_factory=dict)
    train_defaults: dict[str, Any] = field(default_factory=dict)
    evaluate_run: Callable[..., dict[str, Any]] | None = None
    data_defaults: Callable[[str | None], dict[str, Any]] | None = None
    unused: Callable[[dict[str, Any]], set[str]] | None = None
    smoke: dict[str, Any] = field(default_factory=dict)
    smoke_data: Callable[[Path], str] | None = None
    make_data: Callable[[str | None, dict[str, Any]], DataSpec] | None = None
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    init: bool = False
    derive: Callable[[dict[str, Any], set[str]], dict[str, Any]] | None = None
    headline: tuple[str, ...] = ()
    baselines: dict[str, tuple[str | None, ...]] = field(default_factory=dict)
    preparation: Callable[[Any, dict[str, Any]], Any] | None = None
    option_help: dict[str, str] = field(default_factory=dict)
    option_groups: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        for name, keys in self.baselines.items():
            if len(keys) != len(self.headline):
                raise ValueError(f"recipe {self.name!r}: baseline {name!r} names {len(keys)} metrics for the "
                                 f"{len(self.headline)} headline columns")
        if self.data is not None:
            clash = sorted(set(self.options) & self.data.setting_names())
            if clash:
                raise ValueError(f"recipe {self.name!r}: options {clash} are already fields of {self.data.__name__}")

    # -- the settings ----------------------------------------------------------------------------------
    def _config_class(self):
        family, preset, _ = preset_info(self.model)
        return type(config_from_dict({"family": family, **preset, **self.model_defaults}))

    def model_fields(self) -> set[str]:
        return {spec_field.name for spec_field in dataclasses.fields(self._config_class())
                if spec_field.init and spec_field.name != "family"}

    def setting_types(self) -> dict[str, Any]:
        """``name → type`` of every setting: annotations of the model config, TrainConfig and data spec; the
        recipe options' default types."""
        types: dict[str, Any] = {}
        types.update(field_types(self._config_class()))
        types.update(field_types(TrainConfig))
        if self.data is not None:
            types.update({k: v for k, v in field_types(self.data).items() if k in self.data.setting_names()})
        if self.init:
            types.update(field_types(FineTune))
        types.update({k: type(v) for k, v in self.options.items() if v is not None})
        types.pop("family", None)
        return types

    def setting_docs(self) -> dict[str, tuple[str, str]]:
        """``name → (group, one-line description)`` of every setting, from where each is declared: the model
        config's, TrainConfig's, the data spec's and :class:`FineTune`'s docstrings, and ``option_help``. A setting
        nobody describes has ``""`` (``tests/lifecycle/test_setting_docs.py`` fails on one)."""
        config = self._config_class()
        sources = [(f"model ({config.__name__})", field_docs(config)), ("training", field_docs(TrainConfig))]
        if self.data is not None:
            sources.append((f"data ({self.data.__name__})", field_docs(self.data)))
        if self.init:
            sources.append(("fine-tuning (--init)", field_docs(FineTune)))
        out = {}
        for name in self.defaults():
            if name in self.options:
                out[name] = (self.option_groups.get(name, f"recipe {self.name}"), self.option_help.get(name, ""))
                continue
            group, text = next(((group, docs[name]) for group, docs in sources if name in docs), ("other", ""))
            out[name] = (group, text)
        return out

    def field_defaults(self) -> dict[str, Any]:
        """Each model and trainer setting's value when nothing sets it: the config classes' own field defaults.

        A run saved before a setting existed was trained with this value, not with the recipe's current
        default (a recipe may switch a new option on): resuming fills the settings its ``run.json`` lacks
        from here.
        """
        out: dict[str, Any] = {}
        for cls in (self._config_class(), TrainConfig):
            for spec_field in dataclasses.fields(cls):
                if spec_field.default is not dataclasses.MISSING:
                    out[spec_field.name] = spec_field.default
                elif spec_field.default_factory is not dataclasses.MISSING:
                    out[spec_field.name] = spec_field.default_factory()
        out.pop("family", None)
        return out

    def defaults(self, data: str | None = None) -> dict[str, Any]:
        """Every setting of this recipe with its default value for ``--data data`` (None: the default data)."""
        family, preset, _ = preset_info(self.model)
        model_cfg = config_from_dict({"family": family, **preset, **self.model_defaults}).to_dict()
        model_cfg.pop("family")
        train_cfg = dataclasses.asdict(TrainConfig(**self.train_defaults))
        spec: dict[str, Any] = {}
        if self.data is not None:
            spec_values = self.data().to_dict()
            spec = {k: spec_values[k] for k in self.data.setting_names() if k not in model_cfg and k not in train_cfg}
        tune = dataclasses.asdict(FineTune()) if self.init else {}
        out = {**model_cfg, **train_cfg, **spec, **tune, **self.options}
        if self.data_defaults is not None:
            extra = self.data_defaults(data)
            unknown = sorted(set(extra) - set(out))
            if unknown:
                raise RecipeError(f"recipe {self.name!r}: data defaults name unknown settings {unknown}")
            out.update(extra)
        return out

    def split(self, settings: dict[str, Any]) -> tuple[dict[str, Any], TrainConfig, dict[str, Any]]:
        """``(model overrides, TrainConfig, options)`` from flat settings."""
        model_keys = self.model_fields()
        train_keys = {spec_field.name for spec_field in dataclasses.fields(TrainConfig)}
        model = {k: v for k, v in settings.items() if k in model_keys}
        train = TrainConfig(**{k: v for k, v in settings.items() if k in train_keys})
        opts = {k: v for k, v in settings.items() if k in self.options}
        return model, train, opts

    def data_spec(self, data: str | None, settings: dict[str, Any]) -> DataSpec | None:
        """The run's data spec: ``--data`` (or the recipe's default source) and the spec's fields in ``settings``."""
        source = data if data is not None else self.default_data
        if self.make_data is not None:
            return self.make_data(source, settings)
        if self.data is None:
            return None
        return self.data.from_settings(source, settings)


_RECIPES: dict[str, Recipe] = {}


def register_recipe(recipe: Recipe) -> Recipe:
    """Register a recipe under its name (the last registration of a name wins); returns it."""
    _RECIPES[recipe.name] = recipe
    return recipe


def list_recipes() -> list[Recipe]:
    from ..plugins import discover

    discover()
    return [_RECIPES[k] for k in sorted(_RECIPES)]


def get_recipe(name: str) -> Recipe:
    from ..plugins import discover

    if name not in _RECIPES:
        discover()
    if name not in _RECIPES:
        raise RecipeError(unknown_name("recipe", name, _RECIPES))
    return _RECIPES[name]
