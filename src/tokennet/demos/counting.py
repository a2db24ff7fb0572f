"""The transformer built by hand: one block whose weights are set by formula counts animals and reads a colour.

The lecture: *"How many animals are in this photo?"* — put one unit of attention on each animal-head token and
zero on the others, sum what is attended, and you get *"a new token vector whose value is 4 in the dimension
that counts animals"*; *"What is the colour of the impala?"* — attend to the impala's tokens and average the
dimension holding each one's colour. Here that is tokennet's own :class:`~tokennet.layers.block.Block`
(two heads, a ReLU MLP), with every weight written down, nothing trained.

**The tokens** have given features (:data:`FEATURES`): an animal-head indicator ``a``, a species one-hot, an
RGB colour; a *sink* token (indicator ``z``); a ``[count]`` query (indicator) and a ``[colour of X]`` query
(X's species one-hot in dimensions of its own). An animal is several tokens — its head (``a = 1``) and body
parts (``a = 0``), all with its species and colour — among background and clutter tokens (colour only).

**Counting with softmax.** A row of ``A = softmax(Q Kᵀ / √E)`` sums to 1, so attention *averages*: attending
uniformly to ``k`` animal heads and summing a value of 1 gives 1, whatever ``k`` is. The construction adds
a **sink token** that the ``[count]`` query scores as high as an animal head: head 1 has ``q = β·[count]``,
``k = a + z``, so the query's scores are ``β`` on the ``k`` heads and the sink and 0 elsewhere. With value
``v = z`` (1 on the sink only) the attention output is the sink's weight,

    o = e^β / ((k + 1) e^β + m) = 1 / (k + 1 + m e^(−β))  ≈  1 / (k + 1),

``m`` the other tokens (with β = 30 and m < 10⁴, ``m e^(−β) < 10⁻⁹``). Counting is then a fixed function of
one number, ``k = 1/o − 1``, which the block's MLP computes exactly at ``o = 1/(k+1)`` for
``k = 0 … max_count``: its ReLU units ``h_i = ReLU(o − t_i)`` at the knots ``t_i = 1/(max_count + 1 − i)``
sum to the piecewise-linear interpolant of ``1/o − 1`` through those points. So the ``[count]`` token's
"count" dimension holds ``k`` — the lecture's "value 4 in the dimension that counts animals" — for
``k = 0`` too (the sink takes all the attention). The lecture's unnormalized weights (a 1 per head, no
softmax) would put ``k`` there directly; softmax plus a sink is how a real attention layer gets it.

**Reading a colour** needs no sink: head 2 has ``q = β·onehot(X)``, ``k = species one-hot``, so the
``[colour of X]`` query weighs X's tokens equally (``e^β`` each) and the rest ``≈ 0``; with ``v = RGB`` its
output is the mean colour of X's tokens, and the answer is the named colour nearest to it.

:func:`run_demo` checks both answers on random token sets (none, one and up to ``max_count`` animals, in
random order, with clutter) and draws ``counting_attention.png``: the two queries' attention rows over one
set's tokens.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from ..layers.block import Block

__all__ = ["FEATURES", "SPECIES", "COLOURS", "TokenSet", "hand_built_block", "random_token_set", "answer",
           "run_demo", "BETA"]

SPECIES = ("bird", "fish", "cat", "impala", "turtle")
COLOURS = {"red": (0.86, 0.14, 0.12), "green": (0.14, 0.62, 0.2), "blue": (0.16, 0.32, 0.92),
           "yellow": (0.95, 0.8, 0.08), "purple": (0.6, 0.2, 0.74)}
BACKGROUND = (0.95, 0.93, 0.87)
BETA = 30.0
S = len(SPECIES)
# Where each feature lives in a token (D = 24). Inputs first, then the dimensions the block writes.
FEATURES = {
    "animal_head": 0,
    "species": slice(1, 1 + S),
    "colour": slice(6, 9),
    "sink": 9,
    "count_query": 10,
    "colour_query": 11,
    "query_species": slice(12, 12 + S),
    "sink_weight": 17,  # head 1 writes 1/(k + 1) here
    "count": 18,  # the MLP writes k here
    "mean_colour": slice(19, 22),  # head 2 writes the mean colour of X's tokens here
}
DIM, HEADS = 24, 2
HEAD_DIM = DIM // HEADS


def hand_built_block(max_count: int = 20, beta: float = BETA) -> Block:
    """tokennet's :class:`Block` (pre-norm, 2 heads, ReLU MLP of ``max_count`` units) with its weights set by
    the formulas of the module docstring, and its two LayerNorms replaced by the identity (a normalization
    would rescale the features the weights are written for)."""
    F = FEATURES
    E = HEAD_DIM
    blk = Block(DIM, HEADS, mlp_ratio=max_count / DIM, activation="relu")
    blk.norm1, blk.norm2 = nn.Identity(), nn.Identity()
    with torch.no_grad():
        for param in blk.parameters():
            param.zero_()
        qkv = blk.attn.qkv_proj.weight  # (3 H E, D): rows [W_q; W_k; W_v], head h in rows h E … h E + E − 1
        w_query, w_key, w_value = qkv[:DIM], qkv[DIM:2 * DIM], qkv[2 * DIM:]
        scale = E ** 0.5  # the attention divides the scores by √E: fold it into W_q
        # Head 1 (rows 0 … E − 1): the [count] query scores animal heads and the sink; the value is the sink.
        w_query[0, F["count_query"]] = beta * scale
        w_key[0, F["animal_head"]] = 1.0
        w_key[0, F["sink"]] = 1.0
        w_value[0, F["sink"]] = 1.0
        blk.attn.out_proj.weight[F["sink_weight"], 0] = 1.0
        # Head 2 (rows E … 2E − 1): the [colour of X] query scores X's species; the value is the colour.
        for i in range(S):
            w_query[E + i, F["query_species"].start + i] = beta * scale
            w_key[E + i, F["species"].start + i] = 1.0
        for j in range(3):
            w_value[E + j, F["colour"].start + j] = 1.0
            blk.attn.out_proj.weight[F["mean_colour"].start + j, E + j] = 1.0
        # The MLP: 1/(k + 1) → k, the piecewise-linear interpolant through o_k = 1/(k + 1), k = 0 … K.
        K = max_count
        knots = [1.0 / (K + 1 - i) for i in range(K)]  # ascending: 1/(K+1), 1/K, …, 1/2
        slopes = [-(K - i) * (K - i + 1) for i in range(K)]  # on [knots[i], knots[i + 1]]
        fc1, fc2 = blk.mlp.fc1, blk.mlp.fc2
        for i in range(K):
            fc1.weight[i, F["sink_weight"]] = 1.0
            fc1.bias[i] = -knots[i]
            fc2.weight[F["count"], i] = slopes[i] - (slopes[i - 1] if i else 0.0)
        fc2.bias[F["count"]] = float(K)
    return blk.eval()


@dataclass
class TokenSet:
    """One set of tokens ``(N, D)`` with what it holds: the animals ``(species, colour)``, the queries'
    positions, and the question the colour query asks."""

    tokens: Tensor
    animals: list[tuple[str, str]]
    count_query: int
    colour_query: int
    asked_species: str
    kinds: list[str]  # per token: "head", "body", "background", "clutter", "sink", "[count]", "[colour of X]"

    @property
    def count(self) -> int:
        return len(self.animals)

    def colour_answer(self) -> str:
        return next(colour for species, colour in self.animals if species == self.asked_species)


def random_token_set(rng: random.Random, num_animals: int, *, num_background: int = 12) -> TokenSet:
    """A random token set: ``num_animals`` animals (a head and 0–3 body tokens each), background and clutter
    tokens, a sink and the two queries, in random order. The colour query asks about a species of which the
    set holds exactly one animal (when it holds any), as *"what colour is the impala?"* presumes."""
    F = FEATURES
    rows: list[tuple[Tensor, str]] = []
    asked = rng.choice(SPECIES)  # exactly one animal of the asked species (when there are any animals)
    others = [other for other in SPECIES if other != asked]
    animals = [(asked if i == 0 else rng.choice(others), rng.choice(list(COLOURS))) for i in range(num_animals)]
    rng.shuffle(animals)

    def token(kind: str, species: str | None = None, colour=None) -> None:
        x = torch.zeros(DIM)
        if species is not None:
            x[F["species"].start + SPECIES.index(species)] = 1.0
        if colour is not None:
            x[F["colour"]] = torch.tensor(colour)
        if kind == "head":
            x[F["animal_head"]] = 1.0
        rows.append((x, kind))

    for animal_species, animal_colour in animals:
        token("head", animal_species, COLOURS[animal_colour])
        for _ in range(rng.randint(0, 3)):
            token("body", animal_species, COLOURS[animal_colour])
    for _ in range(num_background):
        if rng.random() < 0.3:
            grey = rng.uniform(0.4, 0.65)
            token("clutter", None, (grey, grey, grey))
        else:
            token("background", None, BACKGROUND)
    sink = torch.zeros(DIM)
    sink[F["sink"]] = 1.0
    rows.append((sink, "sink"))
    count_query = torch.zeros(DIM)
    count_query[F["count_query"]] = 1.0
    rows.append((count_query, "[count]"))
    colour_query = torch.zeros(DIM)
    colour_query[F["colour_query"]] = 1.0
    colour_query[F["query_species"].start + SPECIES.index(asked)] = 1.0
    rows.append((colour_query, f"[colour of {asked}]"))
    order = list(range(len(rows)))
    rng.shuffle(order)
    tokens = torch.stack([rows[i][0] for i in order])  # (N, D)
    kinds = [rows[i][1] for i in order]
    return TokenSet(tokens, animals, kinds.index("[count]"), kinds.index(f"[colour of {asked}]"), asked, kinds)


@torch.no_grad()
def answer(block: Block, ts: TokenSet) -> tuple[float, Tensor, str, tuple[Tensor, Tensor]]:
    """Run the block on one token set: ``(count, mean colour, colour name, (count row, colour row))``.

    The rows are the two queries' attention over the tokens (head 1's row of the ``[count]`` query, head 2's
    row of the ``[colour of X]`` query)."""
    F = FEATURES
    y, weights = block(ts.tokens[None], return_weights=True)  # (1, N, D)
    att = weights["self"][0]  # (H, N, N)
    count = float(y[0, ts.count_query, F["count"]])
    colour = y[0, ts.colour_query, F["mean_colour"]].float()
    names = list(COLOURS)
    dist = torch.stack([(colour - torch.tensor(COLOURS[n])).norm() for n in names])
    return count, colour, names[int(dist.argmin())], (att[0, ts.count_query], att[1, ts.colour_query])


def run_demo(out_dir: str | Path, *, seed: int = 0, trials: int = 1000, max_count: int = 20) -> dict:
    """Check the hand-built block on ``trials`` random token sets (every count 0 … ``max_count`` about equally
    often, a ``[colour of X]`` query whenever X is in the set) and draw one set's attention rows.

    Writes ``counting_attention.png`` and ``counting.json`` (the metrics) into ``out_dir``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    block = hand_built_block(max_count)
    count_ok = colour_ok = colour_n = 0
    worst = 0.0
    for t in range(trials):
        n = t % (max_count + 1) if t < 2 * (max_count + 1) else rng.randint(0, max_count)  # every count, twice
        token_set = random_token_set(rng, n, num_background=rng.randint(0, 24))
        count, _, colour, _ = answer(block, token_set)
        worst = max(worst, abs(count - token_set.count))
        count_ok += round(count) == token_set.count
        if token_set.animals:  # the set holds exactly one animal of the asked species
            colour_n += 1
            colour_ok += colour == token_set.colour_answer()
    metrics = {"count_accuracy": count_ok / trials, "count_max_abs_error": worst,
               "colour_accuracy": colour_ok / max(1, colour_n), "trials": trials, "colour_trials": colour_n,
               "max_count": max_count, "beta": BETA, "seed": seed}
    example = random_token_set(random.Random(seed + 1), 4, num_background=10)
    _plot(out / "counting_attention.png", block, example)
    (out / "counting.json").write_text(json.dumps(metrics, indent=2) + "\n")
    logging.getLogger(__name__).info("hand-built counter: %s", metrics)
    return metrics


