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
    g = torch.Generator().manual_seed(seed)
    rows = []
    for d in dims:
        q = torch.randn(samples, 1, d, generator=g)
        k = torch.randn(samples, n_keys, d, generator=g)
        s = (q * k).sum(-1)  # (samples, n_keys): q·k
        row = {"d": d}
        for name, scores in (("unscaled", s), ("scaled", s / d**0.5)):
            a = torch.softmax(scores, dim=-1)  # (samples, n_keys)
            # The softmax's Jacobian diag(a) − a aᵀ, per sample: its Frobenius norm.
            jac = torch.diag_embed(a) - a[:, :, None] * a[:, None, :]  # (samples, n_keys, n_keys)
            row[name] = {"variance": float(scores.var()), "max_weight": float(a.max(-1).values.mean()),
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
    lo, hi = rows[0], rows[-1]
    holds = (all(abs(r["scaled"]["variance"] - 1) < 0.15 for r in rows)
             and all(abs(r["unscaled"]["variance"] / r["d"] - 1) < 0.15 for r in rows)
             and hi["unscaled"]["max_weight"] > 0.9 and hi["scaled"]["max_weight"] < 0.6
             and hi["unscaled"]["grad_norm"] < 0.5 * hi["scaled"]["grad_norm"])
    measured = (f"var(q·k) at d={lo['d']}→{hi['d']}: {lo['unscaled']['variance']:.1f}→{hi['unscaled']['variance']:.0f} "
                f"unscaled, {lo['scaled']['variance']:.2f}→{hi['scaled']['variance']:.2f} scaled; at d={hi['d']} "
                f"max weight {hi['unscaled']['max_weight']:.2f} vs {hi['scaled']['max_weight']:.2f}, softmax "
                f"gradient norm {hi['unscaled']['grad_norm']:.3f} vs {hi['scaled']['grad_norm']:.3f}")
    pyplot = plt()
    fig, axes = pyplot.subplots(1, 3, figsize=(12, 3.2))
    ds = [r["d"] for r in rows]
    for ax, key, ylabel in ((axes[0], "variance", "var(score)"), (axes[1], "max_weight", "mean max softmax weight"),
                            (axes[2], "grad_norm", "‖softmax Jacobian‖")):
        for name, style in (("unscaled", "o-"), ("scaled", "s-")):
            ax.plot(ds, [r[name][key] for r in rows], style, label=f"{name}" + (" q·k/√d" if name == "scaled"
                                                                                 else " q·k"))
        ax.set_xscale("log"), ax.set_xlabel("d")
        if key == "variance":
            ax.set_yscale("log")
        ax.set_ylabel(ylabel), ax.legend(fontsize=7)
    fig.suptitle("Scores of unit-variance q, k: the √d scale keeps var = 1 and the softmax unsaturated", fontsize=10)
    return Result(f"2,000 random q and 16 keys per d in {ds}, entries N(0, 1)", measured, holds, png(fig),
                  {"rows": rows})
