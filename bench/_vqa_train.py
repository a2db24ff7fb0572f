"""What the vqa benches share: training as the ``vqa`` recipe trains, with a learning curve, and a tuning budget of
trials drawn alike for every family (``bench/vqa_receptive_field.py``, ``bench/vqa_generic.py``)."""

from __future__ import annotations

import dataclasses
import itertools
import random
import tempfile
import time
from typing import Any

LR = 3e-3  # the peak rate (AdamW) the benches were tuned around, the tuned vqa model's; Muon's, 0.02, scales with it
MUON_LR = 0.02


def trial_plan(n: int, seed: int, knobs: dict[str, tuple], first: dict[str, Any]) -> list[dict[str, Any]]:
    """``n`` distinct settings of ``knobs`` (name → the values it may take): ``first`` (the defaults), then draws
    without replacement from the grid, seeded. Every family given the same ``knobs`` and ``seed`` gets the same
    trials: the same budget over the same kinds of knobs."""
    grid = [dict(zip(knobs, values, strict=True)) for values in itertools.product(*knobs.values())]
    rest = [point for point in grid if point != first]
    random.Random(seed).shuffle(rest)
    return ([dict(first)] + rest)[:max(0, n)]


def train_config(steps: int, lr: float, precision: str = "fp32", **overrides):
    """The ``vqa`` recipe's training settings (Muon on the hidden matrices, AdamW on the rest, warm-up then cosine
    — whatever the recipe's default schedule, so that a bench's trials stay what they were) for ``steps`` steps at
    peak rate ``lr`` (Muon's scaled alike); ``overrides`` replace any other field (``schedule``, ``warmup_iters``,
    ``eval_interval``)."""
    from tokennet.recipes import get_recipe
    from tokennet.train.trainer import TrainConfig

    base = TrainConfig(**get_recipe("vqa").train_defaults)
    settings = {"max_iters": steps, "lr": lr, "muon_lr": MUON_LR * lr / LR, "schedule": "cosine", "eval_interval": 0,
                "checkpoint_interval": 0, "progress": False, "log_interval": 0, "report": False, "tensorboard": False,
                "precision": precision, "warmup_iters": min(base.warmup_iters, max(1, steps // 5))}
    return dataclasses.replace(base, **{**settings, **overrides})


def fit(model, batches, config, *, batch_size: int, evaluate=None) -> tuple[float, list[dict[str, Any]]]:
    """Train ``model`` on ``batches`` with ``config`` (tokennet's Trainer); with ``evaluate`` (``model → {name:
    value}``) and ``config.eval_interval``, the learning curve: per evaluation the step, the training examples seen,
    the training seconds so far (``seconds``, evaluations excluded) and since the start (``wall``), and what
    ``evaluate`` returned. Returns ``(training seconds, curve)``; the model is left in eval mode."""
    from tokennet.train.trainer import Trainer

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:  # a bench's checkpoints are not kept
        trainer = Trainer(model, config, batches, out_dir=scratch, device="cpu", evaluate=evaluate)
        trainer.fit()
    model.eval()
    curve = [{"step": rec["step"], "examples": rec["step"] * batch_size, "seconds": round(rec["elapsed"], 2),
              "wall": round(rec["wall"], 2),
              **{k: v for k, v in rec.items() if k not in ("step", "elapsed", "wall", "train_loss")}}
             for rec in trainer.history] if evaluate is not None else []
    return round(time.perf_counter() - start, 1), curve


_BENCHES: dict[str, Any] = {}


def call_in_bench(job: tuple[str, str, tuple]) -> Any:
    """``(path, name, args)`` → ``name(*args)`` of the bench script at ``path``, loaded once per process: what a
    bench's worker processes run (``--jobs``). A spawned worker imports this module by name (the parent's
    ``sys.path`` comes with it), so the bench itself need not be importable — it may be ``__main__``, or loaded from
    its file by a test."""
    import importlib.util

    path, name, args = job
    if path not in _BENCHES:
        spec = importlib.util.spec_from_file_location(f"bench_worker_{len(_BENCHES)}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _BENCHES[path] = module
    return getattr(_BENCHES[path], name)(*args)
