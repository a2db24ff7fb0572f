"""Claim 12 (row 60 of ``docs/lecture_audit.md``): Fourier positions against other kinds, on a 2-D task where
position is everything.

The task: a ``6 × 6`` grid of random symbols (8 of them), one token per cell; every cell that has one must name the
symbol of its lower-right neighbour (row + 1, column + 1). The content of a token says nothing about the answer:
only where the tokens are does. The model is tokennet's own :class:`~tokennet.layers.stack.Encoder` (2 pre-norm
blocks, D = 32) on ``E[symbol] + P[cell]``, a linear head on every token, with ``P`` one of

- ``fourier``: 2-D sin-cos of the row and the column (:class:`~tokennet.position.fourier.Fourier2DPosition`, MAE's);
- ``learned``: a learned 2-D table (:class:`~tokennet.position.learned.LearnedPosition2D`, ViT's), initialised at
  the Fourier table's scale (std 1/√2) so that both start equally loud; bicubically interpolated for other grids;
- ``sinusoidal``: the 1-D sin-cos of the cell's index in raster order (the original Transformer's, for text);
- ``none``.

Measured: held-out accuracy along training on the 6 × 6 grid, and, without retraining, on an ``8 × 8`` grid.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ...layers.stack import Encoder
from ...position.fourier import Fourier2DPosition
from ...position.learned import LearnedPosition2D
from ...position.sinusoidal import SinusoidalPosition
from ._registry import Result, claim, plt, png

__all__ = ["neighbour_batch", "GridNet", "train_grid", "compare_positions", "KINDS", "verdict"]

V = 8
KINDS = ("fourier", "learned", "sinusoidal", "none")
OFFSET = (1, 1)  # the neighbour to name: one row down, one column right


def neighbour_batch(g: torch.Generator, B: int, grid: tuple[int, int] = (6, 6)) -> tuple[Tensor, Tensor]:
    """Symbols ``(B, h·w)`` in raster order and targets ``(B, h·w)``: the symbol at (row + 1, column + 1), −100
    on the last row and column (no such neighbour)."""
    grid_h, grid_w = grid
    row_offset, col_offset = OFFSET
    x = torch.randint(0, V, (B, grid_h, grid_w), generator=g)
    tgt = torch.full((B, grid_h, grid_w), -100)
    tgt[:, : grid_h - row_offset, : grid_w - col_offset] = x[:, row_offset:, col_offset:]
    return x.reshape(B, grid_h * grid_w), tgt.reshape(B, grid_h * grid_w)


class GridNet(nn.Module):
    """``symbols (B, h·w) → logits (B, h·w, V)``: ``E[symbol] + P[cell]`` → :class:`Encoder` → head.

    Args:
        position: ``"fourier"``, ``"learned"``, ``"sinusoidal"`` or ``"none"``.
        grid: the training grid (h, w); other grids are accepted at ``forward``.
        dim, depth, heads: D, L, H.
    """

    def __init__(self, position: str, grid: tuple[int, int] = (6, 6), *, dim: int = 32, depth: int = 2,
                 heads: int = 2):
        super().__init__()
        if position not in KINDS:
            raise ValueError(f"position must be one of {KINDS}, got {position!r}")
        self.position, self.dim = position, dim
        self.tok = nn.Embedding(V, dim)
        if position == "fourier":
            self.pos = Fourier2DPosition(dim, grid)
        elif position == "learned":
            self.pos = LearnedPosition2D(grid, dim, init_std=1 / math.sqrt(2))  # the Fourier table's rms
        elif position == "sinusoidal":
            self.pos = SinusoidalPosition(dim, max_len=grid[0] * grid[1])
        else:
            self.pos = None
        self.blocks = Encoder(dim, depth, heads, mlp_ratio=2.0)
        self.head = nn.Linear(dim, V)

    def forward(self, ids: Tensor, grid: tuple[int, int] | None = None) -> Tensor:
        x = self.tok(ids)  # (B, h·w, D)
        if self.position in ("fourier", "learned"):
            x = self.pos(x, grid)
        elif self.position == "sinusoidal":
            x = self.pos(x)
        return self.head(self.blocks(x))


@torch.no_grad()
def _accuracy(model: GridNet, grid: tuple[int, int], seed: int, n: int = 300) -> float:
    ids, tgt = neighbour_batch(torch.Generator().manual_seed(10_000 + seed), n, grid)
    model.eval()
    pred = model(ids, grid).argmax(-1)
    model.train()
    scored = tgt != -100
    return float((pred[scored] == tgt[scored]).float().mean())


def train_grid(position: str, seed: int = 0, *, steps: int = 250, B: int = 32, every: int = 50, lr: float = 3e-3,
               grid: tuple[int, int] = (6, 6), test_grid: tuple[int, int] = (8, 8)) -> dict:
    """Adam on fresh ``grid`` batches; training losses, held-out accuracy every ``every`` steps, and at the end the
    held-out accuracy on ``test_grid`` (no retraining)."""
    torch.manual_seed(seed)
    model = GridNet(position, grid)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    rng = torch.Generator().manual_seed(seed)
    losses, curve = [], []
    for step in range(steps):
        ids, tgt = neighbour_batch(rng, B, grid)
        loss = F.cross_entropy(model(ids).reshape(-1, V), tgt.reshape(-1), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if (step + 1) % every == 0:
            curve.append((step + 1, _accuracy(model, grid, seed)))
    return {"losses": losses, "curve": curve, "accuracy": curve[-1][1],
            "test_grid_accuracy": _accuracy(model, test_grid, seed)}


def compare_positions(seed: int = 0, *, steps: int = 250, B: int = 32, every: int = 50) -> dict:
    """Every kind of :data:`KINDS` on the same batches from the same seed."""
    runs = {kind: train_grid(kind, seed, steps=steps, B=B, every=every) for kind in KINDS}
    return {"runs": runs, "steps": steps, "B": B, "chance": 1 / V}


def _steps_to(run: dict, level: float = 0.9) -> int | None:
    return next((step for step, acc in run["curve"] if acc >= level), None)


def verdict(r: dict) -> tuple[bool | None, dict]:
    """Fourier against learned positions on three measures, each with a margin: the final accuracy on the training
    grid (5 points), the steps to reach 90 % on it (a checkpoint earlier; never reaching counts as after the last),
    the accuracy on the larger grid (10 points). Holds when Fourier is ahead on one and behind on none, does not
    hold when behind on one and ahead on none, is not decided (``None``) otherwise."""
    fourier, learned = r["runs"]["fourier"], r["runs"]["learned"]
    late = r["steps"] + 1
    steps_fourier, steps_learned = _steps_to(fourier) or late, _steps_to(learned) or late
    cmp = {"final accuracy": (fourier["accuracy"] - learned["accuracy"], 0.05),
           "steps to 90 %": (steps_learned - steps_fourier, 1),  # positive: Fourier got there first
           "larger grid": (fourier["test_grid_accuracy"] - learned["test_grid_accuracy"], 0.10)}
    ahead = [k for k, (diff, margin) in cmp.items() if diff >= margin]
    behind = [k for k, (diff, margin) in cmp.items() if diff <= -margin]
    holds = True if ahead and not behind else False if behind and not ahead else None
    return holds, {"ahead": ahead, "behind": behind,
                   "steps_to_90": {"fourier": _steps_to(fourier), "learned": _steps_to(learned)}}


def _figure(r: dict) -> bytes:
    pyplot = plt()
    fig, (ax_left, ax_right) = pyplot.subplots(1, 2, figsize=(10, 3.2))
    for i, (kind, run) in enumerate(r["runs"].items()):
        steps, acc = zip(*run["curve"])
        ax_left.plot(steps, acc, marker="o", ms=3, color=f"C{i}",
               label=f"{kind}: {run['accuracy']:.0%}, 8×8 grid {run['test_grid_accuracy']:.0%}")
        losses = torch.tensor(run["losses"])
        ax_right.plot(losses.unfold(0, 20, 1).mean(-1).numpy(), color=f"C{i}", label=kind)
    ax_left.axhline(r["chance"], color="grey", ls=":", lw=1, label="chance")
    ax_left.set_xlabel("step"), ax_left.set_ylabel("held-out accuracy (6×6)"), ax_left.legend(fontsize=7)
    ax_right.axhline(math.log(V), color="grey", ls=":", lw=1)
    ax_right.set_xlabel("step"), ax_right.set_ylabel("training loss"), ax_right.legend(fontsize=7)
    fig.suptitle("name the lower-right neighbour's symbol: positions of four kinds", fontsize=9)
    return png(fig)


@claim("fourier-positions", "12")
def claim_fourier_positions(seed: int = 0) -> Result:
    """"The book chapter goes into some intuition about why Fourier positional encoding is advantageous over other
    types. But this is also an open science question. This one works pretty well." (and the notes: "For images, for
    example, we might encode position by the Fourier coefficients associated with that position.")

    2-D Fourier positions against learned 2-D positions (and 1-D sinusoidal ones, and none) on a task only
    positions can solve: name the symbol of each cell's lower-right neighbour on a 6 × 6 grid, then on an 8 × 8
    grid without retraining. The verdict compares Fourier with learned positions (:func:`verdict`). A ViT takes
    both: ``--set position=fourier`` / ``learned``; on digits they are rows of ``bench/position_mode.py``.
    """
    res = compare_positions(seed)
    holds, why = verdict(res)
    runs = res["runs"]
    measured = ("held-out accuracy on 6×6 (on 8×8, untrained): " + ", ".join(
        f"{k} {v['accuracy']:.0%} ({v['test_grid_accuracy']:.0%})" for k, v in runs.items())
        + f"; Fourier ahead of learned on: {', '.join(why['ahead']) or 'nothing'}; behind on: "
        f"{', '.join(why['behind']) or 'nothing'} (chance {res['chance']:.0%})")
    table = [["positions", "6×6 accuracy", "steps to 90 %", "8×8 accuracy (untrained size)", "final loss"]]
    for kind, run in runs.items():
        steps_needed = _steps_to(run)
        tail = run["losses"][-20:]
        table.append([kind, f"{run['accuracy']:.1%}", str(steps_needed) if steps_needed else f"not in {res['steps']}",
                      f"{run['test_grid_accuracy']:.1%}", f"{sum(tail) / len(tail):.3f}"])
    data = {"accuracy": {k: v["accuracy"] for k, v in runs.items()},
            "test_grid_accuracy": {k: v["test_grid_accuracy"] for k, v in runs.items()},
            "curve": {k: v["curve"] for k, v in runs.items()}, "verdict": why, "steps": res["steps"]}
    return Result(f"encoder, 2 blocks, D=32, 6×6 grid of 8 symbols, {res['steps']} Adam steps (batch {res['B']}) per "
                  "kind of position; then an 8×8 grid", measured, holds, _figure(res), data, table=table)
