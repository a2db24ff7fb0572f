"""ViT against a CNN of about the same size as the training set grows, each trained to convergence (d2l §11.8).

d2l: a ViT lacks the CNN's locality and translation equivariance, so on small data it loses to a CNN of
about the same size, and it wins (or catches up) as data grows. This bench trains both on seeded subsets of
a training set, sizes up to the whole of it, and tests each on the full test set. Every run aims at
convergence, not a fixed budget (the first version of this bench stopped the ViT at 500 steps):

- the step budget scales with the data: ``--epochs`` passes over the subset (at least ``--min-steps``,
  at most ``--max-steps``), warm-up then cosine decay over that budget;
- early stopping on a validation split held out of the training set before any subset is drawn
  (``--val-size`` images, the same for every size): validation accuracy every ``--eval-every-epochs`` epochs
  (and at most 20 times a run, so patience is never shorter than a quarter of the budget), stop after
  ``--patience`` evaluations without improvement, and test the best weights.

``--budget-check N`` then trains size N again with twice the epochs, to see whether the budget was enough
(on digits, 150 epochs in [400, 4000] steps were not for the ViT; the defaults, 600 epochs in [2000, 10000]
steps, are: twice them do not raise it — see the ``claim`` in ``bench/results/vit_vs_cnn.json``). Each row records the
steps run, the step of the best validation accuracy and whether the run stopped early (patience exhausted)
or ran its whole budget. Same batch size, learning rate, weight decay, augmentation
(1-pixel translation; flip only for clothes) and seeds for both models:

- **ViT**: a plain patchify ViT (``patch_embed=conv``: one linear map per non-overlapping patch —
  2×2 on 8×8 digits, 16 tokens; 4×4 on 28×28 images, 49 tokens), ``--vit-dim`` wide, ``--vit-layers``
  deep, mean pooling — no convolution anywhere but the patch projection;
- **CNN**: tokennet's small ResNet (``cnn`` family, ``--cnn-widths``; a 3×3 stem, then one basic block per
  stage, each later stage halving the grid), GAP + linear.

Data (all offline): ``--data digits`` (default: scikit-learn's 8×8 digits, 898 training images of which
``--val-size`` validate, 899 test — the sweep a 2-core machine trains to convergence in minutes),
``fashion-mnist`` (Debian's ``dataset-fashion-mnist`` or ``--fashion-dir``; 60,000 images: hours on 2 cores).

It prints a markdown table (test accuracy per size, the difference, where the curves cross) and writes
``bench/results/vit_vs_cnn.json`` (with the ``claim`` object ``tokennet demo claims`` reads) and
``bench/results/vit_vs_cnn.png``. Seconds depend on the machine's load; the accuracies do not.

Usage::

    python bench/vit_vs_cnn.py                                   # digits, sizes 50 … 698 (all), seeds 0 1
    python bench/vit_vs_cnn.py --sizes 100 698 --seeds 0         # a quick look
    python bench/vit_vs_cnn.py --budget-check 200                # + size 200 again with twice the epochs
    python bench/vit_vs_cnn.py --data fashion-mnist --sizes 500 2000 8000 --val-size 5000

The sweep's functions (:func:`step_budget`, :func:`fit_to_convergence`, :func:`sweep`, :func:`claim`) are
what ``tests/bench/test_vit_vs_cnn.py`` calls.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tokennet.data.augment import Augment  # noqa: E402
from tokennet.data.image_batches import ImageBatches, evaluate_classifier  # noqa: E402
from tokennet.data.vision_data import VisionData, load_digits, load_fashion_mnist  # noqa: E402
from tokennet.errors import DataError  # noqa: E402
from tokennet.models.registry import create_model  # noqa: E402

DATASETS = ("digits", "fashion-mnist")


sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/_record.py, also when a test loads this file
from _record import commit, machine  # noqa: E402


def split_validation(ds: VisionData, n_val: int, seed: int = 1000) -> tuple[VisionData, torch.Tensor, torch.Tensor]:
    """Hold ``n_val`` seeded training images out for early stopping; returns ``(pool, x_val, y_val)``.

    The pool (the rest of the training set, the test set unchanged) is what the subsets are drawn from.
    """
    if not 0 < n_val < len(ds.y_train):
        raise DataError(f"--val-size {n_val} must be between 1 and {len(ds.y_train) - 1} (the training set's size − 1)")
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(len(ds.y_train), generator=g)
    val, rest = idx[:n_val], idx[n_val:]
    pool = VisionData(ds.name, ds.x_train[rest], ds.y_train[rest], ds.x_test, ds.y_test, ds.classes, ds.source)
    return pool, ds.x_train[val], ds.y_train[val]


def subset(ds: VisionData, n: int, seed: int) -> VisionData:
    """The first ``n`` of a seeded permutation of the training set (the test set unchanged)."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(len(ds.y_train), generator=g)[:n]
    return VisionData(ds.name, ds.x_train[idx], ds.y_train[idx], ds.x_test, ds.y_test, ds.classes, ds.source)


