"""Claim 8: dividing the scores by √d keeps their variance at 1, and the softmax out of saturation."""

from __future__ import annotations

import torch

from ._registry import Result, claim, plt, png

__all__ = ["score_variance"]


def score_variance(seed: int = 0, *, dims: tuple[int, ...] = (4, 16, 64, 256, 1024), n_keys: int = 16,
                   samples: int = 2000) -> list[dict]:
    """For each width d: the variance of ``q·k`` for i.i.d. unit-variance entries, unscaled and divided by √d,
    and the softmax over ``n_keys`` such scores: its mean largest weight and the mean norm of its Jacobian
    (the gradient it passes back to the scores)."""
    rng = torch.Generator().manual_seed(seed)
    rows = []
    for dim in dims:
        q = torch.randn(samples, 1, dim, generator=rng)
        k = torch.randn(samples, n_keys, dim, generator=rng)
        dots = (q * k).sum(-1)  # (samples, n_keys): q·k
        row = {"d": dim}
        for name, scores in (("unscaled", dots), ("scaled", dots / dim**0.5)):
            weights = torch.softmax(scores, dim=-1)  # (samples, n_keys)
            # The softmax's Jacobian diag(a) − a aᵀ, per sample: its Frobenius norm.
            jac = torch.diag_embed(weights) - weights[:, :, None] * weights[:, None, :]  # (samples, n_keys, n_keys)
            row[name] = {"variance": float(scores.var()), "max_weight": float(weights.max(-1).values.mean()),
                         "grad_norm": float(torch.linalg.matrix_norm(jac).mean())}
        rows.append(row)
    return rows


@claim("sqrt-d-scaling", "8")
def claim_scaling(seed: int = 0) -> Result:
    """"Assume that all elements of query and key are i.i.d variables with zero mean and unit variance. To ensure
    that the variance of the dot product still remains one regardless of vector length, the scaled dot-product
    attention scoring function" divides q·k by √d.

    Measured: the variance of q·k against d with and without the scale, and the softmax's saturation over 16
    keys (its mean largest weight and the norm of its Jacobian, the gradient the scores receive).
    """
    rows = score_variance(seed)
    first, last = rows[0], rows[-1]
    holds = (all(abs(row["scaled"]["variance"] - 1) < 0.15 for row in rows)
             and all(abs(row["unscaled"]["variance"] / row["d"] - 1) < 0.15 for row in rows)
             and last["unscaled"]["max_weight"] > 0.9 and last["scaled"]["max_weight"] < 0.6
             and last["unscaled"]["grad_norm"] < 0.5 * last["scaled"]["grad_norm"])
    measured = (f"var(q·k) at d={first['d']}→{last['d']}: "
                f"{first['unscaled']['variance']:.1f}→{last['unscaled']['variance']:.0f} unscaled, "
                f"{first['scaled']['variance']:.2f}→{last['scaled']['variance']:.2f} scaled; at d={last['d']} "
                f"max weight {last['unscaled']['max_weight']:.2f} vs {last['scaled']['max_weight']:.2f}, softmax "
                f"gradient norm {last['unscaled']['grad_norm']:.3f} vs {last['scaled']['grad_norm']:.3f}")
    pyplot = plt()
    fig, axes = pyplot.subplots(1, 3, figsize=(12, 3.2))
    dims_shown = [row["d"] for row in rows]
    for ax, key, ylabel in ((axes[0], "variance", "var(score)"), (axes[1], "max_weight", "mean max softmax weight"),
                            (axes[2], "grad_norm", "‖softmax Jacobian‖")):
        for name, style in (("unscaled", "o-"), ("scaled", "s-")):
            ax.plot(dims_shown, [row[name][key] for row in rows], style,
                    label=f"{name}" + (" q·k/√d" if name == "scaled" else " q·k"))
        ax.set_xscale("log"), ax.set_xlabel("d")
        if key == "variance":
            ax.set_yscale("log")
        ax.set_ylabel(ylabel), ax.legend(fontsize=7)
    fig.suptitle("Scores of unit-variance q, k: the √d scale keeps var = 1 and the softmax unsaturated", fontsize=10)
    return Result(f"2,000 random q and 16 keys per d in {dims_shown}, entries N(0, 1)", measured, holds, png(fig),
                  {"rows": rows})
