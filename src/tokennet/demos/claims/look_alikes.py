"""Claim 19: a token unsure of what it is attends to the tokens that look like it and comes out surer.

Objects made of several tokens: each object has a class and an appearance of its own, and each of its tokens shows
``[prototype[class] + noise, appearance[object]]`` — alone, a token's class is a guess (the noise is as large as the
prototypes' distances); the appearance says which tokens belong together. A two-layer transformer is trained to name
every token's class. A **linear probe** (:func:`~tokennet.linear_probe.linear_probe`) then reads the class from each
token at the trunk's input and after each block, on held-out scenes; the same trained model is probed again with
attention cut, in every layer, from a token to the other tokens of its own object (``own``). The lecture's account
predicts the probe rises with depth (the token averaged its look-alikes) and rises less when the look-alikes are hidden.
``tokennet probe RUN`` measures the same on a trained vqa run's animal patches.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ...layers.stack import Encoder
from ...linear_probe import linear_probe
from ._registry import Result, claim, plt, png

__all__ = ["ObjectScenes", "scene_batch", "train_look_alikes", "probe_depths"]

OBJECTS, TOKENS_PER_OBJECT, CLASSES = 4, 4, 4
SHAPE, LOOK = 8, 4  # a token's features: its class's prototype plus noise (SHAPE), its object's appearance (LOOK)
FEATURES = SHAPE + LOOK
NOISE = 1.0  # each shape feature's noise, against prototypes of norm 1.5: alone, a token names its class ~60 % of
# the time


class ObjectScenes:
    """Draws scenes: ``x (B, N, SHAPE + LOOK)``, each token's ``label (B, N)`` and ``object (B, N)`` (``N = OBJECTS ×
    TOKENS_PER_OBJECT``, the tokens of the objects shuffled together). The class prototypes are fixed by ``seed``."""

    def __init__(self, seed: int):
        generator = torch.Generator().manual_seed(seed)
        prototypes = torch.randn(CLASSES, SHAPE, generator=generator)
        self.prototypes = 1.5 * prototypes / prototypes.norm(dim=1, keepdim=True)

    def __call__(self, generator: torch.Generator, batch: int) -> dict[str, Tensor]:
        return scene_batch(self.prototypes, generator, batch)


def scene_batch(prototypes: Tensor, generator: torch.Generator, batch: int) -> dict[str, Tensor]:
    """One batch of scenes from ``prototypes (C, F)`` (see :class:`ObjectScenes`)."""
    tokens = OBJECTS * TOKENS_PER_OBJECT
    classes = torch.randint(0, CLASSES, (batch, OBJECTS), generator=generator)
    appearance = torch.randn(batch, OBJECTS, LOOK, generator=generator)
    order = torch.argsort(torch.rand(batch, tokens, generator=generator), dim=1)
    objects = order // TOKENS_PER_OBJECT  # (B, N): each token's object, in a random order
    label = classes.gather(1, objects)
    shape = prototypes[label] + NOISE * torch.randn(batch, tokens, SHAPE, generator=generator)
    look = appearance.gather(1, objects[..., None].expand(-1, -1, LOOK))
    return {"x": torch.cat([shape, look], -1), "label": label, "object": objects}


class TokenClassifier(nn.Module):
    """Tokens ``(B, N, F)`` → class logits per token: a linear map to width ``dim``, a pre-norm encoder (no
    positions: the tokens are a set), a linear readout."""

    def __init__(self, dim: int = 32, layers: int = 2, heads: int = 2):
        super().__init__()
        self.embed = nn.Linear(FEATURES, dim)
        self.encoder = Encoder(dim, layers, heads)
        self.read = nn.Linear(dim, CLASSES)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        return self.read(self.encoder(self.embed(x), mask=mask))


def train_look_alikes(seed: int = 0, *, steps: int = 800, batch: int = 64) -> tuple[TokenClassifier, ObjectScenes]:
    """Adam on fresh scenes, every token's cross-entropy."""
    torch.manual_seed(seed)
    scenes, model = ObjectScenes(seed), TokenClassifier()
    generator = torch.Generator().manual_seed(seed + 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        drawn = scenes(generator, batch)
        loss = F.cross_entropy(model(drawn["x"]).flatten(0, 1), drawn["label"].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return model.eval(), scenes


@torch.no_grad()
def _depth_states(model: TokenClassifier, x: Tensor, mask: Tensor | None) -> list[Tensor]:
    """The residual stream at the encoder's input and after each block, ``(B·N, dim)`` each."""
    states = [model.embed(x)]
    for block in model.encoder.layers():
        states.append(block(states[-1], mask=mask))
    return [state.flatten(0, 1) for state in states]


def probe_depths(model: TokenClassifier, scenes: ObjectScenes, seed: int, count: int = 600) -> dict[str, list[float]]:
    """Probe accuracy (%) per depth, the model as trained (``none``) and with each token's own object's other tokens
    hidden (``own``); fit on the first 2/3 of ``count`` held-out scenes, scored on the rest."""
    drawn = scenes(torch.Generator().manual_seed(50_000 + seed), count)
    same_object = drawn["object"][:, :, None] == drawn["object"][:, None, :]  # (B, N, N)
    own_cut = (~same_object | torch.eye(same_object.shape[1], dtype=torch.bool))[:, None]  # (B, 1, N, N)
    labels = drawn["label"].flatten()
    split = (2 * count // 3) * drawn["label"].shape[1]
    out = {}
    for cut, mask in (("none", None), ("own", own_cut)):
        states = _depth_states(model, drawn["x"], mask)
        out[cut] = [linear_probe(state[:split], labels[:split], state[split:], labels[split:], CLASSES)
                    for state in states]
    return out


def verdict(depths: dict[str, list[float]]) -> bool:
    """Holds when the probe gains ≥ 15 points from the input to the last block, and hiding the token's own object
    takes ≥ 10 points of that gain away."""
    gain = depths["none"][-1] - depths["none"][0]
    return gain >= 15 and depths["none"][-1] - depths["own"][-1] >= 10


def _figure(depths: dict[str, list[float]]):
    pyplot = plt()
    fig, axis = pyplot.subplots(figsize=(5, 3.2))
    for cut, label in (("none", "as trained"), ("own", "own object's other tokens hidden")):
        axis.plot(range(len(depths[cut])), depths[cut], marker="o", label=label)
    axis.set_xticks(range(len(depths["none"])), ["input", *(f"block {i}" for i in range(len(depths["none"]) - 1))])
    axis.set_ylabel("linear probe: class accuracy (%)")
    axis.axhline(100 / CLASSES, color="grey", ls=":", label="chance")
    axis.legend(fontsize=7)
    axis.set_title("a token learns what it is from its look-alikes", fontsize=9)
    return png(fig)


@claim("look-alikes", "19")
def claim_look_alikes(seed: int = 0) -> Result:
    """"If this patch wants to get a better estimate of what it is, maybe it should attend to other things that are
    similar, and then ensemble or average the results to now say, I'm not sure if I'm an impala or I'm a gazelle or
    what I am. So I will attend to other things that look like me in the image."

    Scenes of 4 objects × 4 tokens, each token its class's prototype plus its object's appearance plus noise; a
    two-layer transformer trained to name each token's class; a linear probe of the class per depth, as trained and
    with each token's own object hidden from it. Holds when the probe gains ≥ 15 points from the input to the last
    block and the cut takes ≥ 10 of them away.
    """
    steps = 800
    model, scenes = train_look_alikes(seed, steps=steps)
    depths = probe_depths(model, scenes, seed)
    measured = (f"probe at the input {depths['none'][0]:.1f} %, after the last block {depths['none'][-1]:.1f} %; "
                f"own object hidden: {depths['own'][-1]:.1f} % (chance {100 / CLASSES:.0f} %)")
    return Result(f"4 objects × 4 tokens, {CLASSES} classes, noise {NOISE}; encoder D=32, 2 layers, 2 heads, {steps} "
                  "Adam steps; probe fit on 400 held-out scenes, scored on 200", measured, verdict(depths),
                  _figure(depths), {"depths": depths, "steps": steps})
