"""Fixtures of the interop tests: random weights for tiny Hugging Face models (``transformers`` is a dev dependency)."""

from __future__ import annotations

import pytest
import torch


def randomize(model: torch.nn.Module, seed: int = 0, std: float = 0.2) -> torch.nn.Module:
    """Every parameter random (norm gains around 1): HF's init leaves norms at 1/0 and some heads at 0,
    which would hide a swapped or dropped tensor."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g) * std
            p.copy_(1 + noise if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight", "layernorm.weight",
                                               "layernorm_before.weight", "layernorm_after.weight",
                                               "LayerNorm.weight", "norm.weight"))
                    else noise)
    return model.eval()


@pytest.fixture
def randomized():
    """:func:`randomize`, for tests: ``randomized(model, seed=0)``."""
    return randomize
