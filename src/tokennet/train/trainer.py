"""The trainer every recipe shares: one loop, one log format, one checkpoint format.

Data comes from a *batch source*: any object with ``batch(i) -> (inputs, targets)`` that is a pure
function of the micro-batch index ``i`` (and its own seed). That makes the data position a single
integer, so a resumed run draws exactly the batches the uninterrupted run would have drawn.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from ..errors import ConfigError, RunError, TrainingStopped, one_line
from ..layers.stack import set_checkpointing
from ..progress import phase
from ..run_files import CHECKPOINT_DIR, LOG_FILE
from ..state import check_state_dict
from .budget import RunClock
from .checkpoint import capture_rng, latest_checkpoint, read_checkpoint, restore_rng, save_checkpoint
from .distributed import (
    STRATEGIES,
    DistInfo,
    all_reduce_mean,
    barrier,
    full_state,
    gather_objects,
    load_full_state,
    wrap_model,
)
from .optim import OPTIMIZERS, SCHEDULES, configure_optimizer, schedule_lr

__all__ = ["TrainConfig", "Trainer", "BatchSource", "TrainingStopped"]

log = logging.getLogger(__name__)


class BatchSource(Protocol):
    def batch(self, index: int) -> tuple[Any, torch.Tensor]: ...


@dataclass
class TrainConfig:
    """Training settings (every field can be set with ``--set key=value``).

    Args:
        max_iters: optimizer steps (the iteration budget).
        time_budget: seconds for the whole run (None = no limit): from the command's start — data preparation
            included — to the end of the final evaluation and the report, a resumed run's earlier sessions
            included; training stops early enough for the final evaluation to fit, and the learning-rate schedule
            then follows the clock.
        batch_size: sequences per micro-batch.
        grad_accum: micro-batches per optimizer step.
        lr, min_lr: peak and final learning rate (min_lr None = lr/10).
        warmup_iters: linear warm-up steps.
        weight_decay: AdamW decay on matrices.
        beta1, beta2: AdamW betas.
        grad_clip: max global gradient norm (0 = off).
        eval_interval: steps between evaluations (0 = only at the end).
        checkpoint_interval: steps between checkpoints (0 = only at the end; None = eval_interval).
        keep_checkpoints: how many checkpoints to keep.
        precision: ``"fp32"`` or ``"bf16"`` (autocast).
        compile: wrap the model in ``torch.compile`` (its forward and backward become compiled graphs; the first
            steps pay the compilation).
        checkpointing: activation checkpointing of the model's transformer blocks: backward recomputes each
            block's forward instead of keeping its intermediates (less memory, about one more forward per step;
            the same losses). A model without blocks is refused.
        log_interval: steps between log lines.
        seed: the run's seed (data order, init, dropout).
        progress: show a progress bar.
        target_val_loss: stop as soon as an evaluation reports ``val_loss`` at or below this value.
        strategy: ``"ddp"`` or ``"fsdp"`` when launched with torchrun (ignored in a single process).
        report: write ``report.html`` in the run directory at each checkpoint and at the end.
        tensorboard: also write TensorBoard event files to ``RUN_DIR/tensorboard`` (needs the
            ``tensorboard`` package; ``log.jsonl`` stays the source of truth).
        optimizer: ``"adamw"``, or ``"muon"``: Muon for the hidden matrices, AdamW (``lr``) for embeddings,
            head, gains and biases (see :class:`~tokennet.train.optim.MuonAdamW`).
        muon_lr, muon_momentum, muon_weight_decay: Muon's peak learning rate (it follows the same schedule
            as ``lr``, scaled), momentum and decoupled weight decay.
        schedule: ``"cosine"`` (warm-up, cosine to min_lr) or ``"wsd"`` (warm-up, constant, linear decay to
            min_lr over the last ``decay_fraction`` of the budget).
        decay_fraction: the share of the budget (steps or seconds) the ``"wsd"`` decay takes.
    """

    max_iters: int = 1000
    time_budget: float | None = None
    batch_size: int = 32
    grad_accum: int = 1
    lr: float = 1e-3
    min_lr: float | None = None
    warmup_iters: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0
    eval_interval: int = 250
    checkpoint_interval: int | None = None
    keep_checkpoints: int = 2
    precision: str = "fp32"
    compile: bool = False
    checkpointing: bool = False
    log_interval: int = 10
    seed: int = 0
    progress: bool = True
    target_val_loss: float | None = None
    strategy: str = "ddp"
    report: bool = True
    tensorboard: bool = False
    optimizer: str = "adamw"
    muon_lr: float = 0.02
    muon_momentum: float = 0.95
    muon_weight_decay: float = 0.0
    schedule: str = "cosine"
    decay_fraction: float = 0.3

    def __post_init__(self):
        for field in dataclasses.fields(self):  # inf or nan in a setting can only train to NaN weights: refuse it here
            v = getattr(self, field.name)
            if isinstance(v, float) and not math.isfinite(v):
                raise ConfigError(f"{field.name} must be a finite number, got {v}")
        for k in ("max_iters", "batch_size", "grad_accum"):
            if getattr(self, k) < 1:
                raise ConfigError(f"{k} must be >= 1, got {getattr(self, k)}")
        for k in ("warmup_iters", "eval_interval", "log_interval", "keep_checkpoints"):
            if getattr(self, k) < 0:
                raise ConfigError(f"{k} must be >= 0, got {getattr(self, k)}")
        if self.checkpoint_interval is not None and self.checkpoint_interval < 0:
            raise ConfigError(f"checkpoint_interval must be >= 0 (or None = eval_interval), "
                              f"got {self.checkpoint_interval}")
        if self.time_budget is not None and not self.time_budget > 0:
            raise ConfigError(f"time_budget must be positive seconds, got {self.time_budget}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"lr must be a positive number, got {self.lr}")
        if self.min_lr is not None and not (self.min_lr >= 0 and math.isfinite(self.min_lr)):
            raise ConfigError(f"min_lr must be a number >= 0 (or None = lr/10), got {self.min_lr}")
        for k in ("beta1", "beta2"):
            if not 0 <= getattr(self, k) < 1:
                raise ConfigError(f"{k} must be in [0, 1), got {getattr(self, k)}")
        if self.precision not in ("fp32", "bf16"):
            raise ConfigError(f"precision must be 'fp32' or 'bf16', got {self.precision!r}")
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if not (self.muon_lr > 0 and math.isfinite(self.muon_lr)):
            raise ConfigError(f"muon_lr must be a positive number, got {self.muon_lr}")
        if not 0 <= self.muon_momentum < 1:
            raise ConfigError(f"muon_momentum must be in [0, 1), got {self.muon_momentum}")
        if not self.muon_weight_decay >= 0:
            raise ConfigError(f"muon_weight_decay must be >= 0, got {self.muon_weight_decay}")
        if not 0 < self.decay_fraction <= 1:
            raise ConfigError(f"decay_fraction must be in (0, 1], got {self.decay_fraction}")
        if not (self.grad_clip >= 0 and self.weight_decay >= 0):
            raise ConfigError(f"grad_clip and weight_decay must be >= 0, got {self.grad_clip} and {self.weight_decay}")
        # Decoupled decay multiplies each matrix by 1 − lr·weight_decay per step: at 1 or more it zeroes or flips them.
        for lr, decay, name in ((self.lr, self.weight_decay, "lr·weight_decay"),
                             (self.muon_lr, self.muon_weight_decay, "muon_lr·muon_weight_decay")):
            if lr * decay >= 1:
                raise ConfigError(f"{name} must be < 1 (each step multiplies the weights by 1 − {name}), got "
                                  f"{lr:g}·{decay:g} = {lr * decay:g}; lower the weight decay")


class Trainer:
    """Runs the optimization loop with evaluation, logging and checkpoints in ``out_dir``.

    Args:
        model: returns an object with ``.loss`` from ``model(inputs, targets)``.
        config: a :class:`TrainConfig`.
        source: training batch source, ``batch(i) -> (inputs, targets)`` deterministic in ``i``.
        evaluate: ``evaluate(model) -> dict`` of metrics (e.g. ``{"val_loss": ...}``), called in eval
            mode under ``torch.no_grad``.
        out_dir: run directory (``log.jsonl`` and ``checkpoints/`` go there).
        device: where to train.
        tokens_per_batch: items (tokens, images) in one micro-batch, for the throughput figure.
        dist: this process's place in a torchrun launch (None = a single process).
        on_checkpoint: called with the trainer after each checkpoint written before the run is done (periodic
            ones, and the one an interrupted run writes; rank 0 only), e.g. to refresh the run's report.
        clock: the run's clock and time budget (:class:`~tokennet.train.budget.RunClock`; default: one started
            now, with ``config.time_budget`` and nothing reserved).
        label: what the progress lines begin with (a baseline trained beside the model: ``vqa-cnn baseline``).
    """

    def __init__(
        self,
        model: nn.Module,
        config: TrainConfig,
        source: BatchSource,
        *,
        evaluate: Callable[[nn.Module], dict[str, float]] | None = None,
        out_dir: str | Path,
        device: torch.device | str = "cpu",
        tokens_per_batch: int | None = None,
        dist: DistInfo | None = None,
        on_checkpoint: Callable[[Trainer], None] | None = None,
        clock: RunClock | None = None,
        label: str = "",
    ):
        self.c = config
        self.clock = clock if clock is not None else RunClock(budget=config.time_budget)
        self.label = label
        self.train_started: float | None = None  # the clock's reading at the run's first step
        self.stopped_at: float | None = None  # the clock's reading when training stopped (the last progress line)
        self._step_seconds = 0.0  # the last step's wall seconds: a step that would end past the budget is not begun
        self._agreed_end = 0.0  # under torchrun: when the next step would end, the latest of every rank's view
        self.dist = dist or DistInfo()
        self.device = torch.device(device)
        if config.checkpointing and not set_checkpointing(model):
            raise ConfigError(f"checkpointing=true needs a model of transformer blocks; this {type(model).__name__} "
                              "has none")
        self.model = wrap_model(model.to(self.device), config.strategy, self.dist, self.device)
        self.module = self.model.module if hasattr(self.model, "no_sync") else self.model  # under DDP
        self.source = source
        self.evaluate_fn = evaluate
        self.out_dir = Path(out_dir)
        self.ckpt_dir = self.out_dir / CHECKPOINT_DIR
        self.tokens_per_batch = tokens_per_batch
        self.optimizer = configure_optimizer(
            self.module, lr=config.lr, weight_decay=config.weight_decay, betas=(config.beta1, config.beta2),
            device_type=self.device.type, optimizer=config.optimizer, muon_lr=config.muon_lr,
            muon_momentum=config.muon_momentum, muon_weight_decay=config.muon_weight_decay,
        )
        self.step = 0
        self.elapsed = 0.0  # training seconds, carried across resumes
        self.history: list[dict[str, Any]] = []
        self._stop_signal: int | None = None
        self._reached = False  # target_val_loss met
        self._forward = torch.compile(self.model) if config.compile else self.model
        self.on_checkpoint = on_checkpoint
        self._tb = None  # opened by fit(): building a Trainer writes nothing (an overwritten run is still intact)

    # -- state ---------------------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        return {"elapsed": self.elapsed, "data_position": self.step * self.c.grad_accum,
                "run_seconds": self.clock.spent(), "train_started": self.train_started,
                "train_config": dataclasses.asdict(self.c), "history": self.history[-50:]}

    def save(self) -> Path | None:
        """Write a checkpoint (a collective under FSDP: every rank calls it; rank 0 writes)."""
        msd, osd = full_state(self.model, self.optimizer)
        rng = gather_objects(capture_rng(), self.dist)
        path = None
        if self.dist.is_main:
            path = save_checkpoint(self.ckpt_dir, self.step, msd, osd, self._state(), rng,
                                   keep=max(1, self.c.keep_checkpoints))
            if self.on_checkpoint is not None and not self._done():  # the final state is the caller's to report
                self.on_checkpoint(self)
        barrier(self.dist)
        return path

    def resume(self) -> bool:
        """Load the latest checkpoint in ``out_dir``; False when there is none."""
        path = latest_checkpoint(self.ckpt_dir)
        if path is None:
            return False
        saved = read_checkpoint(path)
        expected, _ = full_state(self.model, None) if self.dist.enabled else (self.module.state_dict(), None)
        if self.dist.is_main or not self.dist.enabled:
            check_state_dict(expected, saved.model_state, f"checkpoint {path}", RunError)
        step, elapsed, history = saved.meta["step"], saved.meta.get("elapsed"), saved.meta.get("history", [])
        if isinstance(step, bool) or not isinstance(step, int) or step < 0 or isinstance(elapsed, bool) \
                or not isinstance(elapsed, (int, float)) or not isinstance(history, list):
            raise RunError(f"checkpoint {path} is damaged: its trainer.json has no valid step, elapsed or history")
        groups = [{k: v for k, v in group.items() if k != "params"} for group in self.optimizer.param_groups]
        try:  # the file's optimizer and random states, as torch, numpy and random take them
            load_full_state(self.model, self.optimizer, saved.model_state, saved.optim_state, self.dist)
            for old, new in zip(groups, self.optimizer.param_groups, strict=True):
                for k, v in old.items():  # torch takes the hyperparameters as they come; the step would fail
                    if not _same_kind(v, new.get(k)):
                        raise ValueError(f"optimizer setting {k} is {new.get(k)!r}")
            rng_json, tensors = saved.rng[self.dist.rank] if self.dist.rank < len(saved.rng) else saved.rng[0]
            restore_rng(rng_json, tensors)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError, RuntimeError) as error:
            raise RunError(f"checkpoint {path} is damaged: its optimizer or random state cannot be restored "
                           f"({type(error).__name__}: {one_line(error)[:200]})") from None
        self.step, self.elapsed, self.history = step, elapsed, history
        # the run's clock goes on from the seconds its earlier sessions spent (older checkpoints: their training's)
        run_seconds, started = saved.meta.get("run_seconds", elapsed), saved.meta.get("train_started")
        if _seconds(run_seconds) is not None:
            self.clock.earlier = _seconds(run_seconds)
        self.train_started = _seconds(started)
        log.info("resumed from %s (step %d, %.0f s spent)", path, self.step, self.clock.earlier)
        return True

    # -- loop ----------------------------------------------------------------------------------
    def _progress_line(self, loss: float, rate: float, seconds: float | None = None) -> str:
        """``step 250/1000 · 31 s of 150 s · loss 1.9234 · 12,345 items/s``: what a log file shows while training;
        the seconds are the run's clock (``seconds``, default now: the whole run so far, preparation included), of
        its time budget."""
        budget = self.clock.budget
        shown = f" of {budget:.0f} s" if budget is not None else ""
        seconds = self.clock.spent() if seconds is None else seconds
        label = f"{self.label}: " if self.label else ""
        return (f"{label}step {self.step}/{self.c.max_iters} · {seconds:.0f} s{shown} · loss {loss:.4f} · "
                f"{rate:,.0f} items/s")

    def _lr(self) -> float:
        config = self.c
        min_lr = config.lr / 10 if config.min_lr is None else config.min_lr
        progress = (self.step - config.warmup_iters) / max(1, config.max_iters - config.warmup_iters)
        if self.clock.budget is not None:  # the share of the training time gone, from the run's first step to its stop
            now = self._agreed_end if self.dist.enabled else self.clock.spent()  # the same on every rank
            begun = now if self.train_started is None else self.train_started
            until = self.clock.projected_stop(now, begun, self.step)
            progress = max(progress, (now - begun) / max(1e-9, until - begun))
        return schedule_lr(config.schedule, self.step, progress, lr=config.lr, min_lr=min_lr,
                           warmup_iters=config.warmup_iters, decay_fraction=config.decay_fraction)

    def _autocast(self):
        if self.c.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _to_device(self, x):
        if torch.is_tensor(x):
            return x.to(self.device, non_blocking=True)
        if isinstance(x, (tuple, list)):
            return type(x)(self._to_device(t) for t in x)
        if isinstance(x, dict):
            return {k: self._to_device(v) for k, v in x.items()}
        return x

    def run_eval(self) -> dict[str, float]:
        if self.evaluate_fn is None:
            return {}
        self.model.eval()
        try:
            with torch.no_grad(), self._autocast():
                return {k: float(v) for k, v in self.evaluate_fn(self.module).items()}
        finally:
            self.model.train()

    def _log(self, record: dict[str, Any]) -> None:
        if not self.dist.is_main:
            return
        with open(self.out_dir / LOG_FILE, "a") as log:
            log.write(json.dumps(record) + "\n")
        if self._tb is not None:
            self._tb.write(record)

    def _diverged(self, what: str) -> None:
        """Stop a run whose loss or gradients are no longer finite, before the optimizer writes NaN into the weights."""
        self.optimizer.zero_grad(set_to_none=True)
        try:
            last = latest_checkpoint(self.ckpt_dir)
        except RunError:
            last = None
        kept = (f"the last good checkpoint ({last.name}) is kept: change the setting (e.g. a lower lr) and "
                f"continue with --resume" if last is not None else
                "no checkpoint was written yet: change the setting (e.g. a lower lr) and start again")
        raise TrainingStopped(f"training stopped at step {self.step + 1}: {what}; {kept}")

    def _on_signal(self, signum, frame):  # noqa: ARG002
        self._stop_signal = signum

    @property
    def stopping(self) -> bool:
        """True once Ctrl-C or SIGTERM asked the run to stop (its last checkpoint is being written)."""
        return self._stop_signal is not None

    def _done(self) -> bool:
        """Whether training stops now: the steps are done, the target loss reached, or the next step would end
        past the time the budget leaves for training (a run takes at least one step)."""
        if self.step >= self.c.max_iters or self._reached:
            return True
        until = self.clock.train_until(self.step + 1)  # the next step's share of a reserve per step included
        if until is None or self.step == 0:
            return False
        # under torchrun every rank takes the same decision: the latest end any rank foresees (_agree_across_ranks)
        next_end = self._agreed_end if self.dist.enabled else self.clock.spent() + self._step_seconds
        return next_end > until

    def fit(self) -> dict[str, Any]:
        """Train until the iteration or time budget is spent; return the final metrics.

        The loop reads as the lecture's training loop: one step (:meth:`train_step`), then what the step is
        reported as (:class:`_Reporter`), an evaluation and a checkpoint when they are due."""
        config = self.c
        self._open_outputs()
        ckpt_every = config.eval_interval if config.checkpoint_interval is None else config.checkpoint_interval
        old = {signum: signal.signal(signum, self._on_signal) for signum in (signal.SIGINT, signal.SIGTERM)} \
            if _main_thread() else {}
        report = _Reporter(self)
        self.model.train()
        last_loss = float("nan")
        self._reached = False
        if self.train_started is None:
            self.train_started = self.clock.spent()
            if self.dist.enabled:  # one reading for every rank: the schedule follows the same clock everywhere
                begun = torch.tensor([self.train_started])
                torch.distributed.all_reduce(begun, op=torch.distributed.ReduceOp.MAX)
                self.train_started = self._agreed_end = float(begun[0])
        try:
            while not self._done():
                loss_val, grad_norm, lr = self.train_step()
                last_loss = loss_val
                report.step(loss_val, grad_norm, lr)
                if config.eval_interval and self.step % config.eval_interval == 0 and not self._done():
                    report.eval(self._eval_record(loss_val, report.t_fit))
                if ckpt_every and self.step % ckpt_every == 0 and not self._done():
                    self.save()
                if self._stop_signal is not None:
                    self.save()
                    raise KeyboardInterrupt
        finally:
            self.stopped_at = round(self.clock.spent(), 2)  # as the final record holds it: the same line, summary
            report.close(last_loss)
            for signum, handler in old.items():
                signal.signal(signum, handler)
        with phase(f"{self.label}: evaluating and saving" if self.label else "evaluating and saving the last step"):
            final = self._eval_record(last_loss, report.t_fit, at_end=True)
            self.save()
        return final

    def _open_outputs(self) -> None:
        """The output directory (and the TensorBoard writer, when asked for), on the main rank only."""
        if not self.dist.is_main:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if self.c.tensorboard and self._tb is None:
            from .tensorboard import open_writer

            self._tb = open_writer(self.out_dir / "tensorboard")

    def train_step(self) -> tuple[float, torch.Tensor, float]:
        """One optimizer step: the learning rate of this step, ``grad_accum`` micro-batches' gradients, clipping,
        the update. Returns ``(loss, gradient norm before clipping, lr)``; a non-finite loss or norm stops training
        (:meth:`_diverged`)."""
        config = self.c
        started = time.perf_counter()
        lr = self._lr()
        for group in self.optimizer.param_groups:  # Muon's groups follow the same schedule, scaled
            group["lr"] = lr * config.muon_lr / config.lr if group.get("kind") == "muon" else lr
        loss_sum = torch.zeros((), device=self.device)
        for micro in range(config.grad_accum):
            loss_sum += self._micro_batch(micro)
        loss_val = float(all_reduce_mean(loss_sum, self.dist))
        if not math.isfinite(loss_val):
            self._diverged(f"loss became {loss_val}")
        # The norm before clipping is logged as grad_norm; max_norm=inf leaves the gradients as they are.
        grad_norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(),
                                                   config.grad_clip if config.grad_clip > 0 else math.inf)
        if not math.isfinite(float(grad_norm)):  # a finite loss can still have inf/nan gradients
            self._diverged(f"the gradient norm became {float(grad_norm)} (loss {loss_val:.4g})")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self._step_seconds = time.perf_counter() - started
        self.elapsed += self._step_seconds
        self._agree_across_ranks()
        return loss_val, grad_norm, lr

    def _micro_batch(self, micro: int) -> torch.Tensor:
        """Forward and backward of micro-batch ``micro`` of this step; its share of the step's loss (detached)."""
        config = self.c
        # Each rank draws its own micro-batches: N ranks = one process accumulating N of them.
        index = (self.step * config.grad_accum + micro) * self.dist.world_size + self.dist.rank
        x, y = self._to_device(self.source.batch(index))
        last = micro == config.grad_accum - 1
        sync = contextlib.nullcontext() if last or not hasattr(self.model, "no_sync") \
            else self.model.no_sync()  # DDP: one all-reduce per step, not per micro-batch
        with sync:
            with self._autocast():
                loss = self._forward(x, y).loss / config.grad_accum
            loss.backward()
        return loss.detach()

    def _agree_across_ranks(self) -> None:
        """Every rank must take the same decision to stop: the longest elapsed time, and a signal seen by any."""
        if not self.dist.enabled:
            return
        flags = torch.tensor([self.elapsed, float(self._stop_signal is not None),
                              self.clock.spent() + self._step_seconds])
        torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
        self.elapsed, self._agreed_end = float(flags[0]), float(flags[2])
        if flags[1] > 0 and self._stop_signal is None:
            self._stop_signal = signal.SIGTERM

    def _eval_record(self, train_loss: float, t_fit: float, *, at_end: bool = False) -> dict[str, Any]:
        """Evaluate, and record the result in the history and the log; during training, note whether the
        target validation loss is reached."""
        metrics = self.run_eval()
        rec = {"step": self.step, "elapsed": round(self.elapsed, 3), "wall": round(time.perf_counter() - t_fit, 3),
               "train_loss": train_loss, **metrics}
        if at_end:  # the run's clock when training stopped, of its budget: the last progress line's seconds
            rec["run_seconds"] = round(self.stopped_at if self.stopped_at is not None else self.clock.spent(), 2)
            if self.clock.budget is not None:
                rec["time_budget"] = round(self.clock.budget, 2)
        target = self.c.target_val_loss
        if not at_end and target is not None and metrics.get("val_loss", math.inf) <= target:
            self._reached = True
        self.history.append(rec)
        self._log(rec)
        return rec


