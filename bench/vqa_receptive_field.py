"""Corner pairs against the CNN's receptive field: *is the top right animal the same species as the bottom left
animal?* answered by FiLM CNNs whose fields run from below the distance between two corners to the whole picture,
beside the transformer; with ``--curves``, learning curves and an equal tuning budget for every family.

The lecture's x1 … x7: no unit whose field misses one of the two corners can compare them. Three CNN families:

- ``field``: the baselines ``tokennet train vqa`` trains beside its transformer (presets ``vqa-cnn`` and
  ``vqa-cnn-shallow``): a 4×4 patchify stem, then plain 3×3 stages, each after the first at stride 2, so the field
  doubles per stage (``r = 4 + 8·2^(n−1)``: 12, 20, 36, 68 px), coordinate channels, and the answer read from every
  unit of the final map by one linear map (``readout="flatten"``: nothing averaged away, but still a sum of local
  votes). The fields differ by stages alone: each stage doubles the one before's width (as the presets do), the
  first's chosen so that the 68-px model has about the transformer's parameters;

- ``pooled``: a conv trunk, then global average pooling (the answer is the mean of every unit's vote), with two
  coordinate channels appended to the image (``readout="coords"``, as FiLM's own model does). The field is set by
  depth (plain 3×3 layers at stride 1 after a 4×4 patchify stem: ``r = 4 + 8n``) or by dilation (two layers,
  ``r = 4 + 16d``); ``--arch resnet`` builds residual blocks instead (``r = 4 + 16n``), which train at depths where
  plain stacks stall;
- ``unit``: all-convolutional, nothing pooled: strided convolutions take the picture's centred window down to one
  unit and the answer is read from it (:mod:`tokennet.models.strided_cnn`): the field is the window, any multiple of
  4 pixels up to the 64-px picture. Fields below 48 px (the distance between two corner cells) cannot hold two
  corner animals; 64 px holds all four corners.

Each CNN's width is chosen so that it has about the transformer's parameter count. Every model trains as the
``vqa`` recipe trains its models (its optimizer settings; the CNNs in the baselines' precision) on the same batches
of the corner questions (``same_species`` and ``species``, half each; the generated data of ``tokennet train
vqa``, no held-out kind in training) for the same steps, and answers the held-out corner pairs (each picture with a
held-out kind; chance is 50 %). ``--transformer generic`` trains the lecture's generic transformer
(the ``tokennet train vqa`` default's pieces) instead of the tuned one (``--set transformer=tuned``), which
``vqa_learning_curves.json`` was recorded with.

Tuning (``--trials N``): every family — the transformer and each CNN family — gets the same ``N`` trials over the
same kinds of knobs (``_vqa_train.trial_plan``: the peak learning rate; the width, as a scale of the
parameter-matched one; depth that does not change the field: the transformer's layers, the CNNs' 1×1 head layers),
each trained ``--tune-steps`` steps on seed 0 and scored on validation corner pairs (a score within twice
chance's standard error of 50 % ranks as chance, and then the species questions decide: :func:`choose`); the best
trial's knobs train every field and seed of its family (a CNN family is tuned at its largest field). The trials and
the rule are in the JSON.

Learning curves (``--eval-every K``, on by ``--curves``): every ``K`` steps, exact match per template on validation
corner questions against the training examples seen and the training seconds, for every model and seed; the
examples each needed to reach 75 % and 90 % on the corner pairs (median over seeds). ``tokennet demo claims --only
receptive-field`` reads the generic transformer's curves (``bench/results/vqa_learning_curves_generic.json``, the
recipe's default model; ``vqa_learning_curves.json`` holds the tuned one's) and gives the lecture's three
predictions a verdict each.

    PYTHONPATH=src OMP_NUM_THREADS=1 python bench/vqa_receptive_field.py            # the pooled sweep, 1500 steps
    PYTHONPATH=src python bench/vqa_receptive_field.py --fields 20 52 --steps 200     # a quick look
    PYTHONPATH=src python bench/vqa_receptive_field.py --family unit --no-transformer  # one unit, 20 … 64 px
    PYTHONPATH=src OMP_NUM_THREADS=1 python bench/vqa_receptive_field.py --curves     # curves, 3 seeds, tuning
    PYTHONPATH=src OMP_NUM_THREADS=1 python bench/vqa_receptive_field.py --curves --transformer generic \
        --family unit --fields 36 52 64 --out bench/results/vqa_learning_curves_generic.json  # claim 15's record

Prints markdown tables and writes the JSON (``--out``; the command, the commit, the machine), a figure of the corner
pairs against the field beside it (``.png``) and, with curves, one of the curves (``_curves.png``). A field a family
cannot build, or one larger than the picture, is refused in one line before anything trains or is written.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from tokennet.data.vqa import COLOURS, IMAGE_SIZE, AnimalQuestions, encode_questions, render, sample_items  # noqa: E402
from tokennet.demos.claims.corner_pairs import LEVELS, summarize, verdicts  # noqa: E402
from tokennet.errors import ConfigError, TokennetError  # noqa: E402
from tokennet.models.registry import create_model  # noqa: E402
from tokennet.models.vqa import FIELD_FAMILY, answer_points  # noqa: E402
from tokennet.recipes.vqa import GENERIC, TUNED, cnn_precision  # noqa: E402
from tokennet.tasks.vqa import exact_match  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/_record.py, also when a test loads this file
from _record import write  # noqa: E402
from _vqa_train import LR, call_in_bench, fit, train_config, trial_plan  # noqa: E402

FIELDS = (20, 36, 52, 60)  # pooled, plain layers by depth: 4 + 8n up to the picture
RESNET_FIELDS = (20, 36, 52)  # pooled, residual blocks: 4 + 16n up to the picture
UNIT_FIELDS = (20, 36, 52, 64)  # one unit: any window of whole 4-px patches
ARCHS = ("plain", "resnet")
FAMILIES = ("field", "pooled", "unit")
STAGE_FIELDS = {4 + 8 * 2 ** (n - 1): n for n in range(1, 5)}  # field family: the field of n strided stages
FIELD_FIELDS = (20, 36, 68)
TRANSFORMERS = ("tuned", "generic")
TEMPLATES = ("same_species", "species")
# The knobs every family is tuned over, the same grid for each: peak rate, width (a scale of the parameter-matched
# width; the transformer's dim 64 × scale), and depth that leaves the field alone (transformer: 2 + depth layers;
# CNNs: depth 1×1 head layers).
KNOBS = {"lr": (1e-3, 2e-3, 3e-3, 5e-3), "width": (0.5, 1.0, 1.5), "depth": (0, 1, 2)}


def layout(field: int, via: str, arch: str = "plain") -> dict:
    """The pooled trunk settings whose units see ``field`` pixels. Plain layers (one 3×3 conv each): by depth
    ``4 + 8n``, or two layers dilated ``d``: ``4 + 16d``. Residual blocks (two 3×3 convs each): by depth
    ``4 + 16n``, or one block dilated ``d``: ``4 + 16d``."""
    if arch not in ARCHS:
        raise ConfigError(f"--arch must be plain or resnet, got {arch!r}")
    step = 8 if arch == "plain" else 16  # pixels one layer (plain) or one block (resnet) adds after the 4× stem
    if via == "depth":
        n, rem = divmod(field - 4, step)
        if rem or n < 1:
            unit = "layer" if arch == "plain" else "residual block"
            raise ConfigError(f"a {field}-pixel field cannot be built by depth with {arch} {unit}s (4 + {step}·n "
                              f"pixels: {', '.join(str(4 + step * k) for k in (1, 2, 3))}, ...)")
        return {"depths": [n], "dilation": 1}
    if via == "dilation":
        d, rem = divmod(field - 4, 16)
        if rem or d < 1:
            raise ConfigError(f"a {field}-pixel field cannot be built by dilation ("
                              f"{'two layers' if arch == 'plain' else 'one residual block'}, 4 + 16·d pixels: "
                              "20, 36, 52, ...)")
        return {"depths": [2 if arch == "plain" else 1], "dilation": d}
    raise ConfigError(f"--via must be depth or dilation, got {via!r}")


def check_field(field: int, family: str, via: str = "depth", arch: str = "plain") -> None:
    """Refuse a field larger than the picture, or one the family cannot build (one line)."""
    if family == "field":
        if field not in STAGE_FIELDS:
            raise ConfigError(f"a {field}-pixel field cannot be built by the field family's stages (4 + 8·2^(n-1) "
                              f"pixels: {', '.join(map(str, STAGE_FIELDS))})")
        return
    if field > IMAGE_SIZE:
        raise ConfigError(f"a {field}-pixel field is larger than the {IMAGE_SIZE}-pixel picture: a unit cannot see "
                          f"more than all of it (fields up to {IMAGE_SIZE})")
    if family == "unit":
        if field < 4 or field % 4:
            raise ConfigError(f"a {field}-pixel field cannot be built by the one-unit CNN: its window is whole 4-px "
                              "patches (4, 8, …, 64)")
        return
    layout(field, via, arch)


def _nearest_width(widths_of, base: dict, budget: int, start: int = 8) -> int:
    """The even width ``w`` (``start`` … 256) whose model, ``base`` with ``widths_of(w)``, has the parameter count
    nearest ``budget``."""
    best = None
    for w in range(start, 257, 2):
        n = create_model("vqa-cnn", **{**base, "widths": widths_of(w)}).num_parameters()
        if best is None or abs(n - budget) < abs(best[1] - budget):
            best = (w, n)
        if n > budget:
            break
    return best[0]


def _matched_width(base: dict, budget: int) -> int:
    """The width of every stage whose model has the parameter count nearest ``budget``."""
    return _nearest_width(lambda w: [w] * len(base["depths"]), base, budget)


def _matched_first_width(base: dict, budget: int) -> int:
    """The field family's first-stage width (each later stage doubles it, as the presets do) whose four-stage
    (68-px) model has the parameter count nearest ``budget``: every field gets it, so fields differ in stages alone."""
    stages = max(STAGE_FIELDS.values())
    return _nearest_width(lambda w: [w * 2 ** i for i in range(stages)], {**base, "depths": [1] * stages}, budget,
                          start=2)


def cnn_settings(field: int, via: str, budget: int, data: dict, readout: str, arch: str = "plain", *,
                 family: str = "pooled", width: float = 1.0, head_layers: int = 0) -> dict:
    """A FiLM CNN of ``family`` with a ``field``-pixel field, ``width`` × the width that gives about ``budget``
    parameters, and ``head_layers`` 1×1 layers before its readout. ``pooled``: the trunk of :func:`layout` and
    ``readout``; ``unit``: the one-unit trunk whose window is the field; ``field``: the recipe's baselines'
    trunk with the stages that give ``field``, all fields at the width matched at the largest (68 px)."""
    if family == "field":
        base = {**data, **FIELD_FAMILY, "head_layers": head_layers}
        first = max(2, 2 * round(width * _matched_first_width(base, budget) / 2))
        stages = STAGE_FIELDS[field]
        return {**base, "depths": [1] * stages, "widths": [first * 2 ** i for i in range(stages)]}
    if family == "unit":
        base = {**data, "readout": "unit", "window": field, "arch": "plain", "stem_kernel": 4, "stem_stride": 4,
                "depths": [1], "head_layers": head_layers}
    else:
        base = {**data, "arch": arch, "stem_kernel": 4, "stem_stride": 4, "readout": readout,
                "head_layers": head_layers, **layout(field, via, arch)}
    return {**base, "widths": [max(4, 2 * round(width * _matched_width(base, budget) / 2))]}


class CornerBatches:
    """Batch ``i``: half ``same_species``, half ``species`` questions, drawn from ``(seed, i)`` as the recipe's
    training batches are (no held-out kind)."""

    def __init__(self, spec: AnimalQuestions, batch_size: int, max_len: int):
        self.spec, self.batch_size, self.max_len = spec, batch_size, max_len
        self.index = {a: i for i, a in enumerate(spec.answers)}

    def batch(self, i: int):
        items = [it for t in TEMPLATES for it in sample_items(self.batch_size // 2, f"rf-train-{i}-{t}",
                                                              seed=self.spec.seed, held_out=False, template=t)]
        images = torch.from_numpy(np.stack([render(it.scene, seed=zlib.crc32(f"rf-{i}-{k}".encode()))
                                            for k, it in enumerate(items)]))
        q = encode_questions([it.question for it in items], self.spec.words, self.max_len)
        return (images, q), torch.tensor([self.index[it.answer] for it in items])


def corner_test(spec: AnimalQuestions, n: int, split: str = "test"):
    """``n`` corner questions (half each template) about pictures with a held-out kind; ``split`` ``"test"`` (the
    figures) or ``"val"`` (tuning and the curves: other pictures)."""
    from tokennet.data.vqa import _qaset

    key = "rf-test" if split == "test" else f"rf-{split}"
    items = [it for t in TEMPLATES for it in sample_items(n // 2, f"{key}-{t}", seed=spec.seed, held_out=True,
                                                          template=t)]
    return _qaset(items, spec.answers, IMAGE_SIZE, seed=zlib.crc32(f"{spec.seed}-{key}".encode()))


def transformer_settings(data: dict, kind: str, width: float = 1.0, depth: int = 1) -> dict:
    """The recipe's tuned transformer or the generic one, ``64 × width`` wide (a multiple of 16) and ``2 + depth``
    layers (the tuned one's question reads in its layers 1 and 2, those it has)."""
    pieces = dict(TUNED) if kind == "tuned" else dict(GENERIC)
    layers = 2 + depth
    if pieces.get("read_layers"):
        pieces["read_layers"] = [i for i in pieces["read_layers"] if i < layers] or [layers - 1]
    return {**data, **pieces, "dim": max(16, 16 * round(64 * width / 16)), "num_layers": layers}


class Sweep:
    """What every model of one run of the bench shares: the data, the batches, the validation and test questions,
    the parameter budget; :meth:`build` and :meth:`train` make and train one model with a family's knobs."""

    def __init__(self, args):
        self.args = args
        self.spec = spec = AnimalQuestions(seed=0).filled()
        mean, std = spec.pixel_stats()
        self.data = {"vocab_size": len(spec.words), "num_answers": len(spec.answers), "pixel_mean": mean,
                     "pixel_std": std, "answer_points": answer_points(spec.answers, COLOURS)}
        self.budget = create_model("vqa-transformer", **transformer_settings(self.data, args.transformer)
                                   ).num_parameters()
        self.batches = CornerBatches(spec, args.batch_size, 12)
        self.test = corner_test(spec, args.test_size)
        self.val = corner_test(spec, args.val_size, "val")

    def settings(self, family: str, field: int, knobs: dict) -> dict:
        if family == "transformer":
            return transformer_settings(self.data, self.args.transformer, knobs["width"], knobs["depth"])
        return cnn_settings(field, self.args.via, self.budget, self.data, self.args.readout, self.args.arch,
                            family=family, width=knobs["width"], head_layers=knobs["depth"])

    def train(self, family: str, field: int, knobs: dict, seed: int, steps: int, eval_every: int):
        """Train one model; returns ``(model, settings, seconds, curve)``."""
        settings = self.settings(family, field, knobs)
        torch.manual_seed(seed)
        m = create_model("vqa-transformer" if family == "transformer" else "vqa-cnn", **settings)
        # the CNNs in the precision the recipe trains its baselines in (bf16 where the CPU has it in hardware)
        precision = "fp32" if family == "transformer" else cnn_precision("auto", "cpu")
        config = train_config(steps, knobs["lr"], precision, seed=seed, eval_interval=eval_every)
        words = self.spec.words

        def evaluate(model) -> dict:
            em = exact_match(model, self.val, words, 12)
            return {t: em[f"exact_match_{t}"] for t in TEMPLATES}

        secs, curve = fit(m, self.batches, config, batch_size=self.args.batch_size,
                          evaluate=evaluate if eval_every else None)
        return m, settings, secs, curve


def tune(sweep: Sweep, family: str, field: int) -> dict:
    """``--trials`` trials of ``family`` at ``field`` (the same plan for every family), each scored on the validation
    corner pairs; returns the trials and the chosen knobs."""
    args = sweep.args
    first = {"lr": args.lr, "width": 1.0, "depth": 1 if family == "transformer" else 0}
    trials = []
    for knobs in trial_plan(args.trials, args.tune_seed, KNOBS, first):
        m, settings, secs, _ = sweep.train(family, field, knobs, 0, args.tune_steps, 0)
        em = exact_match(m, sweep.val, sweep.spec.words, 12)
        trials.append({**knobs, "num_parameters": m.num_parameters(), "train_seconds": secs,
                       "val_same_species": em["exact_match_same_species"], "val_species": em["exact_match_species"]})
        print(json.dumps({"tuning": family, "field": field, **trials[-1]}), flush=True)
    best = choose(trials, args.val_size // 2)
    return {"field": field, "steps": args.tune_steps, "trials": trials, "rule": CHOICE_RULE,
            "chosen": {k: best[k] for k in KNOBS}}


CHOICE_RULE = ("the most corner pairs, where a trial is above chance by more than twice chance's standard error; "
               "trials the noise of chance explains tie at chance, and the species questions decide between them")


def choose(trials: list[dict], pairs: int) -> dict:
    """The best trial by :data:`CHOICE_RULE`: a score on ``pairs`` validation corner pairs within ``2 σ`` of chance
    (``σ = 50 / √pairs`` points) ranks as chance, so that 53 % against 50 % on 100 pairs does not pick the knobs
    when every trial is still guessing (short trials often are: the pairs are learned late)."""
    noise = 2 * 50 / max(pairs, 1) ** 0.5

    def rank(trial: dict) -> tuple[float, float]:
        pairs_score = trial["val_same_species"]
        return (pairs_score if pairs_score - 50 > noise else 50.0, trial["val_species"])

    return max(trials, key=rank)


def layers_of(m) -> int:
    """A transformer's blocks; a CNN's convolutions on its longest path (the stem, one or two per block, the head's)."""
    if hasattr(m.config, "num_layers"):
        return m.config.num_layers
    return 1 + sum(2 if block.arch == "resnet" else 1 for block in m.trunk.blocks) + m.config.head_layers


def row_of(family: str, field: int, seed: int, m, settings: dict, secs: float, curve: list, em: dict) -> dict:
    row = {"model": "transformer" if family == "transformer" else "cnn", "family": family, "seed": seed,
           "receptive_field": field, "layers": layers_of(m), "num_parameters": m.num_parameters(),
           "width": m.config.dim if family == "transformer" else settings["widths"][0],
           "arch": "transformer" if family == "transformer" else settings["arch"],
           "dilation": settings.get("dilation", 1), "head_layers": settings.get("head_layers", 0),
           "same_species": em["exact_match_same_species"], "species": em["exact_match_species"],
           "train_seconds": secs}
    if curve:
        row["curve"] = curve
    return row


def plan_of(args) -> list[tuple[str, int]]:
    """``(family, field)`` of every model, the transformer first."""
    plans = [] if args.no_transformer else [("transformer", IMAGE_SIZE)]
    for family in args.families:
        default = (UNIT_FIELDS if family == "unit" else FIELD_FIELDS if family == "field"
                   else RESNET_FIELDS if args.arch == "resnet" else FIELDS)
        plans += [(family, f) for f in (args.fields or default)]
    return plans


def run(args) -> int:
    plans = plan_of(args)
    families = list(dict.fromkeys(family for family, _ in plans))
    widest = {family: max(f for fam, f in plans if fam == family) for family in families}
    untuned = {family: {"chosen": {"lr": args.lr, "width": 1.0, "depth": 1 if family == "transformer" else 0}}
               for family in families}
    jobs = [(family, field, seed) for family, field in plans for seed in args.seeds]
    if args.jobs == 1:
        sweep = Sweep(args)
        tuning = {family: tune(sweep, family, widest[family]) if args.trials else untuned[family]
                  for family in families}
        rows = [_trained_row(sweep, family, field, tuning[family]["chosen"], seed) for family, field, seed in jobs]
    else:
        with _pool(args.jobs) as pool:
            tuning = dict(untuned)
            if args.trials:
                tuning.update(zip(families, pool.map(call_in_bench, [(__file__, "_tune_job", (args, f, widest[f]))
                                                                     for f in families])))
            rows = list(pool.map(call_in_bench, [(__file__, "_train_job", (args, family, field,
                                                                         tuning[family]["chosen"], seed))
                                                 for family, field, seed in jobs]))
    report(args, rows, tuning)
    return 0


def _trained_row(sweep: Sweep, family: str, field: int, knobs: dict, seed: int) -> dict:
    """Train one model of the plan and answer the test questions: its row of the record (printed as it lands)."""
    m, settings, secs, curve = sweep.train(family, field, knobs, seed, sweep.args.steps, sweep.args.eval_every)
    em = exact_match(m, sweep.test, sweep.spec.words, 12)
    row = row_of(family, field, seed, m, settings, secs, curve, em)
    print(json.dumps({k: v for k, v in row.items() if k != "curve"}), flush=True)
    return row


# -- --jobs N: N worker processes, one thread each, each with its own Sweep (the same data: it is seeded) ----------
_SWEEP: Sweep | None = None


def _pool(jobs: int):
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # spawn, not fork: this process's thread pools do not survive a fork
    return ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))


