"""Claim 16: heads with different jobs — two lookups the same query must make at once, one by content and one by
place, and two heads; ablating each head costs a different lookup.

Tokens 1 … N−1 carry a key (the keys ``0 … N−2`` in a random order) and a value; token 0 asks for two things at
once: *the value of the token whose key is k* (found by content) and *the value of the token at place p* (found by
position). A one-layer transformer with two heads reads both answers from token 0. One head's row of ``A`` can put
its weight on one token; two tokens must be read, and the two values come from the same table, so a head that
averaged them could not say which value answers which question: each head must take one lookup. Whether they do is
measured by ablation (:func:`~tokennet.attention.ablation.ablated_head`, what ``tokennet heads`` does to a trained
run): each head zeroed in turn, and the accuracy of each lookup.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ...attention.ablation import ablated_head
from ...attention.multihead import MultiHeadAttention
from ...layers.mlp import MLP
from ._registry import Result, claim, plt, png

__all__ = ["TwoLookups", "lookup_batch", "train_two_lookups", "head_costs", "GROUPS"]

GROUPS = ("by key", "by place")


def lookup_batch(g: torch.Generator, B: int, N: int = 10, V: int = 8) -> dict[str, Tensor]:
    """``keys``, ``values`` ``(B, N)`` (token 0: no key, no value: ids ``N − 1`` and ``V``), the asked ``key`` and
    ``place`` ``(B,)``, and the two answers: ``by key`` (the value of the token with that key) and ``by place``."""
    K = N - 1
    keys = torch.argsort(torch.rand(B, K, generator=g), dim=1)  # (B, K): a random order of the K keys
    values = torch.randint(0, V, (B, K), generator=g)
    asked, place = torch.randint(0, K, (B,), generator=g), torch.randint(1, N, (B,), generator=g)
    rows = torch.arange(B)
    found = (keys == asked[:, None]).long().argmax(1)  # (B,): where the asked key is, among tokens 1 … N−1
    return {"keys": torch.cat([torch.full((B, 1), K), keys], 1),
            "values": torch.cat([torch.full((B, 1), V), values], 1),
            "key": asked, "place": place, "by key": values[rows, found], "by place": values[rows, place - 1]}


class TwoLookups(nn.Module):
    """``batch → (logits by key, logits by place)``: key + value + position embeddings (token 0: the asked key and
    place), ``x + MSA(LN x)`` with ``heads`` heads, ``x + MLP(LN x)``, two linear read-outs of token 0."""

    def __init__(self, N: int = 10, V: int = 8, dim: int = 32, heads: int = 2):
        super().__init__()
        self.key, self.value = nn.Embedding(N, dim), nn.Embedding(V + 1, dim)
        self.asked_key, self.asked_place = nn.Embedding(N - 1, dim), nn.Embedding(N, dim)
        self.position = nn.Parameter(torch.randn(N, dim) * 0.5)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = MultiHeadAttention(dim, heads)
        self.mlp = MLP(dim, mlp_ratio=2.0)
        self.read = nn.ModuleDict({"key": nn.Linear(dim, V), "place": nn.Linear(dim, V)})

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        x = self.key(batch["keys"]) + self.value(batch["values"]) + self.position  # (B, N, D)
        query = self.asked_key(batch["key"]) + self.asked_place(batch["place"])  # (B, D)
        x = torch.cat([x[:, :1] + query[:, None], x[:, 1:]], 1)
        x = x + self.attn(self.norm1(x))
        x = x + self.mlp(self.norm2(x))
        summary = self.norm3(x[:, 0])  # (B, D): token 0, where both answers are read
        return self.read["key"](summary), self.read["place"](summary)


def _accuracy(model: TwoLookups, batch: dict[str, Tensor]) -> dict[str, float]:
    with torch.no_grad():
        by_key, by_place = model(batch)
    return {"by key": float((by_key.argmax(-1) == batch["by key"]).float().mean()),
            "by place": float((by_place.argmax(-1) == batch["by place"]).float().mean())}


def train_two_lookups(seed: int = 0, *, steps: int = 600, B: int = 64, heads: int = 2) -> TwoLookups:
    """Adam on fresh batches, both answers' cross-entropy summed."""
    torch.manual_seed(seed)
    model = TwoLookups(heads=heads)
    rng = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        batch = lookup_batch(rng, B)
        by_key, by_place = model(batch)
        loss = F.cross_entropy(by_key, batch["by key"]) + F.cross_entropy(by_place, batch["by place"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return model.eval()


def head_costs(model: TwoLookups, seed: int = 0, n: int = 2000) -> dict:
    """Held-out accuracy of each lookup, unablated and with each head zeroed; ``cost``: points lost per head."""
    batch = lookup_batch(torch.Generator().manual_seed(10_000 + seed), n)
    base = _accuracy(model, batch)
    ablated = {}
    for head in range(model.attn.num_heads):
        with ablated_head(model.attn, head):
            ablated[head] = _accuracy(model, batch)
    cost = {head: {group: round(100 * (base[group] - acc[group]), 1) for group in GROUPS}
            for head, acc in ablated.items()}
    return {"accuracy": base, "ablated": ablated, "cost": cost}


def different_jobs(costs: dict) -> tuple[bool, dict[int, str]]:
    """Whether each head's ablation costs ≥ 40 points on one lookup and ≤ 10 on the other, a different lookup for
    each head; and each head's job (the lookup its ablation costs most)."""
    jobs = {head: max(GROUPS, key=lambda group, head=head: costs[head][group]) for head in costs}
    apart = all(costs[head][job] >= 40 and min(costs[head].values()) <= 10 for head, job in jobs.items())
    return apart and len(set(jobs.values())) == len(jobs), jobs


def _example_rows(model: TwoLookups, seed: int) -> tuple[Tensor, int, int]:
    """Token 0's row of ``A`` in each head ``(H, N)`` for one held-out example whose two answers are at different
    tokens, with the token holding the asked key and the asked place."""
    batch = lookup_batch(torch.Generator().manual_seed(20_000 + seed), 64)
    found = (batch["keys"] == batch["key"][:, None]).long().argmax(1)  # (B,): the token with the asked key
    pick = int((found != batch["place"]).nonzero()[0])
    one = {name: value[pick:pick + 1] for name, value in batch.items()}
    seen = {}
    handle = model.attn.register_forward_hook(lambda module, args, _out: seen.update(x=args[0]))
    with torch.no_grad():
        model(one)
    handle.remove()
    _, weights = model.attn(seen["x"], return_weights=True)
    return weights[0, :, 0].detach(), int(found[pick]), int(one["place"])


def _figure(costs: dict, rows: Tensor, found: int, place: int):
    pyplot = plt()
    fig, axes = pyplot.subplots(1, 2, figsize=(10, 3.2), gridspec_kw={"width_ratios": [1, 2]})
    grid = [[costs[head][group] for group in GROUPS] for head in costs]
    axes[0].imshow(grid, cmap="Reds", vmin=0, vmax=100)
    for head, values in enumerate(grid):
        for col, value in enumerate(values):
            axes[0].text(col, head, f"{value:.0f}", ha="center", va="center", fontsize=9,
                         color="white" if value > 50 else "black")
    axes[0].set_xticks(range(len(GROUPS)), GROUPS)
    axes[0].set_yticks(range(len(grid)), [f"head {head}" for head in costs])
    axes[0].set_title("accuracy points lost, head zeroed", fontsize=9)
    width = 0.8 / len(rows)
    for head, row in enumerate(rows):
        axes[1].bar(torch.arange(len(row)) + head * width, row, width, label=f"head {head}")
    axes[1].axvline(found + width / 2, color="grey", ls=":", label=f"token {found}: the asked key")
    axes[1].axvline(place + width / 2, color="black", ls="--", label=f"token {place}: the asked place")
    axes[1].set_xlabel("token"), axes[1].set_ylabel("token 0's attention"), axes[1].legend(fontsize=7)
    axes[1].set_title("one held-out example: where each head looks", fontsize=9)
    fig.suptitle("two lookups, two heads: each head has one job", fontsize=10)
    return png(fig)


@claim("heads-have-jobs", "16")
def claim_heads_have_jobs(seed: int = 0) -> Result:
    """"I can have k attention layers in parallel, and then I can aggregate them. And each attention layer can be
    attending to different things. One can learn to attend to shapes and one can learn to attend to textures, for
    example."

    A one-layer transformer with two heads, trained on two lookups its query token makes at once — a value found
    by its key (content) and one found by its place (position) — then each head zeroed in turn: it holds when both
    lookups are learned (≥ 90 %) and each head's ablation costs ≥ 40 points on one lookup and ≤ 10 on the other, a
    different lookup for each. On the trained default vqa runs the same measurement is ``tokennet heads RUN``
    (``bench/vqa_heads.py``, figures in ``bench/results/vqa_heads.json``).
    """
    steps = 600
    model = train_two_lookups(seed, steps=steps)
    res = head_costs(model, seed)
    apart, jobs = different_jobs(res["cost"])
    holds = min(res["accuracy"].values()) >= 0.9 and apart
    measured = (f"accuracy by key {res['accuracy']['by key']:.0%}, by place {res['accuracy']['by place']:.0%}; "
                + "; ".join(f"head {head} zeroed: −{cost['by key']:.0f} points by key, −{cost['by place']:.0f} by "
                            f"place" for head, cost in res["cost"].items()))
    rows, found, place = _example_rows(model, seed)
    data = {**res, "jobs": jobs, "steps": steps, "attention_example": {"rows": rows.tolist(), "asked_key_token": found,
                                                                       "asked_place": place}}
    return Result(f"attention (2 heads) + MLP, D=32, N=10, V=8, {steps} Adam steps; 2,000 held-out examples", measured,
                  holds, _figure(res["cost"], rows, found, place), data)
