"""Claim 17 (issue 62): the patch matrix ``W_tokenize`` may be learned or hard-coded.

The same small ViT (:class:`TinyViT`: tokennet's :class:`~tokennet.tokens.image.PatchEmbed`, learned 2-D positions, an
:class:`~tokennet.layers.stack.Encoder`, mean pooling) on scikit-learn's 8×8 digits, three times: its patch matrix
learned, fixed at random, or fixed to the patch's 2-D DCT basis (``projection``, the ViT's ``patch_projection``); the
same seed, batches and steps. The recipe's own runs (``tokennet train vit --set patch_projection=P``, three seeds) are
in ``bench/results/patch_projection.json`` (``python bench/patch_projection.py``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ...layers.stack import Encoder
from ...position.learned import LearnedPosition2D
from ...tokens.image import PatchEmbed
from ._registry import Result, claim, plt, png

__all__ = ["compare_projections", "digits", "TinyViT", "PROJECTIONS", "MARGIN"]

PROJECTIONS = ("learned", "random", "dct")
MARGIN = 0.05  # a hard-coded matrix "could" stand in for the learned one: within 5 points of its accuracy


class TinyViT(nn.Module):
    """``T = patchify(x) E + b + P`` (overlapping 4×4 patches at stride 2: 3 × 3 tokens) → Encoder → mean → head."""

    def __init__(self, projection: str, dim: int = 32, layers: int = 2, heads: int = 2):
        super().__init__()
        self.patch_embed = PatchEmbed(1, dim, 4, 2, projection=projection)
        self.positions = LearnedPosition2D((3, 3), dim)
        self.blocks = Encoder(dim, layers, heads, mlp_ratio=2.0)
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 10))

    def forward(self, images: Tensor) -> Tensor:
        """``(B, 1, 8, 8)`` → logits ``(B, 10)``."""
        tokens = self.positions(self.patch_embed(images))  # (B, 9, D)
        return self.head(self.blocks(tokens).mean(dim=1))


def digits() -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """scikit-learn's 8×8 digits, pixels in [0, 1], split as its example (the first half trains)."""
    from sklearn.datasets import load_digits

    images, labels = load_digits(return_X_y=True)
    x = torch.tensor(images, dtype=torch.float32).view(-1, 1, 8, 8) / 16
    y = torch.tensor(labels)
    half = len(x) // 2
    return x[:half], y[:half], x[half:], y[half:]


def _train_one(projection: str, seed: int, data, *, steps: int, batch_size: int) -> dict:
    """One ViT with this patch projection: held-out accuracy after ``steps`` AdamW steps."""
    x_train, y_train, x_test, y_test = data
    torch.manual_seed(seed)
    model = TinyViT(projection)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    batches = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        index = torch.randint(len(x_train), (batch_size,), generator=batches)
        loss = F.cross_entropy(model(x_train[index]), y_train[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        accuracy = float((model.eval()(x_test).argmax(-1) == y_test).float().mean())
    return {"accuracy": accuracy, "trained_parameters": sum(weight.numel() for weight in model.parameters())}


def compare_projections(seed: int = 0, *, steps: int = 300, batch_size: int = 64) -> dict:
    """Each patch projection's held-out accuracy on the digits (899 test images, chance one in ten)."""
    data = digits()
    return {"steps": steps, "runs": {projection: _train_one(projection, seed, data, steps=steps,
                                                            batch_size=batch_size)
                                     for projection in PROJECTIONS}}


@claim("patch-projection", "17")
def claim_patch_projection(seed: int = 0) -> Result:
    """"You could use some matrix that you multiply the pixel values by W tokenize to get a D dimensional vector. And
    that could be a learned matrix, or it could be somehow hard-coded."

    Measured: a 2-block ViT (D = 32, overlapping 4×4 patches) on the digits with its patch matrix learned, fixed at
    random (Gaussian, variance 1/16) or fixed to the 16 DCT frequencies of the patch (zero-padded to 32), never
    trained; it holds when both hard-coded matrices come within 5 points of the learned one's held-out accuracy.
    """
    result = compare_projections(seed)
    accuracy = {name: run["accuracy"] for name, run in result["runs"].items()}
    holds = all(accuracy[name] >= accuracy["learned"] - MARGIN for name in ("random", "dct"))
    measured = ", ".join(f"{name} {accuracy[name]:.1%}" for name in PROJECTIONS) + " held-out accuracy"
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(4.5, 3))
    ax.bar(list(PROJECTIONS), [accuracy[name] for name in PROJECTIONS], color=["#5b8fd1", "#999", "#d18a5b"])
    ax.set_ylim(0, 1), ax.set_ylabel("held-out accuracy"), ax.axhline(0.1, ls=":", c="k", lw=1)
    ax.set_title("W_tokenize learned or hard-coded (digits)", fontsize=10)
    return Result(f"ViT on the 8×8 digits, {result['steps']} steps, patch matrix learned / random / DCT", measured,
                  holds, png(fig), result)
