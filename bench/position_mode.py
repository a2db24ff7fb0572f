"""Claim 6, *positions may be concatenated instead of added*: a ViT on scikit-learn's digits, three ways.

Every row is the ``vit-digits`` model (overlapping 4×4 patches at stride 2: 9 tokens, mean pooling, D = 64) with
``--layers`` blocks, trained the same way (AdamW lr 2e-3, weight decay 0.05, batch 64, ``--steps`` steps, the same
batches from the same seed) and tested on the recipe's 899 held-out digits:

- ``add``: learned positions added, ``z = x E + E_pos`` (ViT);
- ``concat``: tokens embedded at ``D − pos_dim``, learned positions concatenated, ``z = [x E ; E_pos]``;
- ``none``: no positions (mean pooling of the tokens is then permutation invariant: a bag of patches);
- ``fourier``: 2-D sin-cos positions added instead of learned ones (the lecture's "Fourier positional encoding";
  the toy comparison of the kinds is claim 12, ``tokennet demo claims --only fourier-positions``);
- ``add, W_v = I``: added positions with ``value_proj=false`` (claim 5), for comparison.

Accuracies at a fixed step count do not depend on the machine's load (the wall time does). Writes
``bench/results/position_mode.json`` with the command, the commit and the machine.

    nice -n 5 python bench/position_mode.py                 # 300 steps, seeds 0 1
    python bench/position_mode.py --steps 1500 --seeds 0 1 2 --pos-dim 16
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tokennet.data.vision_data import load_dataset  # noqa: E402
from tokennet.models import create_model  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/_record.py, also when a test loads this file
from _record import write  # noqa: E402

ROWS = {
    "add": dict(),
    "concat": dict(position_mode="concat"),
    "none": dict(position="none"),
    "fourier": dict(position="fourier"),
    "add, W_v = I": dict(value_proj=False),
}


def run(row: str, seed: int, args, data) -> dict:
    kw = dict(ROWS[row])
    if kw.get("position_mode") == "concat":
        kw["pos_dim"] = args.pos_dim
    torch.manual_seed(seed)
    model = create_model("vit-digits", num_layers=args.layers, **kw)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
    g = torch.Generator().manual_seed(seed)
    n = data.x_train.shape[0]
    t0 = time.perf_counter()
    model.train()
    for _ in range(args.steps):
        idx = torch.randint(n, (64,), generator=g)
        loss = model(data.x_train[idx], data.y_train[idx]).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        pred = model(data.x_test).logits.argmax(-1)
    return {"row": row, "seed": seed, "settings": kw, "test_accuracy": float((pred == data.y_test).float().mean()),
            "final_train_loss": loss.item(), "parameters": sum(p.numel() for p in model.parameters()),
            "wall_s": round(time.perf_counter() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--pos-dim", type=int, default=16)
    ap.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    ap.add_argument("--results", default=str(ROOT / "bench" / "results" / "position_mode.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    data = load_dataset("digits")
    runs = [run(r, s, args, data) for r in args.rows for s in args.seeds]
    print(f"ViT on digits, {args.layers} layers × 64, {args.steps} steps, seeds {args.seeds}, pos_dim {args.pos_dim}\n")
    print("| positions | test accuracy (mean) | per seed | parameters |")
    print("| --- | --- | --- | --- |")
    summary = {}
    for r in args.rows:
        accs = [x["test_accuracy"] for x in runs if x["row"] == r]
        summary[r] = sum(accs) / len(accs)
        params = next(x["parameters"] for x in runs if x["row"] == r)
        print(f"| {r} | {summary[r]:.4f} | {', '.join(f'{a:.4f}' for a in accs)} | {params} |")
    res = Path(args.results)
    res.parent.mkdir(parents=True, exist_ok=True)
    write(res, {"steps": args.steps, "seeds": args.seeds, "layers": args.layers, "pos_dim": args.pos_dim,
                "mean_test_accuracy": summary, "runs": runs}, settings=vars(args), load_avg=os.getloadavg())
    print(f"\nwrote {res}")


if __name__ == "__main__":
    main()
