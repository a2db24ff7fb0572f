"""The lecture's toy problem: Nadaraya–Watson kernel regression is attention pooling.

As in d2l §11.2 (https://d2l.ai/chapter_attention-mechanisms-and-transformers/attention-pooling.html):
training inputs ``x_i`` sorted uniform in ``[0, 5)``, targets ``y_i = 2 sin(x_i) + x_i^0.8 + ε`` with
``ε ~ N(0, 0.5²)``, and three estimators compared on a grid of test queries:

- average pooling, ``f(x) = (1/n) Σ_i y_i``;
- nonparametric attention pooling, ``f(x) = Σ_i softmax_i(−(x − x_i)² / 2σ²) y_i`` with fixed ``σ``
  (Nadaraya 1964; Watson 1964);
- parametric attention pooling, the same with ``σ`` learned by SGD on the leave-one-out loss: each
  training point is a query that attends to all the *other* training points (mask ``~eye``).

:func:`run_demo` writes ``nadaraya_watson.png`` (predictions, and the attention weights of test queries
over training keys) and ``nadaraya_watson.json`` (each estimator's MSE against the noiseless truth,
and the learned bandwidth).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ..attention.pooling import AttentionPooling, average_pooling, nadaraya_watson
from ..attention.scores import GaussianKernel
from ..errors import ConfigError

__all__ = ["target", "ToyData", "make_data", "fit_bandwidth", "run_demo"]

logger = logging.getLogger(__name__)

X_MAX = 5.0


def target(x: Tensor) -> Tensor:
    """The noiseless truth ``f(x) = 2 sin(x) + x^0.8``."""
    return 2 * torch.sin(x) + x**0.8


@dataclass
class ToyData:
    """Training samples and the test grid with its noiseless truth (all 1-D)."""

    x_train: Tensor  # (n,), sorted
    y_train: Tensor  # (n,)
    x_test: Tensor  # (m,)
    y_truth: Tensor  # (m,)


def make_data(n_train: int = 50, *, n_test: int = 50, noise: float = 0.5, seed: int = 0) -> ToyData:
    """Draw the toy regression problem.

    Args:
        n_train: number of training samples ``n``.
        n_test: number of test queries on the grid ``0, 5/m, ..., 5 − 5/m``.
        noise: standard deviation of ``ε``.
        seed: seed of the generator (the data do not touch the global RNG).
    """
    if n_train < 2:
        raise ConfigError(f"n_train must be at least 2 (leave-one-out needs another point), got {n_train}")
    if n_test < 1:
        raise ConfigError(f"n_test must be positive, got {n_test}")
    if noise < 0:
        raise ConfigError(f"noise is a standard deviation and must be >= 0, got {noise}")
    rng = torch.Generator().manual_seed(seed)
    x_train, _ = torch.sort(torch.rand(n_train, generator=rng) * X_MAX)
    y_train = target(x_train) + noise * torch.randn(n_train, generator=rng)
    x_test = torch.arange(n_test) * (X_MAX / n_test)
    return ToyData(x_train, y_train, x_test, target(x_test))


def fit_bandwidth(
    x: Tensor, y: Tensor, *, bandwidth: float = 1.0, epochs: int = 5, lr: float = 2.0
) -> tuple[AttentionPooling, list[float]]:
    """Learn the Gaussian bandwidth ``σ`` by full-batch SGD on the leave-one-out squared error.

    Loss ``L(σ) = (1/n) Σ_i (f_{−i}(x_i) − y_i)²`` where ``f_{−i}`` pools over every training point but
    ``i``. Without leaving ``i`` out, ``σ → 0`` would interpolate the noise for a loss of zero.

    Args:
        x: training inputs ``(n,)``.
        y: training targets ``(n,)``.
        bandwidth: initial ``σ``.
        epochs: number of SGD steps (one per epoch: the whole set is one batch).
        lr: SGD learning rate on ``log σ``.

    Returns:
        The trained pooling module and the loss before each step plus the final loss.
    """
    if epochs < 0:
        raise ConfigError(f"epochs must be >= 0, got {epochs}")
    pool = AttentionPooling(GaussianKernel(bandwidth, learnable=True))
    opt = torch.optim.SGD(pool.parameters(), lr=lr)
    leave_one_out = ~torch.eye(len(x), dtype=torch.bool)  # (n, n): query i never sees key i

    def loss_fn() -> Tensor:
        return (pool(x, x, y, mask=leave_one_out) - y).pow(2).mean()

    losses = []
    for epoch in range(epochs):
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        logger.info("epoch %d: leave-one-out loss %.4f", epoch + 1, loss.item())
    with torch.no_grad():
        losses.append(loss_fn().item())
    return pool, losses


def run_demo(
    out_dir: str | Path,
    *,
    seed: int = 0,
    n_train: int = 50,
    n_test: int = 50,
    noise: float = 0.5,
    bandwidth: float = 1.0,
    epochs: int = 5,
    lr: float = 2.0,
) -> dict:
    """Run the three estimators on the toy problem; write ``nadaraya_watson.png`` and ``.json``.

    Args:
        out_dir: directory for the figure and the metrics (created if missing).
        seed: data seed.
        n_train: number of training samples.
        n_test: number of test queries.
        noise: standard deviation of the target noise.
        bandwidth: ``σ`` of the nonparametric estimator, and the initial ``σ`` of the parametric one.
        epochs: SGD steps for the parametric estimator.
        lr: SGD learning rate on ``log σ``.

    Returns:
        The metrics written to ``nadaraya_watson.json``: ``mse_average``, ``mse_nonparametric``,
        ``mse_parametric`` (against the noiseless truth on the test grid), ``bandwidth_nonparametric``,
        ``bandwidth_learned``, the leave-one-out losses, and the settings.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = make_data(n_train, n_test=n_test, noise=noise, seed=seed)

    pool, losses = fit_bandwidth(data.x_train, data.y_train, bandwidth=bandwidth, epochs=epochs, lr=lr)
    with torch.no_grad():
        pred_avg = average_pooling(data.x_test, data.y_train)
        pred_np, w_np = nadaraya_watson(data.x_test, data.x_train, data.y_train, GaussianKernel(bandwidth))
        pred_p, w_p = pool(data.x_test, data.x_train, data.y_train, return_weights=True)
    learned = pool.kernel.bandwidth.item()

    def mse(pred: Tensor) -> float:
        return (pred - data.y_truth).pow(2).mean().item()

    metrics = {
        "mse_average": mse(pred_avg),
        "mse_nonparametric": mse(pred_np),
        "mse_parametric": mse(pred_p),
        "bandwidth_nonparametric": bandwidth,
        "bandwidth_learned": learned,
        "loo_loss_initial": losses[0],
        "loo_loss_final": losses[-1],
        "seed": seed,
        "n_train": n_train,
        "n_test": n_test,
        "noise": noise,
        "epochs": epochs,
        "lr": lr,
    }
    preds = {
        "average pooling": pred_avg,
        f"nonparametric (σ = {bandwidth:.3g})": pred_np,
        f"parametric (learned σ = {learned:.3g})": pred_p,
    }
    _plot(out / "nadaraya_watson.png", data, preds, w_np, w_p, bandwidth, learned)
    (out / "nadaraya_watson.json").write_text(json.dumps(metrics, indent=2) + "\n")
    logger.info(
        "MSE vs truth: average %.4f, nonparametric %.4f, parametric %.4f (learned σ = %.4f); wrote %s",
        metrics["mse_average"],
        metrics["mse_nonparametric"],
        metrics["mse_parametric"],
        learned,
        out,
    )
    return metrics


