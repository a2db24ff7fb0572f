"""The run lifecycle, once for every recipe: lock, resume or overwrite, distributed setup, build, train, save,
metrics, report.

:func:`train` takes a recipe's declaration and owns the run directory from the first check to the last
file: the writer's lock (:class:`~tokennet.run.RunLock`) for the whole run; ``--resume`` (the saved
settings, data spec and tokenizer come back) or ``--overwrite`` (only of a directory whose ``run.json`` reads
as a run; settings, data, ``--init``, the model and the trainer are built and checked before it is touched, and
the new run, written beside it, replaces it only once its ``run.json`` exists: see
:meth:`~tokennet.run.RunLock.swap_in`; a failure before that leaves the old run exactly as it was); the process
group under torchrun (only rank 0 writes); the recipe's ``build``; the trainer; the final model; the
metrics — the trainer's, the recipe's ``finish`` extras, and the recipe's ``evaluate_run`` on the run
*reloaded from disk*, so ``metrics.json`` is what ``tokennet eval`` recomputes; the report page. A start
that fails leaves nothing behind; an interrupted run keeps its last checkpoint.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..device import resolve_device
from ..errors import RecipeError, RunError
from ..fileio import temp_dir_beside
from ..models.registry import model_from_config, parameter_count, save_pretrained
from ..progress import phase
from ..run import (
    LOCK_FILE,
    RUN_FILE,
    RunLock,
    is_run_dir,
    load,
    read_data_spec,
    read_run_info,
    read_tokenizer,
    save_tokenizer,
    write_metrics,
    write_run_info,
)
from ..run_files import ADAPTER_FILE
from ..train.budget import RunClock
from ..train.distributed import barrier, full_state, init_distributed
from ..train.trainer import Trainer
from . import budget as timings
from .recipe import BuildContext, FineTune, Recipe, get_recipe
from .settings import check_applicable, check_known, resolve_settings

__all__ = ["train", "write_report"]

log = logging.getLogger(__name__)


def _prepare_out_dir(out: Path, recipe: str, resume: bool, overwrite: bool) -> tuple[dict[str, Any] | None, bool]:
    """Check the output directory (its writer holds the run lock): ``(the saved run.json when resuming, whether
    --overwrite replaces a run there)``. Nothing is written: an overwritten run is replaced only later, whole."""
    if out.exists() and not out.is_dir():
        raise RecipeError(f"output path {out} exists and is not a directory")
    if resume:
        if not is_run_dir(out):
            raise RecipeError(f"cannot resume: {out} is not a tokennet run directory (no {RUN_FILE})")
        saved = read_run_info(out)
        if saved.get("recipe") != recipe:
            raise RecipeError(f"cannot resume: {out} is a run of recipe {saved.get('recipe')!r}, not {recipe!r}")
        return saved, False
    if out.exists() and any(entry.name != LOCK_FILE for entry in out.iterdir()):
        if not overwrite:
            raise RecipeError(f"output directory {out} already exists; resume it, overwrite it, "
                              "or choose another output directory")
        if not is_run_dir(out):
            raise RecipeError(f"refusing to overwrite {out}: it is not a tokennet run directory (no {RUN_FILE}); "
                              "nothing was changed")
        try:  # --overwrite deletes what it replaces: only a directory whose run.json reads as a run
            read_run_info(out)
        except RunError as err:
            raise RecipeError(f"refusing to overwrite {out}: it does not read as a tokennet run ({err}); "
                              "nothing was changed") from None
        return None, True
    return None, False


def train(
    recipe: str | Recipe,
    *,
    data: str | None = None,
    out: str | Path | None = None,
    sets: dict[str, Any] | None = None,
    device: str = "auto",
    resume: bool = False,
    overwrite: bool = False,
    init: str | Path | None = None,
    on_metrics: Callable[[Path, dict[str, Any], bool], None] | None = None,
    started: float | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Train a recipe into a run directory; return ``(run_dir, metrics)``.

    ``init`` starts from existing weights instead of a fresh model: a tokennet run, or anything ``tokennet
    import`` reads, converted on the fly (:func:`tokennet.interop.init.load_init`); with ``lora_rank`` > 0
    only LoRA adapters train (and, in full, the modules to save: the recipe's new modules, such as a head for
    other classes, and ``lora_modules_to_save``), and the run saves the merged weights (see
    :class:`~tokennet.lifecycle.recipe.FineTune`).

    The run directory holds ``run.json`` (recipe, settings, data and its spec), ``config.json`` and
    ``model.safetensors`` (the final model), ``tokenizer.json`` for text, ``metrics.json``, ``log.jsonl``,
    ``checkpoints/`` and ``report.html``.

    ``on_metrics(run_dir, metrics, report)`` is called once ``metrics.json`` is written, before the report page
    (seconds of drawing; ``report``: whether one follows): the CLI prints its summary and the sample there, so a
    user reads them without waiting for the page.

    ``started``: the ``time.perf_counter()`` reading the run's clock starts from (the CLI passes its command's
    start: a ``time_budget`` counts the whole process, preparation included; default: now).
    """
    clock = RunClock(started=time.perf_counter() if started is None else started)
    recipe = get_recipe(recipe) if isinstance(recipe, str) else recipe
    sets = dict(sets or {})
    out = Path(out) if out is not None else Path("runs") / recipe.name
    defaults = recipe.defaults(data)  # a resumed run takes its saved settings over these
    check_known(recipe, sets, defaults)
    dev = resolve_device(device)
    info, dev = init_distributed(dev)
    if out.exists() and not out.is_dir():
        raise RecipeError(f"output path {out} exists and is not a directory")
    created = not out.exists()
    lock = RunLock(out).acquire() if info.is_main else None  # one writer per run directory, for the whole run
    finished = False
    try:
        result = _run(recipe, out, defaults, data, sets, dev, info, resume, overwrite, created, init, lock,
                      on_metrics, clock=clock)
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