def step_budget(n: int, batch_size: int, *, epochs: float, min_steps: int, max_steps: int) -> int:
    """Steps for ``epochs`` passes over ``n`` images in batches of ``min(batch_size, n)``, clamped to
    ``[min_steps, max_steps]``: the budget grows with the data."""
    per_epoch = max(1, n // min(batch_size, n))  # ImageBatches drops the last partial batch
    return int(min(max_steps, max(min_steps, math.ceil(epochs * per_epoch))))


def fit_to_convergence(data: VisionData, x_val: torch.Tensor, y_val: torch.Tensor, *, model: dict, max_steps: int,
                       eval_every: int, patience: int, batch_size: int = 64, lr: float = 2e-3,
                       weight_decay: float = 0.05, seed: int = 0, augment: Augment | None = None) -> dict:
    """Train ``model`` (a preset and its config fields) on ``data``'s training split with early stopping.

    AdamW, linear warm-up over the first 5% of ``max_steps`` then cosine decay to 0 at ``max_steps``; every
    ``eval_every`` steps the validation accuracy; stop after ``patience`` evaluations without a better one
    (or at ``max_steps``); the best weights are tested.

    Returns:
        ``test_accuracy`` (in [0, 1]) of the best weights, ``val_accuracy`` (best), ``steps`` run,
        ``best_step``, ``stopped_early`` (patience ran out before the budget), ``max_steps``, ``parameters``,
        ``seconds``.
    """
    torch.manual_seed(seed)
    cfg = {k: v for k, v in model.items() if k != "preset"}
    m = create_model(model["preset"], image_size=data.image_size, in_channels=data.in_channels,
                     num_classes=data.num_classes, **cfg)
    src = ImageBatches(data.x_train, data.y_train, min(batch_size, len(data.y_train)), seed=seed, augment=augment)
    opt = torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=weight_decay)
    warm = max(1, max_steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / max_steps))))
    best, best_step, best_state, bad, step = -1.0, 0, None, 0, 0
    t0 = time.perf_counter()
    while step < max_steps:
        m.train()
        x, y = src.batch(step)
        loss = m(x, y).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        if step % eval_every == 0 or step == max_steps:
            m.eval()
            acc = evaluate_classifier(m, x_val, y_val)["test_accuracy"]
            if acc > best:
                best, best_step, best_state, bad = acc, step, copy.deepcopy(m.state_dict()), 0
            else:
                bad += 1
                if bad >= patience:
                    break
    secs = time.perf_counter() - t0
    m.load_state_dict(best_state)
    m.eval()
    test = evaluate_classifier(m, data.x_test, data.y_test)["test_accuracy"]
    return {"test_accuracy": test, "val_accuracy": best, "steps": step, "best_step": best_step,
            "stopped_early": step < max_steps, "max_steps": max_steps,
            "parameters": sum(p.numel() for p in m.parameters()), "seconds": round(secs, 1)}


def model_configs(data: VisionData, *, vit_dim: int = 64, vit_layers: int = 4, cnn_widths=(24, 48, 96)) -> dict:
    """The two models for this data: a plain patchify ViT and a small ResNet of about the same size."""
    small = data.image_size <= 8
    vit = {"preset": "vit", "patch_size": 2 if small else 4, "patch_embed": "conv", "dim": vit_dim,
           "num_layers": vit_layers, "num_heads": 4, "mlp_ratio": 2.0, "pool": "mean"}
    cnn = {"preset": "cnn", "widths": list(cnn_widths), "depths": [1] * len(cnn_widths),
           "stem_stride": 1 if small else 2}
    return {"vit": vit, "cnn": cnn}