def _worker_sweep(args) -> Sweep:
    global _SWEEP
    if _SWEEP is None:
        torch.set_num_threads(1)
        _SWEEP = Sweep(args)
    return _SWEEP


def _tune_job(args, family: str, field: int) -> dict:
    return tune(_worker_sweep(args), family, field)


def _train_job(args, family: str, field: int, knobs: dict, seed: int) -> dict:
    return _trained_row(_worker_sweep(args), family, field, knobs, seed)


def _examples(value) -> str:
    return "not reached" if value is None else f"{value:,.0f}"


def _median(values):
    return statistics.median(values) if values else None


def report(args, rows: list[dict], tuning: dict) -> None:
    """Print the tables; write the JSON, the figures and (``--into``) the run's copy."""
    print(f"\ncorner pairs vs receptive field ({args.steps} steps of {args.batch_size}, seeds {args.seeds}; held-out "
          f"test, {args.test_size} questions; chance 50 %; median over seeds)\n")
    print("| model | field (px) | layers | width | params | same species % | species % | train s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["family"], r["receptive_field"]), []).append(r)
    for (family, field), runs in groups.items():
        first = runs[0]
        print(f"| {family} | {field} | {first['layers']} | {first['width']} | {first['num_parameters']} | "
              f"{_median([r['same_species'] for r in runs]):.1f} | {_median([r['species'] for r in runs]):.1f} | "
              f"{_median([r['train_seconds'] for r in runs]):.1f} |")
    result = {"benchmark": "vqa_receptive_field", "seeds": args.seeds, "rows": rows, "tuning": tuning}
    if all("curve" in r for r in rows) and rows:
        summary = summarize(rows)
        result["summary"] = [{"family": fam, "receptive_field": field, **s} for (fam, field), s in summary.items()]
        result["verdicts"] = verdicts({"rows": rows})
        print("\n| model | field (px) | " + " | ".join(f"examples to {lv:g} % (median, interval)" for lv in LEVELS)
              + " |")
        print("| --- | ---: | " + " | ".join("---:" for _ in LEVELS) + " |")
        for (fam, field), s in summary.items():
            cells = [f"{_examples(s[f'examples_to_{lv:g}'])} ({_examples(s[f'examples_to_{lv:g}_interval'][0])} – "
                     f"{_examples(s[f'examples_to_{lv:g}_interval'][1])}, {100 * s['interval_coverage']:.0f} %)"
                     for lv in LEVELS]
            print(f"| {fam} | {field} | " + " | ".join(cells) + " |")
        words = {True: "holds", False: "does not hold", None: "not decided"}
        print("\n" + "\n".join(f"({k}) {words[v['holds']]}: {v['measured']}" for k, v in result["verdicts"].items()))
    out = Path(args.out)
    write(out, result, settings={k: v for k, v in vars(args).items() if k not in ("into", "argv")}, argv=args.argv,
          script="vqa_receptive_field.py", torch=torch.__version__, threads=torch.get_num_threads(),
          load=list(os.getloadavg()))
    plot(rows, out.with_suffix(".png"))
    if all("curve" in r for r in rows) and rows:
        plot_curves(rows, out.with_name(out.stem + "_curves.png"))
    print(f"\nwrote {out} and its figures")
    if args.into:
        into = Path(args.into) / "receptive_field.json"
        into.write_text(out.read_text())
        into.with_suffix(".png").write_bytes(out.with_suffix(".png").read_bytes())
        print(f"wrote {into} (tokennet report {args.into} shows it)")


def plot(rows, path: Path) -> None:
    """Corner pairs against the field: per CNN family, the median over seeds (each seed a dot), the transformer's
    median as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=120)
    cnn = [r for r in rows if r["model"] == "cnn"]
    for k, (family, arch) in enumerate(sorted({(r.get("family", "pooled"), r.get("arch", "plain")) for r in cnn})):
        mine = [r for r in cnn if (r.get("family", "pooled"), r.get("arch", "plain")) == (family, arch)]
        fields = sorted({r["receptive_field"] for r in mine})
        med = [_median([r["same_species"] for r in mine if r["receptive_field"] == f]) for f in fields]
        label = {"unit": "one unit (no pooling)", "field": "strided stages, every unit read"}.get(
            family, f"pooled ({arch}) + coords")
        ax.plot(fields, med, "os^"[k % 3] + "-", color=f"C{[0, 2, 4][k % 3]}", label=f"FiLM CNN, {label}")
        ax.scatter([r["receptive_field"] for r in mine], [r["same_species"] for r in mine], s=8, alpha=0.4,
                   color=f"C{[0, 2, 4][k % 3]}")
    transformer = [r["same_species"] for r in rows if r["model"] == "transformer"]
    if transformer:
        ax.axhline(_median(transformer), color="C1", ls="--", label="transformer")
    ax.axhline(50, color="grey", ls=":", label="chance")
    ax.axvline(48, color="grey", lw=0.6)
    ax.text(48, 52, " 48 px: two corner cells apart", fontsize=7, color="grey")
    ax.set_xlabel("receptive field (pixels)")
    ax.set_ylabel("corner pairs correct (%)")
    ax.set_ylim(40, 101)
    ax.legend(fontsize=7, loc="center right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_curves(rows, path: Path) -> None:
    """Validation exact match on the corner pairs against the training examples seen, one line per model and seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
    models = list(dict.fromkeys((r["family"], r["receptive_field"]) for r in rows))
    for i, model in enumerate(models):
        for k, r in enumerate(r for r in rows if (r["family"], r["receptive_field"]) == model):
            ax.plot([p["examples"] for p in r["curve"]], [p["same_species"] for p in r["curve"]], color=f"C{i % 10}",
                    lw=1, alpha=0.8, label=f"{model[0]}" + (f", {model[1]} px" if model[0] != "transformer" else "")
                    if k == 0 else None)
    for level in LEVELS:
        ax.axhline(level, color="grey", ls="--", lw=0.6)
    ax.axhline(50, color="grey", ls=":", lw=1, label="chance")
    ax.set_xlabel("training examples seen")
    ax.set_ylabel("corner pairs, validation exact match (%)")
    ax.legend(fontsize=6.5)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--curves", action="store_true", help="learning curves and an equal tuning budget: defaults to "
                    "the field family (the recipe's baselines), seeds 0 1 2, 3000 steps evaluated every 250, 4 trials "
                    "of 600 steps per family, --out bench/results/vqa_learning_curves.json")
    ap.add_argument("--family", dest="families", nargs="+", help="CNN families: field (the recipe's baselines: strided "
                    "stages, every unit of the final map read), pooled (global average pooling) and/or unit (strided "
                    "down to one unit); default pooled (with --curves: field)")
    ap.add_argument("--fields", type=int, nargs="+", help="receptive fields in pixels, for every family (default: "
                    f"pooled {' '.join(map(str, FIELDS))}, with --arch resnet {' '.join(map(str, RESNET_FIELDS))}; "
                    f"unit {' '.join(map(str, UNIT_FIELDS))}; field {' '.join(map(str, FIELD_FIELDS))})")
    ap.add_argument("--via", default="depth", help="pooled: depth or dilation (see --arch for the fields each builds)")
    ap.add_argument("--arch", default="plain", help="pooled: plain conv-norm-ReLU layers (depth: 4 + 8n px; "
                    "dilation: 4 + 16d px) or resnet: residual blocks (depth: 4 + 16n px; dilation: 4 + 16d px)")
    ap.add_argument("--readout", default="coords", help="pooled: coords (default) or mean (the plain GAP)")
    ap.add_argument("--transformer", default="tuned", help="tuned (the default here: the model "
                    "vqa_learning_curves.json was "
                    "recorded with) or generic (the lecture's, the recipe's default)")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--test-size", type=int, default=1000)
    ap.add_argument("--val-size", type=int, default=200, help="validation corner questions (tuning, curves)")
    ap.add_argument("--lr", type=float, default=LR, help="peak rate without tuning (and the first trial's)")
    ap.add_argument("--seeds", type=int, nargs="+")
    ap.add_argument("--trials", type=int, help="tuning trials per family (0: none; default 0, with --curves 4)")
    ap.add_argument("--tune-steps", type=int, default=600)
    ap.add_argument("--tune-seed", type=int, default=0, help="the seed of the trial plan (the same for each family)")
    ap.add_argument("--eval-every", type=int, help="steps between evaluations of the curves (0: none; --curves: 250)")
    ap.add_argument("--no-transformer", action="store_true", help="only the CNNs")
    ap.add_argument("--jobs", type=int, default=1, help="train this many models at once, each in its own process "
                    "with one thread (the families' tuning too); 1 (the default): one after the other, here")
    ap.add_argument("--out")
    ap.add_argument("--into", metavar="RUN_DIR", help="also write receptive_field.json and .png into a vqa run "
                    "directory, where its report (tokennet report) shows them")
    args = ap.parse_args(argv)
    args.argv = argv  # the command the JSON records (None: sys.argv)
    curves = args.curves
    defaults = {"families": ["field"] if curves else ["pooled"], "steps": 3000 if curves else 1500,
                "seeds": [0, 1, 2] if curves else [0], "trials": 4 if curves else 0,
                "eval_every": 250 if curves else 0,
                "out": str(ROOT / "bench" / "results" / ("vqa_learning_curves.json" if curves
                                                          else "vqa_receptive_field.json"))}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def check(args) -> None:
    """Every setting, before anything trains or is written (a ConfigError: one line, exit 2)."""
    if args.steps < 1 or args.batch_size < 2 or args.test_size < 2 or args.val_size < 2 or args.tune_steps < 1:
        raise ConfigError("--steps and --tune-steps must be >= 1, --batch-size, --test-size and --val-size >= 2")
    if args.jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {args.jobs}")
    if args.trials < 0 or args.eval_every < 0 or not args.seeds:
        raise ConfigError("--trials and --eval-every must be >= 0, and --seeds name at least one seed")
    if args.readout not in ("coords", "mean"):
        raise ConfigError(f"--readout must be coords or mean, got {args.readout!r}")
    if args.transformer not in TRANSFORMERS:
        raise ConfigError(f"--transformer must be tuned or generic, got {args.transformer!r}")
    for family in args.families:
        if family not in FAMILIES:
            raise ConfigError(f"--family must be field, pooled or unit, got {family!r}")
    for family, field in plan_of(args):
        if family != "transformer":
            check_field(field, family, args.via, args.arch)
    if args.into and not (Path(args.into) / "run.json").is_file():
        raise ConfigError(f"--into {args.into}: not a run directory (no run.json)")


def main(argv=None) -> int:
    args = parse(argv)
    try:
        check(args)
        return run(args)
    except TokennetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
