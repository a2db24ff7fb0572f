"""Tuning the lecture's generic transformer on the whole ``vqa`` task (the ``tokennet train vqa`` default): trials over
width, depth, patch size, positions, learning rate, schedule and steps, each recorded with its learning curve; then
the best trial again on several seeds, tested as the recipe tests.

The generic model is the lecture's: the question's words and linear patch embeddings in one sequence, full
self-attention, pre-norm blocks, the answer read from the summary token by one linear map
(:data:`tokennet.recipes.vqa.GENERIC`, preset ``vqa-generic``). Tuning it is fair; building the task into it is not,
so no knob here is a mask, a stem, a readout or a sink. Every trial trains as the recipe trains (its batches of all
templates, its optimizer settings) and is scored on the validation questions (``spec.val()``, not the test set);
``--confirm-seeds`` trains the best trial's settings once per seed and reports the held-out test exact match per
template (:func:`tokennet.recipes.vqa.evaluate`, what ``metrics.json`` holds); ``bench/vqa_default.py`` confirms a
chosen default through ``tokennet train vqa`` itself. The trials train with the rate the first trials started from
(lr 3e-3, cosine: the tuned model's), not the recipe's current default, so a recorded trial can be run again.

    PYTHONPATH=src OMP_NUM_THREADS=2 python bench/vqa_generic.py --trials 12                 # the search
    PYTHONPATH=src python bench/vqa_generic.py --trials 2 --steps 50 --confirm-seeds         # a quick look
    PYTHONPATH=src python bench/vqa_generic.py --trial lr=1e-3,schedule=wsd --trial dim=96   # given trials

``--trial`` runs the trials it names (each the first trial with the knobs it sets) instead of drawn ones.

Prints a table of the trials and writes ``bench/results/vqa_generic.json`` (the command, the commit, the machine, the
trials with their curves, the best, the seeds' test figures). Bad settings are refused in one line, nothing written.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from tokennet.data.vqa import COLOURS, AnimalQuestions, QABatches  # noqa: E402
from tokennet.errors import ConfigError, TokennetError  # noqa: E402
from tokennet.models.registry import create_model  # noqa: E402
from tokennet.models.vqa import answer_points  # noqa: E402
from tokennet.recipes.vqa import GENERIC, evaluate  # noqa: E402
from tokennet.tasks.vqa import exact_match  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import write  # noqa: E402
from _vqa_train import LR, fit, train_config, trial_plan  # noqa: E402

MAX_LEN = 12
# The knobs of the generic model and its training (none builds the task in); the first trial is the recipe's
# budget at the lecture's sizes, at the tuned model's rate and schedule (where the generic model's tuning started).
KNOBS = {"dim": (64, 96, 128), "num_layers": (3, 4, 6), "patch_size": (8, 16),
         "patch_positions": ("learned", "fourier"), "lr": (1e-3, 2e-3, 3e-3), "schedule": ("cosine", "wsd"),
         "steps": (2000, 4000)}
FIRST = {"dim": 64, "num_layers": 3, "patch_size": 16, "patch_positions": "learned", "lr": LR, "schedule": "cosine",
         "steps": 4000}


class Task:
    """The recipe's data: the spec, its batches, the validation questions, the model's data-given settings."""

    def __init__(self, batch_size: int):
        self.spec = spec = AnimalQuestions(seed=0).filled()
        mean, std = spec.pixel_stats()
        self.data = {"vocab_size": len(spec.words), "num_answers": len(spec.answers), "image_size": spec.image_size,
                     "pixel_mean": mean, "pixel_std": std, "answer_points": answer_points(spec.answers, COLOURS),
                     "max_question_len": MAX_LEN}
        self.batch_size = batch_size
        self.batches = QABatches(spec, batch_size, MAX_LEN)
        self.val = spec.val()

    def model(self, knobs: dict, seed: int):
        torch.manual_seed(seed)
        model_knobs = {k: knobs[k] for k in ("dim", "num_layers", "patch_size", "patch_positions")}
        return create_model("vqa-transformer", **{**self.data, **GENERIC, **model_knobs})

    def train(self, knobs: dict, seed: int, eval_every: int):
        """One model with ``knobs``, trained as the recipe trains; ``(model, seconds, curve)``."""
        m = self.model(knobs, seed)
        config = train_config(knobs["steps"], knobs["lr"], seed=seed, schedule=knobs["schedule"],
                              eval_interval=eval_every)

        def on_val(model) -> dict:
            return {k[len("exact_match_"):] if k != "exact_match" else "all": v
                    for k, v in exact_match(model, self.val, self.spec.words, MAX_LEN).items()}

        secs, curve = fit(m, self.batches, config, batch_size=self.batch_size, evaluate=on_val if eval_every else None)
        return m, secs, curve


def run(args) -> int:
    task = Task(args.batch_size)
    first = {**FIRST, "steps": args.steps[-1]}
    plan = ([{**first, **given} for given in args.trial] if args.trial
            else trial_plan(args.trials, args.tune_seed, {**KNOBS, "steps": tuple(args.steps)}, first))
    trials = []
    for knobs in plan:
        m, secs, curve = task.train(knobs, 0, args.eval_every)
        em = exact_match(m, task.val, task.spec.words, MAX_LEN)
        trials.append({**knobs, "num_parameters": m.num_parameters(), "train_seconds": secs,
                       "val_exact_match": em["exact_match"], "val_same_species": em["exact_match_same_species"],
                       "curve": curve})
        print(json.dumps({k: v for k, v in trials[-1].items() if k != "curve"}), flush=True)
    best = max(trials, key=lambda trial: (trial["val_exact_match"], trial["val_same_species"]))
    chosen = {k: best[k] for k in KNOBS}
    seeds = []
    for seed in args.confirm_seeds:
        m, secs, _ = task.train(chosen, seed, 0)
        seeds.append({"seed": seed, "train_seconds": secs, **evaluate(m, task.spec)})
        print(json.dumps(seeds[-1]), flush=True)
    report(args, trials, chosen, seeds)
    return 0


def report(args, trials: list[dict], chosen: dict, seeds: list[dict]) -> None:
    names = list(KNOBS)
    print("\n| " + " | ".join(names) + " | params | val all % | val same species % | train s |")
    print("|" + " --- |" * (len(names) + 4))
    for t in sorted(trials, key=lambda trial: -trial["val_exact_match"]):
        print("| " + " | ".join(str(t[k]) for k in names) + f" | {t['num_parameters']} | {t['val_exact_match']:.1f} | "
              f"{t['val_same_species']:.1f} | {t['train_seconds']} |")
    result = {"benchmark": "vqa_generic", "generic": GENERIC, "trials": trials, "chosen": chosen, "seeds": seeds}
    if seeds:
        keys = [k for k in seeds[0] if k.startswith("exact_match")]
        result["median"] = {k: statistics.median(s[k] for s in seeds) for k in keys}
        print(f"\nbest trial {chosen} on seeds {args.confirm_seeds}, held-out test (median): "
              + ", ".join(f"{k} {v:.1f}" for k, v in result["median"].items()))
    write(args.out, result, settings={k: v for k, v in vars(args).items() if k != "argv"}, argv=args.argv,
          script="vqa_generic.py", torch=torch.__version__, threads=torch.get_num_threads(),
          load=list(os.getloadavg()))
    print(f"\nwrote {args.out}")


def given_trial(text: str) -> dict:
    """``"lr=1e-3,schedule=wsd"`` → the knobs it sets, each value as the first trial's type; an unknown knob or a
    value of the wrong type is refused."""
    knobs = {}
    for item in filter(None, text.split(",")):
        name, sep, value = item.partition("=")
        if not sep or name not in KNOBS:
            raise argparse.ArgumentTypeError(f"{item!r}: expected KNOB=VALUE with KNOB one of {', '.join(KNOBS)}")
        try:
            knobs[name] = type(FIRST[name])(float(value)) if isinstance(FIRST[name], (int, float)) else value
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r}: {name} takes a number") from None
        if isinstance(FIRST[name], int) and float(value) != knobs[name]:
            raise argparse.ArgumentTypeError(f"{item!r}: {name} takes a whole number")
    return knobs


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=12, help="trials (the first: the recipe's budget, dim 64 × 3 "
                    "layers, 16-px patches, learned positions, lr 3e-3, cosine, where the tuning started)")
    ap.add_argument("--steps", type=int, nargs="+", default=list(KNOBS["steps"]), help="the step budgets a trial may "
                    "draw (the first trial takes the last)")
    ap.add_argument("--trial", type=given_trial, action="append", default=[], metavar="KNOB=VALUE,...",
                    help=f"run this trial (the first trial's knobs, these changed; knobs: {', '.join(KNOBS)}) "
                    "instead of drawn ones; repeatable")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--eval-every", type=int, default=500, help="steps between the curves' evaluations (0: none)")
    ap.add_argument("--tune-seed", type=int, default=0)
    ap.add_argument("--confirm-seeds", type=int, nargs="*", default=[0, 1, 2],
                    help="train the best trial once per seed and test it (none: skip)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "vqa_generic.json"))
    args = ap.parse_args(argv)
    args.argv = argv
    return args


def main(argv=None) -> int:
    args = parse(argv)
    try:
        if args.trials < 1 or args.batch_size < 2 or args.eval_every < 0 or min(args.steps) < 1:
            raise ConfigError("--trials and --steps must be >= 1, --batch-size >= 2, --eval-every >= 0")
        return run(args)
    except TokennetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
