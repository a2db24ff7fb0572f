"""Claim 18 (issue 62): a sequence's statistics forwards are not its statistics backwards.

The toy language: ``x_(t+1) = (x_t + x_(t−1)²) mod 11`` from two random symbols, eight long. Read forwards, every
symbol after the second is a function of the two before it. Read backwards, ``x_(t−1)`` is a square root of
``x_(t+1) − x_t``: two answers (``±r``) whenever ``r ≠ 0``, of which the symbols already read rule out one only
sometimes (the next one back needs ``x_t − x_(t−1)`` to be a square too). The least loss each way is the conditional
entropy of the process, counted exactly over its 121 starts (:func:`floor`): 0 forwards, 0.269 nats per symbol
backwards. The same small GPT (:class:`~.causal.TinyLM`) is trained
on each direction with the same seed, batches and steps. On real text the recipe's own runs (``tokennet train gpt-char
--set reverse=true``, Tiny Shakespeare, three seeds) are in ``bench/results/text_direction.json``
(``python bench/text_direction.py``).
"""

from __future__ import annotations

import collections
import itertools
import math

import torch
from torch import Tensor
from torch.nn import functional as F

from ._registry import Result, claim, plt, png
from .causal import T, TinyLM, V

__all__ = ["square_sequences", "compare_directions", "floor", "GAP"]

GAP = 0.5  # the backward loss must stay above the forward one by this share of the backward floor


def square_sequences(generator: torch.Generator, batch_size: int) -> Tensor:
    """``(B, T)`` sequences ``x_(t+1) = (x_t + x_(t−1)²) mod V`` from two random symbols."""
    return square_sequences_from(torch.randint(0, V, (batch_size, 2), generator=generator))


def square_sequences_from(starts: Tensor) -> Tensor:
    """``(B, 2)`` first symbols → ``(B, T)`` sequences ``x_(t+1) = (x_t + x_(t−1)²) mod V``."""
    seq = starts
    while seq.shape[1] < T:
        seq = torch.cat([seq, (seq[:, -1:] + seq[:, -2:-1] ** 2) % V], dim=1)
    return seq


def floor(backwards: bool) -> float:
    """The least mean loss of symbols 2 … T−1 in that reading direction: the conditional entropy
    ``H(x_i | x_<i)`` averaged over the positions, counted over the ``V²`` equally likely starts."""
    starts = torch.tensor(list(itertools.product(range(V), repeat=2)))
    seqs = [tuple(row) for row in (square_sequences_from(starts).flip(1) if backwards
                                   else square_sequences_from(starts)).tolist()]
    entropy = 0.0
    for i in range(2, T):
        next_symbols = collections.defaultdict(collections.Counter)  # prefix → counts of the symbol after it
        for seq in seqs:
            next_symbols[seq[:i]][seq[i]] += 1
        for counts in next_symbols.values():
            total = sum(counts.values())
            entropy -= sum(n / len(seqs) * math.log(n / total) for n in counts.values())
    return entropy / (T - 2)


def _loss_after_two(model: TinyLM, seq: Tensor) -> Tensor:
    """Mean cross-entropy of the predictions of symbols 2 … T−1 (each from at least two symbols before it)."""
    places = torch.arange(T - 1).expand(len(seq), T - 1)
    logits = model(seq[:, :-1], places)  # (B, T − 1, V): logits[:, i] predicts symbol i + 1
    return F.cross_entropy(logits[:, 1:].reshape(-1, V), seq[:, 2:].reshape(-1))


def _train_direction(backwards: bool, seed: int, held_out: Tensor, *, steps: int, batch_size: int) -> float:
    torch.manual_seed(seed)
    batches = torch.Generator().manual_seed(seed)
    model = TinyLM()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        seq = square_sequences(batches, batch_size)
        loss = _loss_after_two(model, seq.flip(1) if backwards else seq)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        return float(_loss_after_two(model.eval(), held_out.flip(1) if backwards else held_out))


def compare_directions(seed: int = 0, *, steps: int = 300, batch_size: int = 64) -> dict:
    """Held-out loss (nats per symbol, symbols 2 … T−1) of the same GPT trained forwards and backwards."""
    held_out = square_sequences(torch.Generator().manual_seed(10_000 + seed), 500)
    losses = {name: _train_direction(name == "backward", seed, held_out, steps=steps, batch_size=batch_size)
              for name in ("forward", "backward")}
    return {"steps": steps, "loss": losses, "floor": {"forward": floor(False), "backward": floor(True)}}


@claim("text-direction", "18")
def claim_text_direction(seed: int = 0) -> Result:
    """"The earlier words in the sentence are causally determining the next words, but there's not quite the
    anti-causal direction. The statistics are different. It's not like a reversible sequence."

    Measured: the same small GPT trained on a sequence whose next symbol is a function of the two before it
    (``x_(t+1) = x_t + x_(t−1)² mod 11``), read forwards and read backwards; it holds when the backward held-out loss
    stays above the forward one by at least half the backward floor (the floors, counted exactly: 0 forwards, 0.269
    nats per symbol backwards).
    """
    result = compare_directions(seed)
    loss, least = result["loss"], result["floor"]["backward"]
    holds = loss["backward"] - loss["forward"] >= GAP * least
    measured = (f"held-out loss forward {loss['forward']:.3f}, backward {loss['backward']:.3f} nats/symbol "
                f"(backward floor {least:.3f})")
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(4.5, 3))
    ax.bar(["forward", "backward"], [loss["forward"], loss["backward"]], color=["#5b8fd1", "#d18a5b"])
    ax.axhline(least, ls=":", c="k", lw=1, label="backward floor (the process's entropy)")
    ax.set_ylabel("held-out loss (nats / symbol)"), ax.legend(fontsize=7)
    ax.set_title("x(t+1) = x(t) + x(t−1)² mod 11, read both ways", fontsize=10)
    return Result(f"TinyLM on x(t+1) = x(t) + x(t−1)² mod 11, {result['steps']} steps each way", measured, holds,
                  png(fig), result)
