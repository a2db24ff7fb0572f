"""Weight initializations the model families share (applied with ``module.apply(fn)``)."""

from __future__ import annotations

from torch import nn

__all__ = ["init_trunc_normal", "init_conv_weights"]


def init_trunc_normal(m: nn.Module, std: float = 0.02) -> None:
    """ViT's initialization (as in Swin and DeiT): linear weights drawn from a normal of standard deviation
    ``std`` truncated at ±2, biases zero; other layers keep PyTorch's defaults."""
    if isinstance(m, nn.Linear):
        nn.init.trunc_normal_(m.weight, std=std)
        if m.bias is not None:
            nn.init.zeros_(m.bias)


def init_conv_weights(m: nn.Module) -> None:
    """He initialization for convolutions (ReLU networks), zero biases."""
    if isinstance(m, nn.Conv2d):
        nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        if m.bias is not None:
            nn.init.zeros_(m.bias)
