"""What dropout costs a training step on a CPU: tokennet's dropout (its mask cut four units to a 64-bit random word;
the attention weights' on the plain formula's path) against PyTorch's (``nn.Dropout``, and SDPA's ``dropout_p`` on
the attention weights) in the same model, and the step without dropout.

    python bench/dropout.py                       # the characters record's model: 6 layers × 128, 32 × 128 tokens
    python bench/dropout.py --preset gpt --set dim=384 num_layers=6 num_heads=6 block_size=256 --batch 12

Each row is a training step (forward, backward, AdamW) of the same model and batch; the configurations alternate
within each round and the table gives the median over rounds. Prints a table and writes
``bench/results/dropout.json`` (the command, the commit, the machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import write  # noqa: E402

from tokennet.dropout import Dropout  # noqa: E402
from tokennet.errors import RecipeError  # noqa: E402
from tokennet.fields import field_types  # noqa: E402
from tokennet.lifecycle.settings import parse_sets  # noqa: E402
from tokennet.models import create_model  # noqa: E402
from tokennet.models.registry import config_from_dict, preset_info  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CHARACTERS = {"vocab_size": 65, "block_size": 128, "dim": 128, "num_layers": 6, "num_heads": 4, "bias": False,
              "qk_norm": True}  # the records table's characters row (bench/records.py)


def model_settings(preset: str, sets: list[str]) -> dict:
    """The characters row's settings with ``KEY=VALUE`` strings over them, parsed by the preset's config field
    types as ``tokennet train --set`` parses them (an unknown key or a bad value: one-line error)."""
    family, fields, _ = preset_info(preset)
    config = config_from_dict({"family": family, **fields, **CHARACTERS})
    types = field_types(type(config))
    defaults = {name: getattr(config, name) for name in types}
    return {**CHARACTERS, **parse_sets(sets, defaults, types, recipe=preset)}


def build(preset: str, settings: dict, dropout: float, torch_dropout: bool) -> nn.Module:
    torch.manual_seed(0)
    # PyTorch's dropout everywhere: its module, and SDPA's own dropout on the attention weights
    backend = {"backend": "sdpa"} if torch_dropout else {}
    model = create_model(preset, **{**settings, "dropout": dropout, **backend})
    if torch_dropout:  # the same places, PyTorch's module
        for parent in model.modules():
            for name, child in parent.named_children():
                if isinstance(child, Dropout):
                    setattr(parent, name, nn.Dropout(child.p))
    return model.train()


def step_seconds(model: nn.Module, ids: torch.Tensor, steps: int) -> float:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    started = time.perf_counter()
    for _ in range(steps):
        loss = model(ids, targets=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return (time.perf_counter() - started) / steps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="gpt")
    ap.add_argument("--set", dest="sets", nargs="+", default=[], metavar="KEY=VALUE",
                    help="model settings over the characters row's (6 × 128, block 128, 65 characters)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per configuration and round (after 2 warm-up)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "dropout.json"))
    args = ap.parse_args(argv)
    try:
        settings = model_settings(args.preset, args.sets)
    except RecipeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    ids = torch.randint(settings["vocab_size"], (args.batch, settings["block_size"]),
                        generator=torch.Generator().manual_seed(0))
    rows = {"no dropout": (0.0, False), f"PyTorch's dropout {args.dropout:g}": (args.dropout, True),
            f"tokennet's dropout {args.dropout:g}": (args.dropout, False)}
    models = {name: build(args.preset, settings, p, torch_dropout) for name, (p, torch_dropout) in rows.items()}
    for model in models.values():
        step_seconds(model, ids, 2)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.rounds):
        for name, model in models.items():
            times[name].append(step_seconds(model, ids, args.steps))
    medians = {name: statistics.median(t) for name, t in times.items()}
    base = medians["no dropout"]
    print(f"\n{args.preset} {settings}, batch {args.batch}: a training step, median of {args.rounds} rounds\n")
    print("| dropout | ms a step | × no dropout |")
    print("| --- | ---: | ---: |")
    for name, seconds in medians.items():
        print(f"| {name} | {seconds * 1000:.1f} | {seconds / base:.2f} |")
    torch_name, ours = list(rows)[1], list(rows)[2]
    print(f"\nthe step with tokennet's dropout against PyTorch's: {medians[torch_name] / medians[ours]:.2f}x faster")
    write(args.out, {"benchmark": "dropout", "preset": args.preset, "settings": settings, "batch": args.batch,
                     "threads": torch.get_num_threads(),
                     "ms_per_step_median": {k: round(v * 1000, 2) for k, v in medians.items()},
                     "ms_per_step_rounds": {k: [round(s * 1000, 2) for s in v] for k, v in times.items()},
                     "speedup_over_torch_dropout": round(medians[torch_name] / medians[ours], 3)},
          argv=argv, script="dropout.py", cpus_used=os.cpu_count())
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
