"""The position-wise MLP of a transformer block: ``MLP(x) = W₂ σ(W₁ x + b₁) + b₂``, per token.

Gated (GLU variants, Shazeer 2020, https://arxiv.org/abs/2002.05202): ``MLP(x) = W₂ (σ(W_g x) ⊙ W₁ x)``;
with σ = SiLU this is SwiGLU, the MLP of Llama.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..dropout import Dropout

__all__ = ["MLP", "GatedMLP", "ACTIVATIONS", "ReLU2"]


class ReLU2(nn.Module):
    """Squared ReLU, ``σ(x) = max(x, 0)²`` (So et al. 2021, Primer, https://arxiv.org/abs/2109.08668).

    As cheap as ReLU, smooth at 0 in value; Primer found it trains language models to a given loss in
    fewer steps than GELU (modded-nanogpt uses it).
    """

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(x).square()


ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU, "gelu_tanh": lambda: nn.GELU(approximate="tanh"), "silu": nn.SiLU,
               "relu2": ReLU2}


def _hidden(dim: int, hidden_dim: int | None, mlp_ratio: float, activation: str) -> int:
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; expected one of {', '.join(ACTIVATIONS)}")
    hidden_dim = int(round(mlp_ratio * dim)) if hidden_dim is None else hidden_dim
    if hidden_dim < 1:
        raise ValueError(f"hidden_dim must be positive, got {hidden_dim}")
    return hidden_dim


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
    """

    def __init__(self, dim: int, hidden_dim: int | None = None, *, mlp_ratio: float = 4.0, activation: str = "gelu",
                 dropout: float = 0.0, bias: bool = True):
        super().__init__()
        hidden_dim = _hidden(dim, hidden_dim, mlp_ratio, activation)
        self.fc1 = nn.Linear(dim, hidden_dim, bias=bias)
        self.act = ACTIVATIONS[activation]()
        self.fc2 = nn.Linear(hidden_dim, dim, bias=bias)
        self.drop = (Dropout(dropout) if dropout > 0 else nn.Identity())

    def forward(self, x: Tensor) -> Tensor:
        """``(B, N, D) → (B, N, D)``."""
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class GatedMLP(nn.Module):
    """The gated MLP ``W₂ (σ(W_g x) ⊙ W₁ x)`` (Shazeer 2020, https://arxiv.org/abs/2002.05202): SwiGLU with σ = SiLU,
    the MLP of Llama. A third projection ``gate``; otherwise :class:`MLP`'s names (``fc1`` is Llama's up
    projection, ``fc2`` its down projection), registered in the order checkpoints and optimizer states
    were saved with (``fc1, gate, fc2``).

    Args: as :class:`MLP` (``activation`` defaults to ``"silu"``).
    """

    def __init__(self, dim: int, hidden_dim: int | None = None, *, mlp_ratio: float = 4.0, activation: str = "silu",
                 dropout: float = 0.0, bias: bool = True):
        super().__init__()
        hidden_dim = _hidden(dim, hidden_dim, mlp_ratio, activation)
        self.fc1 = nn.Linear(dim, hidden_dim, bias=bias)
        self.gate = nn.Linear(dim, hidden_dim, bias=bias)
        self.act = ACTIVATIONS[activation]()
        self.fc2 = nn.Linear(hidden_dim, dim, bias=bias)
        self.drop = (Dropout(dropout) if dropout > 0 else nn.Identity())

    def forward(self, x: Tensor) -> Tensor:
        """``(B, N, D) → (B, N, D)``."""
        hidden = self.act(self.gate(x)) * self.fc1(x)  # (B, N, hidden)
        return self.drop(self.fc2(self.drop(hidden)))
