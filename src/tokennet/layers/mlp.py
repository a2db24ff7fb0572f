"""The position-wise MLP of a transformer block: ``MLP(x) = W₂ σ(W₁ x + b₁) + b₂``, per token.

Gated (GLU variants, Shazeer 2020, https://arxiv.org/abs/2002.05202): ``MLP(x) = W₂ (σ(W_g x) ⊙ W₁ x)``;
with σ = SiLU this is SwiGLU, the MLP of Llama.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["MLP", "ACTIVATIONS", "ReLU2"]


class ReLU2(nn.Module):
    """Squared ReLU, ``σ(x) = max(x, 0)²`` (So et al. 2021, Primer, https://arxiv.org/abs/2109.08668).

    As cheap as ReLU, smooth at 0 in value; Primer found it trains language models to a given loss in
    fewer steps than GELU (modded-nanogpt uses it).
    """

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(x).square()


ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU, "gelu_tanh": lambda: nn.GELU(approximate="tanh"), "silu": nn.SiLU,
               "relu2": ReLU2}


class MLP(nn.Module):
    """Two linear layers with a nonlinearity in between, applied to every token independently.

    Args:
        dim: input and output width D.
        hidden_dim: inner width (default ``mlp_ratio · dim``).
        mlp_ratio: inner width as a multiple of ``dim`` when ``hidden_dim`` is not given.
        activation: ``"gelu"`` (ViT, GPT), ``"relu"`` (the original Transformer), ``"gelu_tanh"`` (GPT-2),
            ``"silu"`` or ``"relu2"`` (squared ReLU, Primer).
        dropout: dropout after the activation and after the output projection.
        bias: use biases.
        gated: a gated MLP with a third projection ``gate`` (SwiGLU with ``activation="silu"``).
    """

    def __init__(
        self,
        dim: int,
        hidden_dim: int | None = None,
        *,
        mlp_ratio: float = 4.0,
        activation: str = "gelu",
        dropout: float = 0.0,
        bias: bool = True,
        gated: bool = False,
    ):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; expected one of {', '.join(ACTIVATIONS)}")
        hidden_dim = int(round(mlp_ratio * dim)) if hidden_dim is None else hidden_dim
        if hidden_dim < 1:
            raise ValueError(f"hidden_dim must be positive, got {hidden_dim}")
        self.fc1 = nn.Linear(dim, hidden_dim, bias=bias)
        self.gate = nn.Linear(dim, hidden_dim, bias=bias) if gated else None
        self.act = ACTIVATIONS[activation]()
        self.fc2 = nn.Linear(hidden_dim, dim, bias=bias)
        self.drop = (nn.Dropout(dropout) if dropout > 0 else nn.Identity())

    def forward(self, x: Tensor) -> Tensor:
        """``(B, N, D) → (B, N, D)``."""
        h = self.act(self.fc1(x)) if self.gate is None else self.act(self.gate(x)) * self.fc1(x)  # (B, N, hidden)
        return self.drop(self.fc2(self.drop(h)))