def _check_fine_tuning(recipe: Recipe, init, settings: dict[str, Any], given: set[str]) -> FineTune | None:
    """The run's fine-tuning settings; refuse ``--init`` where the recipe cannot start from weights, LoRA
    settings without ``--init``, and architecture settings that the starting weights decide."""
    if not recipe.init:
        if init is not None:
            raise RecipeError(f"recipe {recipe.name!r} trains from scratch: it cannot start from --init weights")
        return None
    tune = FineTune.from_settings(settings)
    lora = {name for name in ("lora_alpha", "lora_dropout", "lora_targets", "lora_save", "lora_modules_to_save")
            if name in given}
    if tune.lora_rank == 0 and lora:
        raise RecipeError(f"{', '.join(sorted(lora))} does not apply without adapters: set lora_rank")
    if init is None and tune.lora_rank > 0:
        raise RecipeError("LoRA adapts existing weights: give --init (a run, or a checkpoint tokennet imports)")
    if init is not None:
        shape = sorted(given & (recipe.model_fields() - {"block_size", "dropout", "label_smoothing"}))
        if shape:
            raise RecipeError(f"{', '.join(shape)} does not apply with --init: the model comes from {init}")
    return tune


@dataclass
class _Plan:
    """A run as decided before anything is written: what :func:`_resolve` read and checked, and what the later
    stages (:func:`_build`, :func:`_publish`, :func:`_finish`) act on."""

    recipe: Recipe
    out: Path
    info: Any  # the process group (:func:`~tokennet.train.distributed.init_distributed`)
    dev: Any
    data: str | None
    init: Any
    resume: bool
    replacing: bool  # --overwrite replaces a run at out
    created: bool  # out did not exist before this run
    lock: RunLock | None
    saved: dict[str, Any] | None  # run.json when resuming
    ctx: BuildContext
    tune: FineTune | None
    lora: Any  # the LoRA config, or None
    report_defaults: dict[str, Any] | None = None  # the recipe's defaults for this data, as the report shows them
    clock: RunClock = field(default_factory=RunClock)  # the run's seconds and time budget, from the command's start
    timings_key: str = ""  # which earlier runs' measured seconds apply to this one (lifecycle.budget)
    one_time: bool = False  # the recipe's default budget counts from the end of a one-time data preparation


def _run(recipe: Recipe, out: Path, defaults, data, sets, dev, info, resume, overwrite, created, init=None,
         lock: RunLock | None = None, on_metrics=None, *, clock: RunClock | None = None):
    """resolve → build → publish → train → finish."""
    plan = _resolve(recipe, out, defaults, data, sets, dev, info, resume=resume, overwrite=overwrite, created=created,
                    init=init, lock=lock, clock=clock or RunClock())
    job, trainer = _build(plan)
    _publish(plan, job)
    barrier(info)
    final = trainer.fit()
    model = _final_model(plan, job, trainer)
    if model is None:  # a rank other than 0: rank 0 saves
        return out, final
    return out, _finish(plan, job, model, final, on_metrics, trainer)


