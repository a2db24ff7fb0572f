"""Spheres: an accurate rotation-invariant model, each change measured (NR/NR, R/R, NR/R).

The ``sphere`` recipe's data (images projected onto the northern hemisphere, extent 0.7; the last
``val_size`` training images held out; the test images unrotated and under the recipe's fixed rotations)
and training settings (AdamW lr 2e-3, 40 warm-up steps, weight decay 0.05, batch 32), every model trained
unrotated (NR) and under a fresh uniform rotation per image and step (R) for the same steps from the same
seed. Rows (``--rows``):

- ``planar``: a ViT on the lat/lon grid (the recipe's baseline); ``sh``: absolute SH positions, ordered
  patches — neither is invariant;
- ``today``: the recipe's invariant model (angle bias + centroid angle, zonal moduli);
- ``frame``: + SH positions of the centres in the signal's own frame (centroid + principal axis, averaged
  over the frame's half-turn), zonal moduli;
- ``frame-oriented``: + the zonal coefficients oriented by that frame (``descriptor=zonal-frame``);
- ``frame-oriented-fine``: the same on a finer grid (400 centres on 4,096 samples).

Prints test accuracy per regime, the parameter count and the training CPU seconds (``time.process_time``,
one thread: far less sensitive to a shared machine than the wall clock, which is also printed), and writes
``bench/results/sphere_invariant.json`` (rows measured before with another row, seed, step count or data stay in
it). ``--data fashion-mnist`` uses the recipe's Fashion-MNIST profile
(400 centres, 6,400 samples, 1,000 validation and 2,000 test images, a 24 × 48 lat/lon grid).

    python bench/sphere_invariant.py                                  # digits, 400 steps, seed 0
    python bench/sphere_invariant.py --rows today frame-oriented --steps 1200 --seeds 0 1 2
    python bench/sphere_invariant.py --data fashion-mnist --rows frame-oriented --steps 1500
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tokennet.data.sphere import SphereImages, equirectangular_points, projected_set  # noqa: E402
from tokennet.data.vision_data import load_dataset  # noqa: E402
from tokennet.models.registry import create_model  # noqa: E402
from tokennet.train.trainer import TrainConfig, Trainer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/_record.py, also when a test loads this file
from _record import write  # noqa: E402

TEST_SEED = 7919  # the recipe's fixed test rotations
EXTENT = 0.7
# row → (description, sphere-model overrides or None for the planar ViT)
ROWS = {
    "planar": ("planar ViT on the lat/lon grid", None),
    "sh": ("sphere, absolute SH positions, ordered patches", {"position": "sh", "descriptor": "ordered"}),
    "today": ("invariant today: angle bias + centroid, zonal moduli",
              {"position": "angle-bias+centroid", "descriptor": "zonal"}),
    "frame": ("+ SH positions in the signal's frame (zonal moduli)", {"position": "frame", "descriptor": "zonal"}),
    "frame-oriented": ("+ zonal coefficients oriented by the frame", {"position": "frame",
                                                                      "descriptor": "zonal-frame"}),
    "frame-oriented-fine": ("+ finer grid: 400 centres, 4,096 samples", {"position": "frame",
                                                                        "descriptor": "zonal-frame",
                                                                        "num_centres": 400, "num_samples": 4096}),
}
PROFILES = {
    "digits": {"val_size": 100, "test_size": 0, "grid": (16, 32), "model": {}},
    "fashion-mnist": {"val_size": 1000, "test_size": 2000, "grid": (24, 48),
                      "model": {"num_centres": 400, "num_samples": 6400, "patch_size": 24, "rings": 4}},
}


@torch.no_grad()
def accuracy(model, x, y) -> float:
    model.eval()
    pred = torch.cat([model(x[i:i + 256]).logits.argmax(-1) for i in range(0, len(x), 256)])
    return float((pred == y).float().mean())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", nargs="*", default=list(ROWS), choices=list(ROWS))
    p.add_argument("--data", default="digits", choices=list(PROFILES))
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--seeds", type=int, nargs="*", default=[0])
    p.add_argument("--regimes", nargs="*", default=["NR", "R"], choices=["NR", "R"])
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "sphere_invariant.json"))
    args = p.parse_args()
    torch.set_num_threads(1)
    prof = PROFILES[args.data]
    vd = load_dataset(args.data)
    n_val = prof["val_size"]
    xtr, ytr = vd.x_train[:-n_val], vd.y_train[:-n_val]
    n_test = prof["test_size"] or len(vd.y_test)
    xte, yte = vd.x_test[:n_test], vd.y_test[:n_test]
    hw = prof["grid"]
    results = []
    print(f"\n{args.data}: {len(ytr)} train / {len(yte)} test images, {args.steps} steps × 32, seeds {args.seeds}\n")
    print("| row | model | seed | NR/NR | R/R | NR/R | parameters | CPU s (NR) |\n| --- | --- | --- | --- | --- | --- "
          "| --- | --- |", flush=True)
    for seed in args.seeds:
        for row in args.rows:
            desc, over = ROWS[row]
            out = {"row": row, "model": desc, "seed": seed, "steps": args.steps, "data": args.data}
            for regime in args.regimes:
                torch.manual_seed(seed)
                if over is None:
                    points, shape = equirectangular_points(*hw), (vd.in_channels, *hw)
                    m = create_model("vit-micro", image_size=list(hw), patch_size=4, in_channels=vd.in_channels,
                                     num_classes=vd.num_classes, dim=48, num_layers=2, num_heads=4, mlp_ratio=2.0,
                                     pool="mean")
                else:
                    m = create_model("sphere-small", **{**prof["model"], **over, "num_classes": vd.num_classes,
                                                        "in_channels": vd.in_channels})
                    points, shape = m.samples, None
                src = SphereImages(xtr, ytr, points, 32, seed=seed, rotate=regime == "R", extent=EXTENT, shape=shape)
                cfg = TrainConfig(max_iters=args.steps, batch_size=32, lr=2e-3, warmup_iters=40, weight_decay=0.05,
                                  eval_interval=0, checkpoint_interval=0, log_interval=0, progress=False, report=False,
                                  seed=seed)
                c0, w0 = time.process_time(), time.perf_counter()
                with tempfile.TemporaryDirectory() as scratch:
                    Trainer(m, cfg, src, out_dir=scratch).fit()
                out[f"cpu_s_{regime}"] = round(time.process_time() - c0, 1)
                out[f"wall_s_{regime}_shared_machine"] = round(time.perf_counter() - w0, 1)
                nr = projected_set(xte, points, rotate=False, seed=TEST_SEED, extent=EXTENT)
                r = projected_set(xte, points, rotate=True, seed=TEST_SEED, extent=EXTENT)
                if shape is not None:
                    nr, r = nr.reshape(len(nr), *shape), r.reshape(len(r), *shape)
                if regime == "NR":
                    out["NR/NR"], out["NR/R"] = accuracy(m, nr, yte), accuracy(m, r, yte)
                else:
                    out["R/R"] = accuracy(m, r, yte)
                out["parameters"] = sum(q.numel() for q in m.parameters())
            results.append(out)
            cells = " | ".join(f"{100 * out[k]:.1f}" if k in out else "–" for k in ("NR/NR", "R/R", "NR/R"))
            print(f"| {row} | {desc} | {seed} | {cells} | {out['parameters']:,} | {out.get('cpu_s_NR', '–')} |",
                  flush=True)
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    key = lambda r: (r["row"], r["seed"], r["steps"], r["data"])  # noqa: E731
    if out_path.exists():  # rows measured before (other rows, seeds, steps or data) stay in the file
        new = {key(r) for r in results}
        results = [r for r in json.loads(out_path.read_text())["results"] if key(r) not in new] + results
    write(out_path, {"results": results, "torch": torch.__version__}, settings=vars(args), torch=torch.__version__)
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