def _plot(path: Path, data: ToyData, preds: dict, w_np: Tensor, w_p: Tensor, bw: float, learned: float):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # matplotlib wants arrays; handing it tensors trips numpy 2's copy= deprecation.
    x_tr, y_tr, x_te, y_te = (t.numpy() for t in (data.x_train, data.y_train, data.x_test, data.y_truth))
    fig, axes = plt.subplot_mosaic(
        [["pred", "pred"], ["np", "p"]], figsize=(11, 9), height_ratios=[1, 1.15], layout="constrained"
    )
    ax = axes["pred"]
    ax.plot(x_te, y_te, color="black", lw=2, label=r"truth $2\sin(x) + x^{0.8}$")
    ax.scatter(x_tr, y_tr, s=14, color="gray", alpha=0.7, label="training samples")
    for (name, pred), style in zip(preds.items(), ("--", "-", "-"), strict=True):
        ax.plot(x_te, pred.numpy(), style, lw=1.8, label=name)
    ax.set(xlabel="x", ylabel="y", title="Nadaraya–Watson attention pooling: predictions on the test grid")
    ax.legend(loc="upper right", fontsize=9)

    for key, weights, title in (
        ("np", w_np, f"nonparametric: Gaussian kernel, σ = {bw:.3g}"),
        ("p", w_p, f"parametric: learned σ = {learned:.3g}"),
    ):
        ax = axes[key]
        # Keys are sorted but not evenly spaced: pcolormesh puts each column at its true x_i.
        mesh = ax.pcolormesh(x_tr, x_te, weights.numpy(), shading="nearest", cmap="Reds")
        ax.invert_yaxis()  # rows top to bottom, like the attention matrix
        ax.set(xlabel=r"training key $x_i$", ylabel="test query x", title=f"attention weights, {title}")
        fig.colorbar(mesh, ax=ax, label=r"weight $\alpha(x, x_i)$")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _register() -> None:
    from . import Demo, register_demo

    register_demo(Demo("nadaraya-watson", run_demo, "attention pooling as kernel regression on the lecture's toy "
                       "problem (d2l §11.2): average pooling, a fixed and a learned Gaussian kernel; a figure and MSEs",
                       ("nadaraya_watson.png", "nadaraya_watson.json")))


_register()