def _resolve(recipe: Recipe, out: Path, defaults, data, sets, dev, info, *, resume: bool, overwrite: bool,
             created: bool, init, lock: RunLock | None, clock: RunClock) -> _Plan:
    """Check the output directory, settings, data and fine-tuning, and decide everything the build needs; nothing
    is written but an empty ``out`` for a new run."""
    saved, replacing = _prepare_out_dir(out, recipe.name, resume, overwrite)
    barrier(info)
    if saved is not None:
        data = saved.get("data") if data is None else data
        if init is not None and str(init) != saved.get("init"):
            raise RecipeError(f"cannot resume {out} from --init {init}: it was started from "
                              f"{saved.get('init') or 'scratch'} (resume without --init)")
        init = saved.get("init")
    settings = resolve_settings(recipe, defaults, None if saved is None else saved["settings"], sets)
    given = set(sets)
    check_applicable(recipe, settings, given)
    tune = _check_fine_tuning(recipe, init, settings, given)
    model_over, tcfg, opts = recipe.split(settings)
    spec = read_data_spec(saved) if saved is not None else recipe.data_spec(data, settings)
    clock.budget = tcfg.time_budget
    key = timings.timings_key(recipe.name, data, settings)
    one_time = False  # a one-time preparation that the recipe's own budget does not count
    if recipe.preparation is not None and clock.budget is not None and info.is_main:
        prep = recipe.preparation(spec, settings)
        if "time_budget" in given:  # the user's budget holds everything, or the run is refused now
            timings.check_preparation(prep, clock.budget, timings.recorded(key).get("final"), "--time-budget")
        elif prep is not None:
            one_time = True
            log.info("%s first (~%.0f s here, once: cached for later runs); the recipe's time_budget of %.0f s "
                     "counts from its end", prep.what, prep.seconds, clock.budget)
    barrier(info)
    if info.is_main and not replacing:
        out.mkdir(parents=True, exist_ok=True)
    plan = _Plan(recipe=recipe, out=out, info=info, dev=dev, data=data, init=init, resume=resume,
                 replacing=replacing, created=created, lock=lock, saved=saved, tune=tune, lora=None, clock=clock,
                 timings_key=key, one_time=one_time,
                 ctx=BuildContext(recipe=recipe, settings=settings, given=given, model=model_over, train=tcfg,
                                  options=opts, data=spec, source=data, device=dev, out_dir=out,
                                  tokenizer=read_tokenizer(out) if saved is not None else None))
    _seed_everything(tcfg.seed)  # the same initial weights on every rank
    plan.lora = tune.lora() if tune is not None else None  # its settings checked before anything is built
    return plan


def _build(plan: _Plan):
    """The recipe's job (model, data source, evaluation) with adapters where asked, and its trainer (resumed
    from the last checkpoint with --resume); a new run that fails here leaves nothing behind."""
    ctx, tcfg, info = plan.ctx, plan.ctx.train, plan.info
    try:
        if plan.init is not None:
            from ..interop.init import check_resume_vocabulary, load_init

            ctx.init = load_init(plan.init, device=plan.dev)
            if plan.saved is not None:
                check_resume_vocabulary(ctx.init, plan.out)
        with phase("preparing the data and the model") as preparing:  # synthesis, a tokenizer, caching: shown
            job = plan.recipe.build(ctx)
        if plan.one_time:
            plan.clock.budget += preparing.seconds()
        if plan.lora is not None:
            from ..layers.lora import apply_lora

            if job.new_modules:  # a new head trains in full: adapters cannot correct a random projection
                plan.lora = plan.tune.lora(job.new_modules)
                log.info("LoRA: %s new (not in --init), trained in full beside the adapters",
                         ", ".join(job.new_modules))
            apply_lora(job.model, plan.lora)  # the base frozen, adapters of rank r on the targets (seeded above)
    except BaseException:
        if plan.created and info.is_main:  # a run that never started leaves nothing behind
            shutil.rmtree(plan.out, ignore_errors=True)
        raise
    if info.enabled:
        _seed_everything(tcfg.seed + 1000 * info.rank)  # different dropout masks per rank
    plan.report_defaults = plan.recipe.defaults(plan.data)
    trainer = Trainer(job.model, tcfg, job.source, evaluate=job.evaluate, out_dir=plan.out, device=plan.dev,
                      tokens_per_batch=job.tokens_per_batch, dist=info, clock=plan.clock,
                      on_checkpoint=_checkpoint_reports(plan.out, plan.report_defaults) if tcfg.report else None)
    if plan.resume:
        trainer.resume()  # a damaged checkpoint stops here, before any file of the run is touched
    if plan.clock.budget is not None:
        _reserve_final(plan, trainer, job)
    return job, trainer


