"""What a recipe is, how ``--set key=value`` is parsed, and the one ``train()`` every recipe runs through.

A recipe ties a dataset to a model preset and training settings. Its settings are one flat namespace
(model config fields, :class:`~tokennet.train.TrainConfig` fields, and the recipe's own data options),
so ``--set`` needs no prefixes: ``--set dim=256 lr=3e-4 tokenizer=char``.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from ..device import resolve_device
from ..errors import RecipeError
from ..models.registry import config_from_dict, model_from_config, preset_info, save_pretrained
from ..run import (
    LOCK_FILE,
    RUN_FILE,
    RunLock,
    clear_run_dir,
    is_run_dir,
    read_run_info,
    save_tokenizer,
    write_metrics,
    write_run_info,
)
from ..train.distributed import barrier, full_state, init_distributed
from ..train.trainer import TrainConfig, Trainer

__all__ = ["Recipe", "Job", "register_recipe", "get_recipe", "list_recipes", "train", "parse_sets",
           "RUN_FILE", "RecipeError"]

log = logging.getLogger(__name__)


@dataclass
class Job:
    """What a recipe's ``build`` hands to the trainer."""

    model: nn.Module
    source: Any
    evaluate: Callable[[nn.Module], dict[str, float]]
    tokens_per_batch: int
    tokenizer: Any = None
    finish: Callable[[nn.Module], dict[str, Any]] | None = None  # extra metrics/outputs after training


@dataclass
class Recipe:
    """A named training recipe.

    Args:
        name: what ``tokennet train NAME`` looks up.
        description: one line for ``tokennet list``.
        model: the model preset.
        build: ``build(settings, data, device, out_dir) -> Job``.
        options: the recipe's own settings and their defaults (data options, tokenizer, ...).
        model_defaults: config values replacing the preset's.
        train_defaults: TrainConfig values replacing the trainer's defaults.
        evaluate_run: ``evaluate_run(run, data) -> metrics`` for ``tokennet eval`` (``run``: a loaded
            :class:`~tokennet.run.Run`; ``data``: another dataset, or None for the run's own split).
        data_defaults: ``data_defaults(data) -> settings`` that replace the recipe defaults for this
            ``--data`` (a dataset's profile: model size, steps, augmentation). Precedence, lowest
            first: the preset, ``model_defaults``/``train_defaults``/``options``, ``data_defaults(data)``,
            then what the user sets.
    """

    name: str
    description: str
    model: str
    build: Callable[..., Job]
    options: dict[str, Any] = field(default_factory=dict)
    model_defaults: dict[str, Any] = field(default_factory=dict)
    train_defaults: dict[str, Any] = field(default_factory=dict)
    evaluate_run: Callable[..., dict[str, Any]] | None = None
    data_defaults: Callable[[str | None], dict[str, Any]] | None = None

    def field_defaults(self) -> dict[str, Any]:
        """Each model and trainer setting's value when nothing sets it: the config classes' own field defaults.

        A run saved before a setting existed was trained with this value, not with the recipe's current
        default (a recipe may switch a new option on): resuming fills the settings its ``run.json`` lacks
        from here.
        """
        family, preset, _ = preset_info(self.model)
        cfg_cls = type(config_from_dict({"family": family, **preset, **self.model_defaults}))
        out: dict[str, Any] = {}
        for cls in (cfg_cls, TrainConfig):
            for f in dataclasses.fields(cls):
                if f.default is not dataclasses.MISSING:
                    out[f.name] = f.default
                elif f.default_factory is not dataclasses.MISSING:
                    out[f.name] = f.default_factory()
        out.pop("family", None)
        return out

    def defaults(self, data: str | None = None) -> dict[str, Any]:
        """Every setting of this recipe with its default value for ``--data data`` (None: the default data)."""
        family, preset, _ = preset_info(self.model)
        model_cfg = config_from_dict({"family": family, **preset, **self.model_defaults}).to_dict()
        model_cfg.pop("family")
        train_cfg = dataclasses.asdict(TrainConfig(**self.train_defaults))
        out = {**model_cfg, **train_cfg, **self.options}
        if self.data_defaults is not None:
            extra = self.data_defaults(data)
            unknown = sorted(set(extra) - set(out))
            if unknown:
                raise RecipeError(f"recipe {self.name!r}: data defaults name unknown settings {unknown}")
            out.update(extra)
        return out

    def split(self, settings: dict[str, Any]) -> tuple[dict[str, Any], TrainConfig, dict[str, Any]]:
        """``(model overrides, TrainConfig, options)`` from flat settings."""
        family, preset, _ = preset_info(self.model)
        model_keys = {f.name for f in dataclasses.fields(config_from_dict({"family": family, **preset}))
                      if f.init}
        train_keys = {f.name for f in dataclasses.fields(TrainConfig)}
        model = {k: v for k, v in settings.items() if k in model_keys}
        train = TrainConfig(**{k: v for k, v in settings.items() if k in train_keys})
        opts = {k: v for k, v in settings.items() if k in self.options}
        return model, train, opts


