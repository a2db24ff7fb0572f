"""Corner pairs against the CNN's receptive field: *is the top right animal the same species as the bottom left
animal?* answered by FiLM CNNs whose units see 20 … 92 pixels, beside the 3-layer transformer.

The lecture's x1 … x7: no unit whose field misses one of the two corners can compare them, and a readout that
averages the units' votes adds them up instead. So that pooling is not what fails, the CNNs here keep position:
two coordinate channels are appended to the image (``readout="coords"``, as FiLM's own model does), so every
unit knows where its field lies. The field is set by depth (plain conv layers of 3×3 at stride 1 after a 4×4
patchify stem: ``r = 4 + 8·n``) or by dilation (two layers, ``r = 4 + 16·d``); each CNN's width is chosen so
that it has about the transformer's parameter count. ``--arch resnet`` builds the trunk from residual blocks
instead (two 3×3 convs each: ``r = 4 + 16·n`` by depth, one block dilated ``d`` for ``4 + 16·d``): plain stacks of
7 or more layers fail to learn even the one-corner ``species`` question in 1500 steps, residual ones learn it, so
the residual sweep separates "cannot train" from "cannot compare the corners". Every model trains as the ``vqa``
recipe trains its models (its optimizer settings; the CNNs in the baselines' precision) on the same batches of the
corner questions (``same_species`` and ``species``, half each; the generated data of ``tokennet train vqa``, no
held-out kind in training) for the same steps, and answers the held-out corner pairs (each picture with a
held-out kind; chance is 50 %).

    PYTHONPATH=src OMP_NUM_THREADS=1 python bench/vqa_receptive_field.py            # the sweep, 1500 steps
    PYTHONPATH=src python bench/vqa_receptive_field.py --fields 20 52 --steps 200     # a quick look
    PYTHONPATH=src python bench/vqa_receptive_field.py --arch resnet --no-transformer  # residual CNNs, 20 … 84 px

Prints a markdown table and writes ``bench/results/vqa_receptive_field.json`` (the command, the commit, the
machine) and ``bench/results/vqa_receptive_field.png``. A field the chosen ``--via`` cannot build is refused in
one line.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from tokennet.data.vqa import COLOURS, AnimalQuestions, encode_questions, render, sample_items  # noqa: E402
from tokennet.errors import ConfigError, TokennetError  # noqa: E402
from tokennet.models.registry import create_model  # noqa: E402
from tokennet.models.vqa import answer_points  # noqa: E402
from tokennet.recipes.vqa import cnn_precision  # noqa: E402
from tokennet.tasks.vqa import exact_match  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/_record.py, also when a test loads this file
from _record import commit, machine  # noqa: E402

FIELDS = (20, 36, 52, 68, 92)
RESNET_FIELDS = (20, 36, 52, 68, 84)  # 92 is not 4 + 16n
ARCHS = ("plain", "resnet")
TEMPLATES = ("same_species", "species")


def layout(field: int, via: str, arch: str = "plain") -> dict:
    """The trunk settings whose units see ``field`` pixels. Plain layers (one 3×3 conv each): by depth
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
                              "20, 36, 52, 68, 84, ...)")
        return {"depths": [2 if arch == "plain" else 1], "dilation": d}
    raise ConfigError(f"--via must be depth or dilation, got {via!r}")


def cnn_settings(field: int, via: str, budget: int, data: dict, readout: str, arch: str = "plain") -> dict:
    """A FiLM CNN (``arch`` plain or resnet) with a ``field``-pixel field and about ``budget`` parameters (its width
    searched)."""
    base = {**data, "arch": arch, "stem_kernel": 4, "stem_stride": 4, "readout": readout,
            **layout(field, via, arch)}
    best = None
    for w in range(8, 257, 2):
        s = {**base, "widths": [w]}
        n = create_model("vqa-cnn", **s).num_parameters()
        if best is None or abs(n - budget) < abs(best[1] - budget):
            best = (s, n)
        if n > budget:
            break
    return best[0]


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


def corner_test(spec: AnimalQuestions, n: int):
    from tokennet.data.vqa import _qaset

    items = [it for t in TEMPLATES for it in sample_items(n // 2, f"rf-test-{t}", seed=spec.seed, held_out=True,
                                                          template=t)]
    return _qaset(items, spec.answers, 64, seed=zlib.crc32(f"{spec.seed}-rf-test".encode()))


def train(model, batches, steps: int, lr: float, precision: str = "fp32") -> float:
    """As the ``vqa`` recipe trains its transformer and its CNN baselines: tokennet's Trainer with the recipe's
    training settings (Muon on the weight matrices, AdamW on the rest, warm-up then cosine decay), peak rate
    ``lr``, ``steps`` steps; returns the seconds it took."""
    import dataclasses
    import tempfile

    from tokennet.recipes import get_recipe
    from tokennet.train.trainer import TrainConfig, Trainer

    cfg = dataclasses.replace(TrainConfig(**get_recipe("vqa").train_defaults), max_iters=steps, lr=lr,
                              eval_interval=0, checkpoint_interval=0, progress=False, log_interval=0, report=False,
                              tensorboard=False, precision=precision)
    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        Trainer(model, cfg, batches, out_dir=scratch, device="cpu").fit()
    model.eval()
    return time.perf_counter() - t


def plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cnn = [r for r in rows if r["model"] == "cnn"]
    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=120)
    archs = sorted({r.get("arch", "plain") for r in cnn})
    for k, arch in enumerate(archs):
        mine = [r for r in cnn if r.get("arch", "plain") == arch]
        ax.plot([r["receptive_field"] for r in mine], [r["same_species"] for r in mine], "os"[k % 2] + "-",
                color=f"C{0 if k == 0 else 2}", label=f"FiLM CNN ({arch}) + coords")
    for r in rows:
        if r["model"] == "transformer":
            ax.axhline(r["same_species"], color="C1", ls="--", label="transformer (3 layers)")
    ax.axhline(50, color="grey", ls=":", label="chance")
    ax.axvline(64, color="grey", lw=0.6)
    ax.text(64, 52, " 64 px: both corner cells", fontsize=7, color="grey")
    ax.set_xlabel("receptive field (pixels)")
    ax.set_ylabel("corner pairs correct (%)")
    ax.set_ylim(40, 101)
    ax.legend(fontsize=7, loc="center right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fields", type=int, nargs="+", help="receptive fields in pixels (default: "
                    f"{' '.join(map(str, FIELDS))}; with --arch resnet {' '.join(map(str, RESNET_FIELDS))})")
    ap.add_argument("--via", default="depth", help="depth or dilation (see --arch for the fields each builds)")
    ap.add_argument("--arch", default="plain", help="plain: conv-norm-ReLU layers (depth: 4 + 8n px; dilation: "
                    "4 + 16d px); resnet: residual blocks of two convs, which train at depths where plain layers "
                    "stall (depth: 4 + 16n px; dilation: 4 + 16d px)")
    ap.add_argument("--readout", default="coords", help="coords (default) or mean (the plain GAP of the recipe)")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--test-size", type=int, default=1000)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-transformer", action="store_true", help="only the CNNs")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "vqa_receptive_field.json"))
    ap.add_argument("--into", metavar="RUN_DIR", help="also write receptive_field.json and .png into a vqa run "
                    "directory, where its report (tokennet report) shows them")
    args = ap.parse_args(argv)
    try:
        if args.steps < 1 or args.batch_size < 2 or args.test_size < 2:
            raise ConfigError("--steps must be >= 1, --batch-size and --test-size >= 2")
        if args.readout not in ("coords", "mean"):
            raise ConfigError(f"--readout must be coords or mean, got {args.readout!r}")
        if args.fields is None:
            args.fields = list(RESNET_FIELDS if args.arch == "resnet" else FIELDS)
        for f in args.fields:
            layout(f, args.via, args.arch)  # every setting checked before anything trains
        if args.into and not (Path(args.into) / "run.json").is_file():
            raise ConfigError(f"--into {args.into}: not a run directory (no run.json)")
        return run(args)
    except TokennetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def run(args) -> int:
    spec = AnimalQuestions(seed=args.seed).filled()
    mean, std = spec.pixel_stats()
    data = {"vocab_size": len(spec.words), "num_answers": len(spec.answers), "pixel_mean": mean, "pixel_std": std,
            "answer_points": answer_points(spec.answers, COLOURS)}
    from tokennet.recipes import get_recipe

    transformer = {**data, **get_recipe("vqa").model_defaults}  # the recipe's transformer (its patch stem)
    torch.manual_seed(args.seed)
    budget = create_model("vqa-transformer", **transformer).num_parameters()
    batches, test = CornerBatches(spec, args.batch_size, 12), corner_test(spec, args.test_size)
    plans = [("transformer", None, transformer)] if not args.no_transformer else []
    plans += [("cnn", f, cnn_settings(f, args.via, budget, data, args.readout, args.arch))
              for f in args.fields]
    rows = []
    for kind, f, settings in plans:
        torch.manual_seed(args.seed)
        m = create_model("vqa-transformer" if kind == "transformer" else "vqa-cnn", **settings)
        # the CNNs in the precision the recipe trains its baselines in (bf16 where the CPU has it in hardware)
        secs = train(m, batches, args.steps, args.lr, "fp32" if kind == "transformer" else cnn_precision("auto", "cpu"))
        em = exact_match(m, test, spec.words, 12)
        row = {"model": kind, "receptive_field": f if f is not None else 64,
               "layers": m.config.num_layers if kind == "transformer"
               else 1 + settings["depths"][0] * (1 if settings["arch"] == "plain" else 2),  # conv layers
               "width": m.config.dim if kind == "transformer" else settings["widths"][0],
               "arch": "transformer" if kind == "transformer" else settings["arch"],
               "dilation": settings.get("dilation", 1), "num_parameters": m.num_parameters(),
               "same_species": em["exact_match_same_species"], "species": em["exact_match_species"],
               "train_seconds": round(secs, 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\ncorner pairs vs receptive field ({args.steps} steps of {args.batch_size}, {args.arch} CNNs via "
          f"{args.via}, readout {args.readout}; held-out test, {args.test_size} questions; chance 50 %)\n")
    print("| model | field (px) | layers | width | params | same species % | species % | train s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['model']} | {r['receptive_field']} | {r['layers']} | {r['width']} | {r['num_parameters']} | "
              f"{r['same_species']:.1f} | {r['species']:.1f} | {r['train_seconds']} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": "vqa_receptive_field", "command": "python " + " ".join([sys.argv[0], *sys.argv[1:]]),
              "commit": commit(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "settings": vars(args), "rows": rows,
              "machine": machine(torch=torch.__version__, threads=torch.get_num_threads(), load=list(os.getloadavg()))}
    out.write_text(json.dumps(result, indent=2) + "\n")
    plot(rows, out.with_suffix(".png"))
    print(f"\nwrote {out} and {out.with_suffix('.png')}")
    if args.into:
        into = Path(args.into) / "receptive_field.json"
        into.write_text(out.read_text())
        into.with_suffix(".png").write_bytes(out.with_suffix(".png").read_bytes())
        print(f"wrote {into} (tokennet report {args.into} shows it)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
