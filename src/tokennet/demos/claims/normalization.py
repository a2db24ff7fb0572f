"""Claim 11 (row 59 of ``docs/lecture_audit.md``): LayerNorm's optimization properties — the same small transformer
with and without its norms, trained from the same start at several learning rates.

The task: sort eight digits. A sequence is ``x_1 … x_8 | y_1 … y_8`` with ``y = sorted(x)``; a causal LM is trained
on the sorted half (the digits before ``|`` are random, so their predictions are not scored). The model is
tokennet's own :class:`~tokennet.layers.stack.Encoder` under the causal mask, with a token embedding, learned
positions and a linear head; ``norm="pre"`` (ViT's and GPT-2's blocks, a final LayerNorm) against ``norm="none"``
(``x + f(x)``: every LayerNorm an identity), nothing else changed. Plain Adam, no warm-up and no gradient clipping,
so the norms are the only thing standing between a step size and the model.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ...attention.masks import causal
from ...layers.stack import Encoder
from ...position.learned import LearnedPosition
from ._registry import Result, claim, plt, png

__all__ = ["sort_batch", "SortLM", "train_sorter", "compare_norms", "stable", "final_loss", "LRS"]

V, N = 10, 8  # digits, sequence length to sort
LRS = (3e-3, 3e-2, 1e-1)


def sort_batch(g: torch.Generator, B: int, n: int = N) -> tuple[Tensor, Tensor]:
    """Inputs ``(B, 2n)`` (``x``, the separator ``V``, ``y_1 … y_{n−1}``) and targets ``(B, 2n)``: −100 (not
    scored) on the unsorted half, then ``y_1 … y_n`` (predicted from the separator and ``y_1 … y_{n−1}``)."""
    x = torch.randint(0, V, (B, n), generator=g)
    seq = torch.cat([x, torch.full((B, 1), V), x.sort(dim=1).values], dim=1)  # (B, 2n + 1)
    tgt = seq[:, 1:].clone()
    tgt[:, :n] = -100  # x_2 … x_n (chance) and the separator (always the same): not scored
    return seq[:, :-1], tgt


class SortLM(nn.Module):
    """``ids (B, n) → logits (B, n, V)``: ``E[id] + P[place]`` → causal :class:`Encoder` (``norm``) → head.

    Args:
        norm: the blocks' norm placement, ``"pre"`` or ``"none"``.
        depth, dim, heads: the encoder's L, D and H.
    """

    def __init__(self, norm: str = "pre", *, depth: int = 4, dim: int = 32, heads: int = 2):
        super().__init__()
        self.tok = nn.Embedding(V + 1, dim)  # id V: the separator
        self.pos = LearnedPosition(2 * N, dim, init_std=0.5)
        self.blocks = Encoder(dim, depth, heads, mlp_ratio=2.0, norm=norm)
        self.head = nn.Linear(dim, V)

    def forward(self, ids: Tensor) -> Tensor:
        x = self.pos(self.tok(ids))  # (B, n, D)
        return self.head(self.blocks(x, mask=causal(ids.shape[1], device=ids.device)))


def train_sorter(norm: str, lr: float, seed: int = 0, *, steps: int = 200, B: int = 32, depth: int = 4,
                 dim: int = 32, eval_size: int = 500) -> dict:
    """Adam at ``lr`` on fresh batches; the training loss at each step (``nan`` from the step it diverged on) and the
    held-out accuracy on the sorted digits (teacher-forced, another seed's stream)."""
    torch.manual_seed(seed)
    model = SortLM(norm, depth=depth, dim=dim)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    rng = torch.Generator().manual_seed(seed)
    losses: list[float] = []
    for _ in range(steps):
        ids, tgt = sort_batch(rng, B)
        loss = F.cross_entropy(model(ids).reshape(-1, V), tgt.reshape(-1), ignore_index=-100)
        if not torch.isfinite(loss):
            losses += [math.nan] * (steps - len(losses))
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    with torch.no_grad():
        ids, tgt = sort_batch(torch.Generator().manual_seed(10_000 + seed), eval_size)
        pred = model.eval()(ids).argmax(-1)
        scored = tgt != -100
        acc = float((pred[scored] == tgt[scored]).float().mean()) if math.isfinite(losses[-1]) else 0.0
    return {"losses": losses, "accuracy": acc, "diverged": not math.isfinite(losses[-1])}


def compare_norms(seed: int = 0, *, lrs=LRS, steps: int = 200, B: int = 32, depth: int = 4, dim: int = 32) -> dict:
    """Every learning rate of ``lrs``, with the LayerNorms (``"pre"``) and without (``"none"``), from the same
    initial weights of the shared parameters and the same batches."""
    runs = {norm: {lr: train_sorter(norm, lr, seed, steps=steps, B=B, depth=depth, dim=dim) for lr in lrs}
            for norm in ("pre", "none")}
    return {"runs": runs, "lrs": list(lrs), "steps": steps, "depth": depth, "dim": dim, "B": B}


def final_loss(run: dict) -> float:
    """The mean training loss of the last 20 steps (``nan`` once diverged)."""
    tail = run["losses"][-20:]
    return sum(tail) / len(tail)


def stable(run: dict) -> bool:
    """A run is *stable* when its final training loss is finite and below chance's, ``log V``: it learned something
    and did not blow up (its accuracy says how much it learned)."""
    loss = final_loss(run)
    return math.isfinite(loss) and loss < math.log(V)


def _figure(r: dict) -> bytes:
    pyplot = plt()
    lrs = r["lrs"]
    fig, axes = pyplot.subplots(1, len(lrs), figsize=(3.0 * len(lrs), 2.9), sharey=True, squeeze=False)
    axes = axes[0]
    for ax, lr in zip(axes, lrs):
        for norm, label, color in (("pre", "LayerNorm (pre-norm)", "C0"), ("none", "no norm", "C3")):
            run = r["runs"][norm][lr]
            losses = torch.tensor(run["losses"])
            smooth = losses.unfold(0, 10, 1).mean(-1) if len(losses) > 10 else losses
            end = "diverged" if run["diverged"] else f"{run['accuracy']:.0%}"
            top = math.log(V) * 1.35  # a loss that blows up is drawn along the top edge
            ax.plot(smooth.clamp(max=top).numpy(), color=color, label=f"{label}: {end}")
        ax.axhline(math.log(V), color="grey", ls=":", lw=1)
        ax.set_title(f"Adam lr = {lr:g}", fontsize=9)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
        ax.set_ylim(0, math.log(V) * 1.4)
    axes[0].set_ylabel("training loss (sorted half)")
    fig.suptitle(f"sorting 8 digits, {r['depth']} blocks, D = {r['dim']}: held-out accuracy in the legend; "
                 "dotted: chance (log 10); losses above the frame drawn on its top edge", fontsize=9, y=1.06)
    return png(fig)


@claim("layernorm-optimization", "11")
def claim_layernorm(seed: int = 0) -> Result:
    """"So LayerNorm has desirable optimization properties. Exactly what those are is basically open science. And
    it's not quite clear why LayerNorm is right thing to do, but it's what people do." (and before it: "it's good
    to normalize activations ... for stability of optimization")

    The same causal transformer (4 blocks, D = 32) with its LayerNorms (pre-norm, a final norm) and with every norm
    an identity (``norm="none"``: ``x + f(x)``), trained to sort eight digits by plain Adam at three learning rates.
    It holds when the model with norms is stable (its final training loss finite and below chance's, log 10) at more
    of the learning rates than the one without, and its best held-out accuracy is not worse (within 2 points).
    Blocks and models take the option too: ``Block(norm="none")``, a GPT's ``--set norm_placement=none``, a
    seq2seq's ``--set norm=none``.
    """
    res = compare_norms(seed)
    lrs = res["lrs"]
    ok = {norm: [lr for lr in lrs if stable(res["runs"][norm][lr])] for norm in ("pre", "none")}
    best = {norm: max(run["accuracy"] for run in res["runs"][norm].values()) for norm in ("pre", "none")}
    holds = len(ok["pre"]) > len(ok["none"]) and best["pre"] >= best["none"] - 0.02

    def row(norm: str) -> str:
        return ", ".join("diverged" if res["runs"][norm][lr]["diverged"] else f"{res['runs'][norm][lr]['accuracy']:.0%}"
                         for lr in lrs)

    lr_list = ", ".join(f"{lr:g}" for lr in lrs)
    blew = [lr for lr in lrs if not stable(res["runs"]["none"][lr])]
    measured = (f"held-out accuracy at lr {lr_list}: with LayerNorm {row('pre')}; without {row('none')}; stable "
                f"at {len(ok['pre'])} vs {len(ok['none'])} of {len(lrs)} learning rates")
    if blew:
        ends = ", ".join(f"{final_loss(res['runs']['none'][lr]):.3g}" for lr in blew)
        measured += (f" (without norms the loss ends at {ends} at lr {', '.join(f'{lr:g}' for lr in blew)}; "
                     f"chance is {math.log(V):.2f})")
    table = [["learning rate", "with LayerNorm", "without", "final loss with", "final loss without"]]
    for lr in lrs:
        cells = [f"{lr:g}"]
        for norm in ("pre", "none"):
            run = res["runs"][norm][lr]
            cells.append("diverged" if run["diverged"] else f"{run['accuracy']:.1%}")
        for norm in ("pre", "none"):
            cells.append(f"{final_loss(res['runs'][norm][lr]):.4g}")
        table.append(cells)
    data = {"accuracy": {norm: {str(lr): res["runs"][norm][lr]["accuracy"] for lr in lrs} for norm in ("pre", "none")},
            "diverged": {norm: {str(lr): res["runs"][norm][lr]["diverged"] for lr in lrs} for norm in ("pre", "none")},
            "final_loss": {norm: {str(lr): final_loss(res["runs"][norm][lr]) for lr in lrs}
                           for norm in ("pre", "none")},
            "stable_at": {norm: ok[norm] for norm in ok}, "steps": res["steps"]}
    return Result(f"causal encoder, {res['depth']} blocks, D={res['dim']}, sorting 8 digits, {res['steps']} Adam steps "
                  f"(batch {res['B']}) at each lr, norm=pre vs none", measured, holds, _figure(res), data, table=table)