_RECIPES: dict[str, Recipe] = {}


def register_recipe(recipe: Recipe) -> Recipe:
    _RECIPES[recipe.name] = recipe
    return recipe


def list_recipes() -> list[Recipe]:
    return [_RECIPES[k] for k in sorted(_RECIPES)]


def get_recipe(name: str) -> Recipe:
    if name not in _RECIPES:
        raise RecipeError(f"unknown recipe {name!r}; available: {', '.join(sorted(_RECIPES))}")
    return _RECIPES[name]


def _coerce(key: str, text: str, default: Any) -> Any:
    low = text.strip().lower()
    if isinstance(default, str):  # a string setting keeps "none" as a value (e.g. position=none)
        return text
    if low in ("none", "null"):
        return None
    try:
        if isinstance(default, bool):
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
    except ValueError:
        kind = "true/false" if isinstance(default, bool) else type(default).__name__
        raise RecipeError(f"setting {key}={text}: expected {kind}") from None
    if default is None:  # optional numbers: int, then float, else the string
        for cast in (int, float):
            try:
                return cast(text)
            except ValueError:
                pass
    return text


def parse_sets(items: list[str], defaults: dict[str, Any]) -> dict[str, Any]:
    """Parse ``key=value`` strings against the recipe's settings (types from the defaults)."""
    out = {}
    for item in items:
        if "=" not in item:
            raise RecipeError(f"settings are key=value, got {item!r}")
        key, value = item.split("=", 1)
        key = key.strip().replace("-", "_")
        if key not in defaults:
            raise RecipeError(f"unknown setting {key!r}; valid: {', '.join(sorted(defaults))}")
        out[key] = _coerce(key, value, defaults[key])
    return out


def _prepare_out_dir(out: Path, recipe: str, resume: bool, overwrite: bool, main: bool = True) -> dict[str, Any] | None:
    """Check the output directory (its writer holds the run lock); return the saved run.json when resuming."""
    if out.exists() and not out.is_dir():
        raise RecipeError(f"output path {out} exists and is not a directory")
    if resume:
        if not is_run_dir(out):
            raise RecipeError(f"cannot resume: {out} is not a tokennet run directory (no {RUN_FILE})")
        saved = read_run_info(out)
        if saved.get("recipe") != recipe:
            raise RecipeError(f"cannot resume: {out} is a run of recipe {saved.get('recipe')!r}, not {recipe!r}")
        return saved
    if out.exists() and any(p.name != LOCK_FILE for p in out.iterdir()):
        if not overwrite:
            raise RecipeError(f"output directory {out} already exists; resume it, overwrite it, "
                              "or choose another output directory")
        if not is_run_dir(out):
            raise RecipeError(f"refusing to overwrite {out}: it is not a tokennet run directory")
        if main:
            clear_run_dir(out)
    return None


def train(
    recipe_name: str,
    *,
    data: str | None = None,
    out: str | Path | None = None,
    sets: dict[str, Any] | None = None,
    device: str = "auto",
    resume: bool = False,
    overwrite: bool = False,
) -> tuple[Path, dict[str, Any]]:
    """Train a recipe into a run directory; return ``(run_dir, metrics)``.

    Setting ``max_iters`` without ``time_budget`` drops the recipe's default time budget, so the run is
    an exact, reproducible iteration budget.

    The run directory holds ``run.json`` (recipe, settings, data), ``config.json`` and
    ``model.safetensors`` (the final model), ``tokenizer.json`` for text, ``metrics.json``,
    ``log.jsonl`` and ``checkpoints/``.
    """
    recipe = get_recipe(recipe_name)
    out = Path(out) if out is not None else Path("runs") / recipe.name
    defaults = recipe.defaults(data)  # a resumed run takes its saved settings over these
    for k in sets or {}:
        if k not in defaults:
            raise RecipeError(f"unknown setting {k!r}; valid: {', '.join(sorted(defaults))}")
    dev = resolve_device(device)
    info, dev = init_distributed(dev)
    if out.exists() and not out.is_dir():
        raise RecipeError(f"output path {out} exists and is not a directory")
    created = not out.exists()
    lock = RunLock(out).acquire() if info.is_main else None  # one writer per run directory, for the whole run
    finished = False
    try:
        result = _train(recipe, out, defaults, data, sets or {}, dev, info, resume, overwrite, created)
        finished = True
        return result
    finally:
        if lock is not None:
            if not is_run_dir(out) or (lock.created and not finished):
                (out / LOCK_FILE).unlink(missing_ok=True)  # a refused or failed start leaves no lock file behind
                if created and not is_run_dir(out):
                    shutil.rmtree(out, ignore_errors=True)
            lock.release()
        if info.enabled:
            import torch.distributed as dist

            dist.destroy_process_group()