class _Reporter:
    """What a training step is reported as: a progress bar on a terminal, or a plain line every
    :data:`PROGRESS_SECONDS` (a log file, ``--no-progress``); a record in the log every ``log_interval`` steps;
    each evaluation shown on one line."""

    def __init__(self, trainer: Trainer):
        self.trainer, config = trainer, trainer.c
        self.bar = _progress(config, trainer.step) if trainer.dist.is_main else None
        self.lines = trainer.dist.is_main and self.bar is None
        self.per_step = (trainer.tokens_per_batch or 0) * config.grad_accum
        self.t_fit = self.t_line = self.t_line_window = self.t_window = time.perf_counter()
        self.tokens = self.line_tokens = self.all_tokens = 0

    def step(self, loss_val: float, grad_norm: torch.Tensor, lr: float) -> None:
        t = self.trainer
        self.tokens += self.per_step
        self.all_tokens += self.per_step
        self.line_tokens += self.per_step
        if self.bar is not None:
            self.bar.update(1)
        elif self.lines and time.perf_counter() - self.t_line >= PROGRESS_SECONDS:
            rate = self.line_tokens / max(1e-9, time.perf_counter() - self.t_line_window)
            log.info("%s", t._progress_line(loss_val, rate))
            self.t_line = self.t_line_window = time.perf_counter()
            self.line_tokens = 0
        if t.c.log_interval and t.step % t.c.log_interval == 0:
            dt = time.perf_counter() - self.t_window
            rate = self.tokens / dt if dt > 0 else 0.0
            t._log({"step": t.step, "loss": loss_val, "lr": lr, "elapsed": round(t.elapsed, 3),
                    "items_per_s": round(rate, 1), "grad_norm": round(float(grad_norm), 5)})
            if self.bar is not None:  # the run's clock, of its budget, as the lines and the summary say it
                budget = f" of {t.clock.budget:.0f} s" if t.clock.budget is not None else ""
                self.bar.set_postfix(loss=f"{loss_val:.4f}", tok_s=f"{rate:,.0f}",
                                     run=f"{t.clock.spent():.0f}{budget if budget else ' s'}")
            self.tokens, self.t_window = 0, time.perf_counter()

    def eval(self, rec: dict[str, Any]) -> None:
        shown = " ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in rec.items())
        if self.bar is not None:
            self.bar.write(shown)
        elif self.lines:
            log.info("eval: %s", shown)

    def close(self, loss_val: float) -> None:
        """Close the bar, and show where training stopped: the last progress line, whose step and seconds the
        end-of-training summary repeats."""
        t = self.trainer
        if self.bar is not None:
            self.bar.close()
        if t.dist.is_main and t.step > 0:
            rate = self.all_tokens / max(1e-9, time.perf_counter() - self.t_fit)  # this session's mean
            log.info("%s", t._progress_line(loss_val, rate, t.stopped_at))


PROGRESS_SECONDS = 10.0  # without a progress bar, one progress line at most this often


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _progress(c: TrainConfig, initial: int):
    if not c.progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=c.max_iters, initial=initial, unit="it", dynamic_ncols=True, leave=False)


def _seconds(value: Any) -> float | None:
    """A number of seconds read back from a checkpoint (None: absent, or not a finite number >= 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        return None
    return float(value)


def _same_kind(a: Any, b: Any) -> bool:
    """Whether a hyperparameter read back from a checkpoint has the kind the optimizer was built with."""
    if isinstance(a, bool) or a is None or isinstance(a, str):
        return type(a) is type(b)
    if isinstance(a, (int, float)):
        return isinstance(b, (int, float)) and not isinstance(b, bool)
    if isinstance(a, (tuple, list)):
        return isinstance(b, (tuple, list)) and len(a) == len(b) and all(map(_same_kind, a, b))
    return True
