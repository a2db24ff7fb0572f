"""ViT against a CNN of about the same size as the training set grows (d2l's claim about inductive bias).

d2l (§11.8): a ViT lacks the CNN's locality and translation equivariance, so on small data it loses to a CNN
of the same size, and it wins (or catches up) as data grows. This bench trains both on Fashion-MNIST
subsets of increasing size — the same steps, batch size, learning-rate schedule, augmentation (1-pixel
translation, horizontal flip) and seed for each — and tests each on the full 10,000-image test set:

- **ViT**: a plain patchify ViT (``patch_embed=conv``: one linear map per 4×4 patch, 7×7 = 49 tokens,
  ``--vit-dim`` wide, ``--vit-layers`` deep, mean pooling) — no convolution anywhere but the patch projection;
- **CNN**: tokennet's small ResNet (``cnn`` family, ``--cnn-widths``; a stride-2 3×3 stem, then one basic block
  per stage, each later stage halving the grid), GAP + linear.

It prints a markdown table (test accuracy per size, the difference, where the curves cross) and writes
``bench/results/vit_vs_cnn.json`` and ``bench/results/vit_vs_cnn.png``. Timings are per run and depend on the
machine's load; the accuracies do not (a fixed step budget).

Usage::

    python bench/vit_vs_cnn.py                                  # sizes 500 2000 8000 30000 60000, 1500 steps
    python bench/vit_vs_cnn.py --sizes 1000 60000 --steps 300   # a quick look
    python bench/vit_vs_cnn.py --seeds 0 1 2                    # medians over seeds

Needs Fashion-MNIST (``apt-get install dataset-fashion-mnist``, or ``--fashion-dir DIR``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tokennet.data.augment import Augment  # noqa: E402
from tokennet.data.vision_data import VisionData, load_fashion_mnist  # noqa: E402
from tokennet.errors import DataError  # noqa: E402
from tokennet.recipes.cnn import fit_classifier  # noqa: E402


def subset(ds: VisionData, n: int, seed: int) -> VisionData:
    """The first ``n`` of a seeded permutation of the training set (the test set unchanged)."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(len(ds.y_train), generator=g)[:n]
    return VisionData(ds.name, ds.x_train[idx], ds.y_train[idx], ds.x_test, ds.y_test, ds.classes, ds.source)


def crossing(sizes: list[int], diff: list[float]) -> str:
    """Where ViT − CNN changes sign (linear in log size between the two sizes), or that it does not."""
    import math

    for (n0, d0), (n1, d1) in zip(zip(sizes, diff), zip(sizes[1:], diff[1:])):
        if d0 == 0:
            return f"equal at {n0}"
        if d0 * d1 < 0:
            t = d0 / (d0 - d1)
            n = math.exp(math.log(n0) + t * (math.log(n1) - math.log(n0)))
            return f"the curves cross between {n0} and {n1} training images (≈ {n:,.0f}, log-linear)"
    lead = "CNN" if diff[-1] < 0 else "ViT"
    return f"no crossing on {sizes[0]:,}–{sizes[-1]:,} images: the {lead} is ahead at every size"


def plot(path: Path, sizes, vit, cnn, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot(sizes, [100 * v for v in vit], "o-", label="ViT (patchify, 4×4 patches)")
    ax.plot(sizes, [100 * v for v in cnn], "s-", label="CNN (small ResNet)")
    ax.set_xscale("log")
    ax.set_xlabel("training images (Fashion-MNIST subset)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[500, 2000, 8000, 30000, 60000])
    ap.add_argument("--steps", type=int, default=1500, help="optimizer steps per run (both models)")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--vit-dim", type=int, default=64)
    ap.add_argument("--vit-layers", type=int, default=4)
    ap.add_argument("--cnn-widths", type=int, nargs="+", default=[24, 48, 96])
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--fashion-dir", default=None)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "vit_vs_cnn.json"))
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        full = load_fashion_mnist(args.fashion_dir)
    except DataError as e:
        print(f"vit_vs_cnn: {e}", file=sys.stderr)
        return 2
    aug = Augment(translate=1, flip=True)
    models = {
        "vit": {"preset": "vit", "image_size": 28, "patch_size": 4, "patch_embed": "conv", "dim": args.vit_dim,
                "num_layers": args.vit_layers, "num_heads": 4, "mlp_ratio": 2.0, "pool": "mean"},
        "cnn": {"preset": "cnn", "widths": args.cnn_widths, "depths": [1] * len(args.cnn_widths), "stem_stride": 2},
    }
    rows, load = [], [os.getloadavg()]
    for n in args.sizes:
        row = {"train_size": n}
        for name, cfg in models.items():
            accs, secs = [], []
            for seed in args.seeds:
                data = subset(full, min(n, len(full.y_train)), seed)
                t0 = time.perf_counter()
                r = fit_classifier(data, steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=seed,
                                   augment=aug, **cfg)
                secs.append(time.perf_counter() - t0)
                accs.append(r["test_accuracy"])
                row[f"{name}_parameters"] = r["parameters"]
                print(f"  {name} n={n} seed={seed}: {100 * accs[-1]:.2f}% ({secs[-1]:.0f} s)", file=sys.stderr)
            row[name] = statistics.median(accs)
            row[f"{name}_all"] = accs
            row[f"{name}_seconds"] = round(statistics.median(secs), 1)
        rows.append(row)
        load.append(os.getloadavg())
    sizes = [r["train_size"] for r in rows]
    diff = [r["vit"] - r["cnn"] for r in rows]
    verdict = crossing(sizes, diff)
    print(f"\nFashion-MNIST, {args.steps} steps of batch {args.batch_size} each, seeds {args.seeds} (median); "
          f"ViT {rows[0]['vit_parameters']:,} parameters, CNN {rows[0]['cnn_parameters']:,}\n")
    print("| training images | ViT test acc. | CNN test acc. | ViT − CNN | ViT s | CNN s |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for r, d in zip(rows, diff):
        print(f"| {r['train_size']:,} | {100 * r['vit']:.2f}% | {100 * r['cnn']:.2f}% | {100 * d:+.2f} | "
              f"{r['vit_seconds']} | {r['cnn_seconds']} |")
    print(f"\n{verdict}.")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"rows": rows, "verdict": verdict, "steps": args.steps, "batch_size": args.batch_size, "lr": args.lr,
              "seeds": args.seeds, "models": models, "load_average": load, "threads": torch.get_num_threads(),
              "machine": platform.platform(), "torch": torch.__version__}
    out.write_text(json.dumps(result, indent=2) + "\n")
    plot(out.with_suffix(".png"), sizes, [r["vit"] for r in rows], [r["cnn"] for r in rows],
         f"Fashion-MNIST: ViT vs CNN, {args.steps} steps each — {verdict}")
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
