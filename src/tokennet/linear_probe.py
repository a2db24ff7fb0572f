"""A linear probe: what a set of vectors says about a label, read by the simplest classifier that could read it.

Fit multinomial logistic regression ``softmax(x W + b)`` on some vectors (each feature standardized by the fitting
set's mean and deviation), score it on others: the accuracy is how much of the label a *linear* readout finds in
the vectors (Alain & Bengio 2016, https://arxiv.org/abs/1610.01644). ``tokennet probe`` and claim 19 read a token's
class this way before and after attention.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["linear_probe"]


def linear_probe(train_x: Tensor, train_y: Tensor, test_x: Tensor, test_y: Tensor, classes: int, *,
                 weight_decay: float = 1e-3, steps: int = 100) -> float:
    """Test accuracy (%) of a multinomial logistic regression ``softmax(x W + b)`` fit on ``train_x`` standardized
    by its own mean and deviation (L-BFGS, an L2 penalty ``weight_decay · ‖W‖²``), deterministic."""
    mean, std = train_x.mean(0), train_x.std(0).clamp_min(1e-6)
    fit_x, score_x = (train_x - mean) / std, (test_x - mean) / std
    weight = torch.zeros(fit_x.shape[1], classes, requires_grad=True)
    bias = torch.zeros(classes, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], max_iter=steps, line_search_fn="strong_wolfe")

    def loss_fn():
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(fit_x @ weight + bias, train_y) + weight_decay * weight.square().sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(loss_fn)
    with torch.no_grad():
        return round(100.0 * float(((score_x @ weight + bias).argmax(1) == test_y).float().mean()), 2)