def _reserve_final(plan: _Plan, trainer: Trainer, job) -> None:
    """Keep the seconds that follow training inside the budget: those measured at the end of the last run like
    this one here, or (the first time) from one evaluation measured now; and, for a job whose ``finish`` repeats
    the run's steps, its seconds per step (what the last runs' ``finish`` took per step, or the job's own
    measurement now). A new run left no time to train by its preparation is refused, one line, nothing written;
    where only the first run's guess of the fixed costs after training
    (:data:`~tokennet.lifecycle.budget.FINAL_FIXED_SECONDS`) leaves none, it trains its one step."""
    clock, info = plan.clock, plan.info
    measured_here = timings.recorded(plan.timings_key)
    final = measured_here.get("final")
    how, guessed = "as the last run like it took here", 0.0
    if final is None:
        started = time.perf_counter()
        trainer.run_eval()
        measured = time.perf_counter() - started
        final, how = timings.first_reserve(measured), f"from one evaluation measured now, {measured:.1f} s"
        guessed = timings.FINAL_FIXED_SECONDS  # not measured: it shortens training, it never refuses a run
    per_step, per_step_how = _finish_per_step(job, measured_here)
    if info.enabled:  # every rank stops training at the same reading
        import torch
        import torch.distributed as dist

        agreed = torch.tensor([final, per_step])
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        final, per_step = float(agreed[0]), float(agreed[1])
    clock.reserve, clock.reserve_per_step = final, per_step
    left = clock.left_for_training(trainer.step)
    log.info("time budget %.0f s: %.0f s spent before training, ~%.0f s kept for the final evaluation (%s)%s, "
             "%.0f s to train", clock.budget, clock.spent(), final, how, per_step_how, max(0.0, left))
    if left + guessed <= 0 and trainer.step == 0:
        if plan.created and info.is_main:
            shutil.rmtree(plan.out, ignore_errors=True)
        raise RecipeError(f"time_budget {clock.budget:g} s leaves no time to train: {clock.spent():.0f} s went to "
                          f"preparing the run and ~{final:.0f} s are needed after training ({how}); give at least "
                          f"~{clock.spent() + final + 10:.0f} s")


def _finish_per_step(job, measured_here: dict[str, float]) -> tuple[float, str]:
    """The seconds a job's ``finish`` adds per step trained, and how they were known, for the log line: what the
    last runs like this one took here, per step, or (the first time) the job's own measurement now; 0 for a job
    whose finish does not repeat the steps."""
    if job.finish_step_seconds is None:
        return 0.0, ""
    per_step = measured_here.get("finish_per_step")
    how = "as the last run like it took here"
    if per_step is None:
        per_step, how = float(job.finish_step_seconds()), "measured now"
    return per_step, f" and ~{per_step * 1000:.1f} ms per step trained for what the run trains after it ({how})"


def _publish(plan: _Plan, job) -> None:
    """Write the run's ``run.json`` and tokenizer (rank 0): from here on the directory is a run.

    Everything up to the first step is checked: now the run is written. An overwritten run is replaced only here,
    by a new directory written beside it whose run.json exists (:meth:`~tokennet.run.RunLock.swap_in` tells the
    crash story); every failure before this has left it exactly as it was."""
    if not plan.info.is_main:
        return
    spec = job.data if job.data is not None else plan.ctx.data
    where, swapped = (temp_dir_beside(plan.out) if plan.replacing else plan.out), False
    try:
        write_run_info(where, recipe=plan.recipe.name, model=plan.recipe.model, data=plan.data,
                       settings=plan.ctx.settings, data_spec=spec, init=None if plan.init is None else str(plan.init))
        if job.tokenizer is not None:
            save_tokenizer(where, job.tokenizer)
        if plan.replacing:
            plan.lock.swap_in(where)  # raises only before the swap, with both directories as they were
            swapped = True
    except BaseException:
        if plan.replacing and not swapped:
            shutil.rmtree(where, ignore_errors=True)
        raise


def _final_model(plan: _Plan, job, trainer):
    """The trained model as one plain module: the job's own, or under torchrun the full weights gathered into an
    unsharded copy on rank 0 (None on the other ranks)."""
    if not plan.info.enabled:
        return job.model
    msd, _ = full_state(trainer.model, None)
    if not plan.info.is_main:
        return None
    model = model_from_config(job.model.config).to(plan.dev)
    if plan.lora is not None:
        from ..layers.lora import apply_lora

        apply_lora(model, plan.lora)
    model.load_state_dict(msd)
    return model


