"""Which device to run on: one rule for the CLI, the recipes and the plots."""

from __future__ import annotations

import torch

__all__ = ["resolve_device"]


def resolve_device(device: str) -> torch.device:
    """``"auto"`` → CUDA when present, else MPS when present, else CPU; anything else is checked."""
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"unknown device {device!r}; use auto, cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but CUDA is not available; use --device cpu or auto")
    return dev