def _seed_everything(seed: int) -> None:
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _train(recipe, out, defaults, data, sets, dev, info, resume, overwrite, created):
    saved = _prepare_out_dir(out, recipe.name, resume, overwrite, main=info.is_main)
    barrier(info)
    settings = dict(defaults)
    if saved is not None:
        # Settings the saved run does not name were added later: it ran with their field defaults (e.g.
        # optimizer="adamw"), not with what the recipe defaults to now.
        older = recipe.field_defaults()
        settings.update({k: older[k] for k in set(defaults) - set(saved["settings"]) if k in older})
        settings.update(saved["settings"])
        data = saved.get("data") if data is None else data
    if "max_iters" in sets and "time_budget" not in sets and saved is None:
        settings["time_budget"] = None  # an explicit iteration budget replaces the recipe's default time budget
    settings.update(sets)
    model_over, tcfg, opts = recipe.split(settings)
    barrier(info)
    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    _seed_everything(tcfg.seed)  # the same initial weights on every rank
    try:
        job = recipe.build(settings=settings, model_overrides=model_over, train=tcfg, options=opts, data=data,
                           device=dev, out_dir=out)
    except BaseException:
        if created and info.is_main:  # a run that never started leaves nothing behind
            shutil.rmtree(out, ignore_errors=True)
        raise
    if info.enabled:
        _seed_everything(tcfg.seed + 1000 * info.rank)  # different dropout masks per rank
    defaults_for_report = recipe.defaults(data)
    trainer = Trainer(job.model, tcfg, job.source, evaluate=job.evaluate, out_dir=out, device=dev,
                      tokens_per_batch=job.tokens_per_batch, dist=info,
                      on_checkpoint=_checkpoint_reports(out, defaults_for_report) if tcfg.report else None)
    if resume:
        trainer.resume()  # a damaged checkpoint stops here, before any file of the run is touched
    if info.is_main:
        write_run_info(out, recipe=recipe.name, model=recipe.model, data=data, settings=settings)
        if job.tokenizer is not None:
            save_tokenizer(out, job.tokenizer)
    final = trainer.fit()
    if not info.enabled:
        model = job.model
    else:  # gather the full weights into a plain, unsharded copy on rank 0
        msd, _ = full_state(trainer.model, None)
        if not info.is_main:
            return out, final
        model = model_from_config(job.model.config).to(dev)
        model.load_state_dict(msd)
    save_pretrained(model, out, extra={"recipe": recipe.name})
    metrics = {**final, "wall_seconds": round(time.perf_counter() - t_start, 2),
               "num_parameters": sum(p.numel() for p in model.parameters())}
    if info.enabled:
        metrics["world_size"] = info.world_size
    if job.finish is not None:
        model.eval()  # the final metrics are inference: no dropout, no training-time randomness (sign flips, ...)
        metrics.update(job.finish(model))
    write_metrics(out, metrics)
    if tcfg.report:
        _write_report(out, defaults_for_report, panels=True, device=str(dev))
    return out, metrics


def _checkpoint_reports(out: Path, defaults: dict[str, Any]):
    """The trainer's checkpoint hook: the curves page (no model yet), refreshed at most every 30 s."""
    from ..viz.report import CheckpointReports

    return CheckpointReports(lambda: _write_report(out, defaults, panels=False))


def _write_report(out: Path, defaults: dict[str, Any], **kw) -> None:
    """Refresh ``report.html``; a report that fails never fails the run it reports on."""
    from ..viz.report import write_report

    try:
        write_report(out, defaults=defaults, **kw)
    except Exception as e:  # noqa: BLE001 - the run's files are written; the page is a view of them
        log.warning("could not write %s/report.html: %s", out, e, exc_info=not isinstance(e, (OSError,)))