def _finish(plan: _Plan, job, model, final: dict[str, Any], on_metrics=None, trainer: Trainer | None = None
            ) -> dict[str, Any]:
    """Save the final model (adapters merged, or saved apart as asked), then the metrics — the trainer's, the
    recipe's ``finish`` extras and its ``evaluate_run`` on the run reloaded from disk — and the report page."""
    with phase("final evaluation"):
        metrics, finish_seconds = _final_metrics(plan, job, model, final)
    write_metrics(plan.out, metrics)
    if on_metrics is not None:
        on_metrics(plan.out, metrics, plan.ctx.train.report)
    if plan.ctx.train.report:
        with phase("writing the report"):
            write_report(plan.out, plan.report_defaults, panels=True, device=str(plan.dev))
    if trainer is not None and trainer.stopped_at is not None:  # what this machine took, for the next run's budget
        after = plan.clock.spent() - trainer.stopped_at
        if job.finish_step_seconds is None or finish_seconds is None or trainer.step == 0:
            timings.record(plan.timings_key, final=after)
        else:  # the finish's steps apart, per step: the next run may train another number of steps
            per_step = _finish_step_took(job, metrics, finish_seconds, trainer.step)
            timings.record(plan.timings_key, final=after - per_step * trainer.step, finish_per_step=per_step)
    return metrics


def _finish_step_took(job, metrics: dict[str, Any], finish_seconds: float, steps: int) -> float:
    """The seconds per step the job's ``finish`` spent repeating the run's steps: its own measurement, where it
    names one (``finish_step_metric``: what it spends once then counts with the fixed seconds after training),
    else all its seconds over the steps."""
    took = metrics.get(job.finish_step_metric) if job.finish_step_metric else None
    if isinstance(took, (int, float)) and 0 <= took <= finish_seconds / steps:
        return float(took)
    return finish_seconds / steps


def _final_metrics(plan: _Plan, job, model, final: dict[str, Any]) -> tuple[dict[str, Any], float | None]:
    """Save the final model, then measure it: the trainer's metrics, the recipe's ``finish`` extras and its
    ``evaluate_run`` on the run reloaded from disk. Returns the metrics and the seconds ``finish`` took (None:
    the job has none)."""
    out, recipe = plan.out, plan.recipe
    if plan.lora is not None:
        from ..layers.lora import merge_lora, save_adapter

        if plan.tune.lora_save == "adapter":  # the adapters and the modules trained in full, with the base's checksum
            save_adapter(model, out / ADAPTER_FILE, plan.lora)
        merge_lora(model)  # W + (α/r) B A (the modules trained in full as trained): an ordinary model again
    save_pretrained(model, out, extra={"recipe": recipe.name})
    metrics = {**final, "wall_seconds": 0.0, "num_parameters": parameter_count(model)}
    if plan.info.enabled:
        metrics["world_size"] = plan.info.world_size
    finish_seconds = None
    if job.finish is not None:
        model.eval()  # the final metrics are inference: no dropout, no training-time randomness (sign flips, ...)
        started = time.perf_counter()
        metrics.update(job.finish(model))
        finish_seconds = time.perf_counter() - started
    if recipe.evaluate_run is not None:
        # The held-out metrics of the run as saved: what `tokennet eval` recomputes in a fresh process.
        metrics.update(recipe.evaluate_run(load(out, device=plan.dev), None))
    metrics["wall_seconds"] = round(plan.clock.spent(), 2)  # the whole run: every session, preparation included
    return metrics, finish_seconds


def _checkpoint_reports(out: Path, defaults: dict[str, Any]):
    """The trainer's checkpoint hook: the curves page (no model yet), refreshed at most every 30 s."""
    from ..viz.report import CheckpointReports

    return CheckpointReports(lambda: write_report(out, defaults, panels=False))


def write_report(out: Path, defaults: dict[str, Any] | None, **kw) -> Path | None:
    """Refresh ``report.html``; a report that fails never fails the run it reports on (a warning says why)."""
    from ..viz.report import write_report as _write

    try:
        return _write(out, defaults=defaults, **kw)
    except Exception as err:  # noqa: BLE001 - the run's files are written; the page is a view of them
        log.warning("could not write %s/report.html: %s", out, err, exc_info=not isinstance(err, (OSError,)))
        return None
