"""Claims 4–6, on small seeded tasks: a fixed mixing matrix W against attention's data-dependent A; W_v = I;
positions concatenated instead of added.

The model is the smallest transformer that can do each task: token and attribute embeddings, positions, one residual
mixing layer and one MLP (pre-norm), a linear head read at token 0 — built from tokennet's own layers.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ...attention.multihead import MultiHeadAttention
from ...layers.mixer import TokenMixing
from ...layers.mlp import MLP
from ...position.concat import with_position_mode
from ...position.learned import LearnedPosition
from ._registry import Result, claim, plt, png

__all__ = ["MixerNet", "recall_batch", "index_batch", "train_task", "compare_mixers", "compare_value_proj",
           "compare_position_modes"]


def recall_batch(g: torch.Generator, B: int, N: int = 16, V: int = 16) -> tuple[Tensor, Tensor, Tensor]:
    """*Associative recall*: tokens 1 … N−1 are (key, value) pairs, keys ``0 … N−2`` in a random order, values
    random; token 0 is a query naming one key (id ``N − 1 + key``) with no value (id ``V``); the answer is that
    key's value. Which token to read depends on the query: on the input, not on a place.

    Returns ``keys (B, N)``, ``values (B, N)`` and ``targets (B,)``."""
    K = N - 1
    keys = torch.argsort(torch.rand(B, K, generator=g), dim=1)  # (B, K): a random order of the K keys
    values = torch.randint(0, V, (B, K), generator=g)
    asked = torch.randint(0, K, (B,), generator=g)
    target = values[torch.arange(B), asked]
    where = (keys == asked[:, None]).long().argmax(1)  # (B,): the asked key's place
    assert bool((keys[torch.arange(B), where] == asked).all())
    ids = torch.cat([(K + asked)[:, None], keys], dim=1)  # (B, N)
    vals = torch.cat([torch.full((B, 1), V), values], dim=1)  # (B, N)
    return ids, vals, target


def index_batch(g: torch.Generator, B: int, N: int = 12, V: int = 16) -> tuple[Tensor, Tensor, Tensor]:
    """*Read the token at a given place*: token 0 names a place ``i`` (id ``V + i``), tokens 1 … N−1 are random
    symbols; the answer is token ``i``. Without positions a set model cannot tell the places apart."""
    ids = torch.randint(0, V, (B, N), generator=g)
    where = torch.randint(1, N, (B,), generator=g)
    ids[:, 0] = V + where
    return ids, torch.full((B, N), V), ids[torch.arange(B), where]


class MixerNet(nn.Module):
    """``ids, attrs (B, N) → logits (B, V)``: embed both (an attribute: a value, or none), positions,
    ``x + mix(LN x)``, ``x + MLP(LN x)``, a head on token 0.

    Args:
        vocab: input ids; classes: answers (the attributes take ``classes + 1`` ids: one means none).
        N: tokens; dim: width D.
        mixer: ``"attention"`` (A = softmax(Q Kᵀ/√E)), ``"softmax-W"`` (a learned W, row-softmaxed) or
            ``"free-W"`` (a learned W used as it is).
        value_proj: attention's ``W_v`` learned (True) or the identity (False).
        position_mode: ``"add"``, ``"concat"`` (the last ``dim // 2`` dimensions hold the position) or
            ``"none"``.
    """

    def __init__(self, vocab: int, classes: int, N: int, dim: int = 32, *, mixer: str = "attention",
                 value_proj: bool = True, position_mode: str = "add", heads: int = 1):
        super().__init__()
        pos_dim = dim // 2 if position_mode == "concat" else dim
        tok_dim = dim - pos_dim if position_mode == "concat" else dim
        self.tok = nn.Embedding(vocab, tok_dim)
        self.attr = nn.Embedding(classes + 1, tok_dim)
        self.pos = None if position_mode == "none" else with_position_mode(LearnedPosition(N, pos_dim, 0.5),
                                                                           position_mode, pos_dim)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        if mixer == "attention":
            self.mix = MultiHeadAttention(dim, heads, value_proj=value_proj)
        elif mixer in ("softmax-W", "free-W"):
            self.mix = TokenMixing(dim, N, free=mixer == "free-W")
        else:
            raise ValueError(f"unknown mixer {mixer!r}")
        self.mlp = MLP(dim, mlp_ratio=2.0)
        self.head = nn.Linear(dim, classes)

    def forward(self, ids: Tensor, attrs: Tensor) -> Tensor:
        x = self.tok(ids) + self.attr(attrs)  # (B, N, D or D − D_p)
        if self.pos is not None:
            x = self.pos(x)  # (B, N, D)
        x = x + self.mix(self.norm1(x))
        x = x + self.mlp(self.norm2(x))
        return self.head(self.norm3(x[:, 0]))  # (B, classes)


def train_task(model: MixerNet, batch, *, seed: int, steps: int, lr: float = 3e-3, B: int = 64,
               eval_size: int = 1000) -> dict:
    """Adam on fresh batches; accuracy on ``eval_size`` held-out examples (another seed's stream)."""
    rng = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    model.train()
    for _ in range(steps):
        ids, attrs, y = batch(rng, B)
        loss = F.cross_entropy(model(ids, attrs), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    with torch.no_grad():
        ids, attrs, y = batch(torch.Generator().manual_seed(10_000 + seed), eval_size)
        acc = float((model(ids, attrs).argmax(-1) == y).float().mean())
    return {"accuracy": acc, "losses": losses, "params": sum(param.numel() for param in model.parameters())}


def compare_mixers(seed: int = 0, *, steps: int = 400, N: int = 16, V: int = 16, dim: int = 32, B: int = 64) -> dict:
    """Associative recall with attention, a row-softmaxed W and a free W (the same model otherwise)."""
    out = {}
    for mixer in ("attention", "softmax-W", "free-W"):
        torch.manual_seed(seed)
        model = MixerNet(2 * (N - 1), V, N, dim, mixer=mixer)
        out[mixer] = train_task(model, lambda rng, B: recall_batch(rng, B, N, V), seed=seed, steps=steps, B=B)
    return {"runs": out, "chance": 1 / V, "N": N, "V": V, "steps": steps}


def _curves(runs: dict, title: str, chance: float):
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(6.4, 3.2))
    for name, run in runs.items():
        losses = torch.tensor(run["losses"])
        smooth = losses.unfold(0, 20, 1).mean(-1) if len(losses) > 20 else losses
        ax.plot(smooth.numpy(), label=f"{name}: held-out accuracy {run['accuracy']:.0%}")
    ax.axhline(-torch.log(torch.tensor(chance)).item(), color="grey", ls=":", lw=1, label="chance (log V)")
    ax.set_xlabel("step"), ax.set_ylabel("training loss"), ax.legend(fontsize=7)
    ax.set_title(title, fontsize=9)
    return png(fig)


@claim("fixed-W-vs-attention", "4")
def claim_fixed_w(seed: int = 0) -> Result:
    """"Currently, the architecture of NN has no way of identifying which tokens are relevant and which tokens are
    not. We would like our NN architecture to weight our tokens based on how relevant they are to the query."

    A fixed learned mixing ``T_out = W T_in`` (free, or row-softmaxed) against attention's data-dependent
    ``A = softmax(Q Kᵀ/√m)`` on a task where which token to read depends on the input: associative recall (the
    query names a key; keys in a random order).
    """
    res = compare_mixers(seed)
    acc = {k: v["accuracy"] for k, v in res["runs"].items()}
    holds = acc["attention"] > 0.9 and max(acc["softmax-W"], acc["free-W"]) < 0.5
    measured = (f"held-out accuracy: attention {acc['attention']:.0%}, row-softmaxed W {acc['softmax-W']:.0%}, "
                f"free W {acc['free-W']:.0%} (chance {res['chance']:.0%})")
    fig = _curves(res["runs"], "associative recall: a fixed W cannot choose where to read", res["chance"])
    data = {"accuracy": acc, "chance": res["chance"], "steps": res["steps"],
            "params": {k: v["params"] for k, v in res["runs"].items()}}
    return Result(f"one mixing layer + MLP, D=32, N={res['N']}, V={res['V']}, {res['steps']} Adam steps each", measured,
                  holds, fig, data)


def compare_value_proj(seed: int = 0, *, steps: int = 400, N: int = 16, V: int = 16, dim: int = 32,
                       B: int = 64) -> dict:
    """Associative recall with attention, learned ``W_v`` against ``W_v = I``."""
    out = {}
    for name, value_proj in (("learned W_v", True), ("W_v = I", False)):
        torch.manual_seed(seed)
        model = MixerNet(2 * (N - 1), V, N, dim, value_proj=value_proj)
        out[name] = train_task(model, lambda rng, B: recall_batch(rng, B, N, V), seed=seed, steps=steps, B=B)
    return {"runs": out, "chance": 1 / V, "N": N, "V": V, "steps": steps, "dim": dim}


@claim("identity-value", "5")
def claim_identity_value(seed: int = 0) -> Result:
    """"One could simply take W_v to be the identity; it's just extra expressivity."

    Attention with ``value_proj=False`` (``V = T``, no ``W_v``) against a learned ``W_v``, on associative recall.
    On the models it is a config option of every transformer family (``--set value_proj=false``); a ViT on digits
    with it is a row of ``bench/position_mode.py`` (figures in ``bench/results/position_mode.json``).
    """
    res = compare_value_proj(seed)
    learned, identity = res["runs"]["learned W_v"], res["runs"]["W_v = I"]
    holds = learned["accuracy"] > 0.9 and identity["accuracy"] > 0.9 \
        and learned["params"] - identity["params"] == res["dim"] ** 2 + res["dim"]
    measured = (f"held-out accuracy {learned['accuracy']:.0%} with W_v, {identity['accuracy']:.0%} with W_v = I "
                f"({learned['params'] - identity['params']} fewer parameters: D² + D)")
    fig = _curves(res["runs"], "associative recall: W_v learned or the identity", res["chance"])
    data = {"accuracy": {k: v["accuracy"] for k, v in res["runs"].items()},
            "params": {k: v["params"] for k, v in res["runs"].items()}, "steps": res["steps"]}
    return Result(f"attention + MLP, D=32, N={res['N']}, {res['steps']} steps, value_proj=true vs false", measured,
                  holds, fig, data)


def compare_position_modes(seed: int = 0, *, steps: int = 400, N: int = 12, V: int = 16, dim: int = 32,
                           B: int = 64) -> dict:
    """The read-at-a-place task with no positions, added positions and concatenated positions."""
    out = {}
    for mode in ("none", "add", "concat"):
        torch.manual_seed(seed)
        model = MixerNet(V + N, V, N, dim, position_mode=mode)
        out[mode] = train_task(model, lambda rng, B: index_batch(rng, B, N, V), seed=seed, steps=steps, B=B)
    return {"runs": out, "chance": 1 / V, "N": N, "V": V, "steps": steps}


@claim("concat-positions", "6")
def claim_concat_positions(seed: int = 0) -> Result:
    """"So anyway, I can concatenate each token with a value that tells me where it came from in the input
    signal. What position was it in the input sentence?"

    ``position_mode=concat`` (the token's content in D/2 dimensions, its learned position in the other D/2)
    against added positions and none, on a task that needs positions: read the token at a place the query names.
    On real models it is an option of the encoders that take added positions (ViT, the text encoder:
    ``--set position_mode=concat pos_dim=16``); the ablation on a ViT trained on scikit-learn's digits (added,
    concatenated, no positions) is ``bench/position_mode.py``, its figures in ``bench/results/position_mode.json``.
    """
    res = compare_position_modes(seed)
    acc = {k: v["accuracy"] for k, v in res["runs"].items()}
    holds = acc["concat"] > 0.9 and acc["add"] > 0.9 and acc["none"] < 0.3
    measured = (f"held-out accuracy: concatenated {acc['concat']:.0%}, added {acc['add']:.0%}, "
                f"no positions {acc['none']:.0%} (chance {res['chance']:.0%})")
    fig = _curves(res["runs"], "read the token at the named place: positions added, concatenated, none", res["chance"])
    return Result(f"attention + MLP, D=32, N={res['N']}, {res['steps']} steps per position mode", measured, holds, fig,
                  {"accuracy": acc, "steps": res["steps"], "chance": res["chance"]})