def _plot(path: Path, block: Block, ts: TokenSet) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    count, colour, name, (row_count, row_colour) = answer(block, ts)
    colours = {"head": "#c0392b", "body": "#e6a09a", "background": "#cccccc", "clutter": "#999999",
               "sink": "#2c6fbb"}
    fig, axes = plt.subplots(2, 1, figsize=(10, 5.6), layout="constrained")
    x = range(len(ts.kinds))
    labels = [k if not k.startswith("[") else k.split(" of")[0] + ("]" if " of" in k else "") for k in ts.kinds]
    for ax, row, title in (
        (axes[0], row_count, f"[count]: weight 1/(k+1) = {1 / (ts.count + 1):.3f} on each of the k = {ts.count} animal "
                             f"heads and the sink; its count dimension holds {count:.4f}"),
        (axes[1], row_colour, f"[colour of {ts.asked_species}]: uniform over the {ts.asked_species}'s tokens; mean "
                              f"colour ({', '.join(f'{v:.2f}' for v in colour.tolist())}) → {name}"),
    ):
        ax.bar(x, row.float().numpy(), color=[colours.get(k, "#f0b400") for k in ts.kinds])
        ax.set_xticks(list(x), labels, rotation=70, fontsize=7)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("attention weight")
        ax.set_title(title, fontsize=9)
    fig.suptitle("The hand-built transformer block: the queries' attention rows (red: animal heads, pink: "
                 "body tokens, blue: the sink)", fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _register() -> None:
    from . import Demo, register_demo

    register_demo(Demo("counting", run_demo, "the transformer built by hand: one block with weights set by formula "
                       "counts animal tokens (a sink makes softmax count) and reads the impala's colour; exact on "
                       "1,000 random token sets; a figure of the attention rows",
                       ("counting_attention.png", "counting.json")))


_register()
