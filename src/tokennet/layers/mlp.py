"""The position-wise MLP of a transformer block: ``MLP(x) = W₂ σ(W₁ x + b₁) + b₂``, per token."""

from __future__ import annotations

from torch import Tensor, nn

__all__ = ["MLP", "ACTIVATIONS"]

ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU, "gelu_tanh": lambda: nn.GELU(approximate="tanh")}


class MLP(nn.Module):
    """Two linear layers with a nonlinearity in between, applied to every token independently.

    Args:
        dim: input and output width D.
        hidden_dim: inner width (default ``mlp_ratio · dim``).
        mlp_ratio: inner width as a multiple of ``dim`` when ``hidden_dim`` is not given.
        activation: ``"gelu"`` (ViT, GPT), ``"relu"`` (the original Transformer) or ``"gelu_tanh"``.
        dropout: dropout after the activation and after the output projection.
        bias: use biases.
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
    ):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; expected one of {', '.join(ACTIVATIONS)}")
        hidden_dim = int(round(mlp_ratio * dim)) if hidden_dim is None else hidden_dim
        if hidden_dim < 1:
            raise ValueError(f"hidden_dim must be positive, got {hidden_dim}")
        self.fc1 = nn.Linear(dim, hidden_dim, bias=bias)
        self.act = ACTIVATIONS[activation]()
        self.fc2 = nn.Linear(hidden_dim, dim, bias=bias)
        self.drop = (nn.Dropout(dropout) if dropout > 0 else nn.Identity())

    def forward(self, x: Tensor) -> Tensor:
        """``(B, N, D) → (B, N, D)``."""
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))