def sweep(pool: VisionData, x_val, y_val, *, sizes: list[int], models: dict, seeds: list[int], batch_size: int,
          lr: float, epochs: float, min_steps: int, max_steps: int, eval_every_epochs: float, patience: int,
          augment: Augment | None, log=print) -> list[dict]:
    """One row per size: per model the median test accuracy over ``seeds`` and every run's record."""
    rows = []
    for n in sizes:
        n = min(n, len(pool.y_train))
        budget = step_budget(n, batch_size, epochs=epochs, min_steps=min_steps, max_steps=max_steps)
        per_epoch = max(1, n // min(batch_size, n))
        every = max(1, round(eval_every_epochs * per_epoch), budget // 20)  # at most 20 evaluations a run
        row = {"train_size": n, "max_steps": budget, "eval_every": every}
        for name, cfg in models.items():
            runs = []
            for seed in seeds:
                r = fit_to_convergence(subset(pool, n, seed), x_val, y_val, model=cfg, max_steps=budget,
                                       eval_every=every, patience=patience, batch_size=batch_size, lr=lr,
                                       seed=seed, augment=augment)
                runs.append(r)
                log(f"  {name} n={n} seed={seed}: test {100 * r['test_accuracy']:.2f}%, val "
                    f"{100 * r['val_accuracy']:.2f}%, {r['steps']}/{budget} steps (best {r['best_step']}, "
                    f"{'stopped early' if r['stopped_early'] else 'whole budget'}), {r['seconds']} s")
            row[name] = statistics.median(r["test_accuracy"] for r in runs)
            row[f"{name}_parameters"] = runs[0]["parameters"]
            row[f"{name}_runs"] = runs
        rows.append(row)
    return rows


def crossing(sizes: list[int], diff: list[float]) -> str:
    """Where ViT − CNN changes sign (linear in log size between the two sizes), or that it does not."""
    for (n0, d0), (n1, d1) in zip(zip(sizes, diff), zip(sizes[1:], diff[1:])):
        if d0 == 0:
            return f"equal at {n0}"
        if d0 * d1 < 0:
            t = d0 / (d0 - d1)
            n = math.exp(math.log(n0) + t * (math.log(n1) - math.log(n0)))
            return f"the curves cross between {n0:,} and {n1:,} training images (≈ {n:,.0f}, log-linear)"
    if diff[-1] == 0:
        return f"equal at {sizes[-1]:,}"
    lead = "CNN" if diff[-1] < 0 else "ViT"
    return f"no crossing on {sizes[0]:,}–{sizes[-1]:,} images: the {lead} is ahead at every size"


def claim(rows: list[dict], dataset: str, budget_check: dict | None = None) -> dict:
    """The verdict on "the CNN wins on small data, the ViT catches up as data grows".

    ``holds``: True when the CNN leads at the smallest size and the curves cross (or meet) by the largest;
    False when the CNN's lead does not shrink (or the ViT already leads at the smallest size); None when
    the lead shrinks but the curves do not cross on these sizes (not decided by what this machine trains).

    ``budget_check`` (a row of :func:`sweep` at one of the sizes, trained with a larger step budget, and its
    ``epochs``): when it raises the ViT by more than 2 points the ViT curve is budget-limited, the measured
    line says so, and a "no crossing" can only be None (not decided), never False.
    """
    sizes = [r["train_size"] for r in rows]
    diff = [r["vit"] - r["cnn"] for r in rows]
    verdict = crossing(sizes, diff)
    if diff[0] >= 0:
        holds = False
    elif any(d >= 0 for d in diff[1:]):
        holds = True
    else:
        holds = None if -diff[-1] < -diff[0] else False
    measured = (f"{dataset} test accuracy at {sizes[0]:,} images: ViT {100 * rows[0]['vit']:.1f}%, CNN "
                f"{100 * rows[0]['cnn']:.1f}%; at {sizes[-1]:,}: ViT {100 * rows[-1]['vit']:.1f}%, CNN "
                f"{100 * rows[-1]['cnn']:.1f}% — {verdict}")
    whole = [r["train_size"] for r in rows if r.get("vit_runs") and not any(x["stopped_early"] for x in r["vit_runs"])]
    if whole:
        measured += f"; the ViT ran its whole step budget at {len(whole)} of {len(rows)} sizes"
    out = {"holds": holds, "measured": measured, "verdict": verdict, "vit_whole_budget_at": whole}
    if budget_check is not None:
        base = next((r for r in rows if r["train_size"] == budget_check["train_size"]), None)
        if base is not None:
            gain = budget_check["vit"] - base["vit"]
            out["vit_budget_gain"] = round(gain, 4)
            if gain > 0.02:
                measured += (f"; budget-limited: at {base['train_size']:,} images {budget_check['epochs']:g} epochs "
                             f"instead of {budget_check['base_epochs']:g} raise the ViT from {100 * base['vit']:.1f}% "
                             f"to {100 * budget_check['vit']:.1f}% (CNN {100 * base['cnn']:.1f}% → "
                             f"{100 * budget_check['cnn']:.1f}%)")
                if holds is False and diff[0] < 0:
                    holds = None
            else:
                measured += (f"; converged: at {base['train_size']:,} images {budget_check['epochs']:g} epochs "
                             f"instead of {budget_check['base_epochs']:g} leave the ViT at "
                             f"{100 * budget_check['vit']:.1f}% (from {100 * base['vit']:.1f}%; CNN "
                             f"{100 * base['cnn']:.1f}% → {100 * budget_check['cnn']:.1f}%)")
        out.update(holds=holds, measured=measured)
    return out


def plot(path: Path, rows: list[dict], title: str, dataset: str, budget_check: dict | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [r["train_size"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, mark, label in (("vit", "o-", "ViT (patchify)"), ("cnn", "s-", "CNN (small ResNet)")):
        ax.plot(sizes, [100 * r[name] for r in rows], mark, label=label)
        runs = [(r["train_size"], 100 * x["test_accuracy"]) for r in rows for x in r[f"{name}_runs"]]
        ax.scatter(*zip(*runs), s=8, alpha=0.4, color=ax.lines[-1].get_color())
    if budget_check is not None:
        for name, mark in (("vit", "o"), ("cnn", "s")):
            ax.scatter([budget_check["train_size"]], [100 * budget_check[name]], s=60, marker=mark,
                       facecolors="none", edgecolors="k", label=f"{name.upper()}, {budget_check['epochs']:g} epochs")
    ax.set_xscale("log")
    ax.set_xlabel(f"training images ({dataset} subset; early stopping on a held-out validation split)")
    ax.set_ylabel("test accuracy (%) — median, dots: seeds")
    ax.set_title(title, fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", choices=DATASETS, default="digits")
    ap.add_argument("--sizes", type=int, nargs="+", default=None,
                    help="training-subset sizes (default digits: 50 100 200 400 and the whole pool)")
    ap.add_argument("--val-size", type=int, default=200, help="training images held out for early stopping")
    ap.add_argument("--epochs", type=float, default=600, help="step budget: this many passes over the subset")
    ap.add_argument("--min-steps", type=int, default=2000)
    ap.add_argument("--max-steps", type=int, default=10000)
    ap.add_argument("--eval-every-epochs", type=float, default=5.0, help="validation every this many epochs")
    ap.add_argument("--patience", type=int, default=5, help="evaluations without improvement before stopping")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--vit-dim", type=int, default=64)
    ap.add_argument("--vit-layers", type=int, default=4)
    ap.add_argument("--cnn-widths", type=int, nargs="+", default=[24, 48, 96])
    ap.add_argument("--budget-check", type=int, default=None, metavar="N",
                    help="after the sweep, train size N again with twice the epochs: is the ViT budget-limited?")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--fashion-dir", default=None)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "vit_vs_cnn.json"))
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    sys.stdout.reconfigure(line_buffering=True)
    try:
        full = load_digits() if args.data == "digits" else load_fashion_mnist(args.fashion_dir)
        pool, x_val, y_val = split_validation(full, args.val_size)
    except DataError as e:
        print(f"vit_vs_cnn: {e}", file=sys.stderr)
        return 2
    sizes = args.sizes or ([50, 100, 200, 400, len(pool.y_train)] if args.data == "digits"
                           else [500, 2000, 8000, 30000, len(pool.y_train)])
    sizes = sorted({min(n, len(pool.y_train)) for n in sizes})
    if sizes[0] < 10:
        print("vit_vs_cnn: sizes must be ≥ 10 images", file=sys.stderr)
        return 2
    aug = Augment(translate=1, flip=args.data == "fashion-mnist")
    models = model_configs(full, vit_dim=args.vit_dim, vit_layers=args.vit_layers, cnn_widths=args.cnn_widths)
    load, t0 = [os.getloadavg()], time.perf_counter()
    rows = sweep(pool, x_val, y_val, sizes=sizes, models=models, seeds=args.seeds, batch_size=args.batch_size,
                 lr=args.lr, epochs=args.epochs, min_steps=args.min_steps, max_steps=args.max_steps,
                 eval_every_epochs=args.eval_every_epochs, patience=args.patience, augment=aug,
                 log=lambda s: print(s, file=sys.stderr, flush=True))
    check = None
    if args.budget_check:
        n = min(args.budget_check, len(pool.y_train))
        check = sweep(pool, x_val, y_val, sizes=[n], models=models, seeds=args.seeds, batch_size=args.batch_size,
                      lr=args.lr, epochs=2 * args.epochs, min_steps=2 * args.min_steps, max_steps=2 * args.max_steps,
                      eval_every_epochs=args.eval_every_epochs, patience=args.patience, augment=aug,
                      log=lambda s: print(s, file=sys.stderr, flush=True))[0]
        check.update(epochs=2 * args.epochs, base_epochs=args.epochs)
    load.append(os.getloadavg())
    c = claim(rows, args.data, check)
    run = (f"{args.data}: subsets of {sizes[0]:,}–{sizes[-1]:,} training images ({args.val_size} more validate), "
           f"each model trained for a step budget scaled with the data ({args.epochs:g} epochs in "
           f"[{args.min_steps}, {args.max_steps}] steps) with early stopping (patience {args.patience}), "
           f"seeds {args.seeds} (median), "
           f"tested on {len(full.y_test):,} images")
    print(f"\n{run}; ViT {rows[0]['vit_parameters']:,} parameters, CNN {rows[0]['cnn_parameters']:,}\n")
    print("| training images | step budget | ViT test acc. | ViT steps (best) | CNN test acc. | CNN steps (best) "
          "| ViT − CNN |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        st = {k: "/".join(f"{x['steps']}({x['best_step']})" for x in r[f"{k}_runs"]) for k in models}
        print(f"| {r['train_size']:,} | {r['max_steps']} | {100 * r['vit']:.2f}% | {st['vit']} | "
              f"{100 * r['cnn']:.2f}% | {st['cnn']} | {100 * (r['vit'] - r['cnn']):+.2f} |")
    print(f"\n{c['verdict']}.")
    mach, com = machine(), commit()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": "vit_vs_cnn",
              "claim": {"holds": c["holds"], "measured": c["measured"], "run": run},
              "command": " ".join(["python", "bench/vit_vs_cnn.py", *(sys.argv[1:] if argv is None else argv)]),
              "commit": com, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": {**mach, "threads": torch.get_num_threads(), "torch": torch.__version__,
                          "load_average": load, "wall_seconds": round(time.perf_counter() - t0, 1)},
              "verdict": c["verdict"],
              "settings": {"data": args.data, "sizes": sizes, "val_size": args.val_size, "epochs": args.epochs,
                           "min_steps": args.min_steps, "max_steps": args.max_steps,
                           "eval_every_epochs": args.eval_every_epochs, "patience": args.patience,
                           "batch_size": args.batch_size, "lr": args.lr, "seeds": args.seeds,
                           "augment": {"translate": 1, "flip": aug.flip}},
              "models": models, "rows": rows, "budget_check": check}
    out.write_text(json.dumps(result, indent=2) + "\n")
    plot(out.with_suffix(".png"), rows, f"{args.data}: ViT vs CNN, step budget ∝ data + early stopping\n{c['verdict']}",
         args.data, check)
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
