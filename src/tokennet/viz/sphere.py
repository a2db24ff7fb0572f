"""``tokennet viz`` for sphere runs: one patch's attention over the sphere.

``patch_attention.png``: a held-out test image projected onto the sphere, seen from above the north
pole (orthographic projection of the northern hemisphere, where the unrotated image lies), then per
layer the attention of the query patch (ringed) over every patch centre (``A = softmax(Q Kᵀ/√E + b)``,
mean of heads or one head), and the last layer's row over the whole sphere in a Mollweide projection —
for the invariant model, a ring pattern around the query reflects the angle bias.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import DataError, RunError
from ..tokens.sphere import to_angles
from .attention_maps import select as _select

__all__ = ["sphere_viz"]


def _ortho(ax, xyz, values, *, size, cmap, title, query=None):
    """Points with z > 0 seen from above the north pole."""
    visible = xyz[:, 2] > 0
    from matplotlib.patches import Circle

    ax.add_patch(Circle((0, 0), 1, fill=False, color="0.5"))
    points = ax.scatter(xyz[visible, 0], xyz[visible, 1], c=values[visible], s=size, cmap=cmap, vmin=0.0,
                    vmax=float(max(values[visible].max(), 1e-12)), linewidths=0)
    if query is not None and xyz[query, 2] > 0:
        ax.scatter([xyz[query, 0]], [xyz[query, 1]], s=size * 3, facecolors="none", edgecolors="cyan", linewidths=2)
    ax.set_xlim(-1.05, 1.05)
    ax.set_ylim(1.05, -1.05)  # y down, as image rows: the unrotated image reads as it does flat
    ax.set_aspect("equal")
    ax.set_title(title, fontsize=8)
    ax.axis("off")
    return points


def sphere_viz(run, out_dir: Path, *, index: int | None = None, patch: int | None = None, layer: int | None = None,
               head: int | None = None, **_) -> list[Path]:
    """Write ``patch_attention.png`` for test image ``index`` (default 0).

    Args:
        run: a loaded sphere :class:`~tokennet.run.Run`.
        out_dir: where the PNG goes.
        index: which test image.
        patch: the query patch (default: the one nearest the north pole, the image's centre).
        layer: only this layer (default: all).
        head: only this head (default: the mean of heads).
    """
    from .attention_maps import _plt, _save

    m, spec = run.model, run.data
    if spec is None:
        raise RunError(f"{run.path} has no run.json to say which images it was trained on")
    _, _, (x_test, y_test) = spec.split()
    classes = spec.images().classes
    index = 0 if index is None else index
    _select(len(y_test), index, "index")
    centres, samples = m.centres.cpu().double(), m.samples.cpu().double()
    query = int(centres[:, 2].argmax()) if patch is None else patch
    if not 0 <= query < len(centres):
        raise DataError(f"patch {query} out of range: the model has patches 0..{len(centres) - 1}")
    x = spec.project(x_test[index:index + 1], m.samples.cpu())  # (1, C, M)
    with torch.no_grad():
        maps = run.attention_maps(x.to(run.device))["self"]  # per layer (1, H, N, N)
        pred = int(m(x.to(run.device)).logits.argmax(-1))
    layers = _select(len(maps), layer, "layer")
    heads = _select(maps[0].shape[1], head, "head")
    plt = _plt()
    cols = len(layers) + 2
    fig = plt.figure(figsize=(3.2 * cols, 3.4))
    ax = fig.add_subplot(1, cols, 1)
    _ortho(ax, samples, x[0].mean(0).double(), size=16, cmap="gray_r", title="input (northern hemisphere)")
    which = "mean of heads" if head is None else f"head {head}"
    rows = []
    for k, i in enumerate(layers):
        row = maps[i][0, heads, query].float().mean(0).cpu().double()  # (N,)
        rows.append(row)
        ax = fig.add_subplot(1, cols, k + 2)
        _ortho(ax, centres, row, size=28, cmap="inferno", query=query,
               title=f"layer {i}, {which} (max {row.max():.2f})")
    theta, phi = to_angles(centres)
    ax = fig.add_subplot(1, cols, cols, projection="mollweide")
    ax.scatter(phi, torch.pi / 2 - theta, c=rows[-1], s=14, cmap="inferno", linewidths=0)
    q_theta, q_phi = to_angles(centres[query])
    ax.scatter([float(q_phi)], [float(torch.pi / 2 - q_theta)], s=60, facecolors="none", edgecolors="cyan",
               linewidths=2)
    ax.set_xticklabels([])
    ax.set_yticklabels([])
    ax.grid(True, alpha=0.3)
    ax.set_title(f"layer {layers[-1]}, whole sphere (Mollweide)", fontsize=8)
    name = classes[int(y_test[index])] if classes else str(int(y_test[index]))
    guess = classes[pred] if classes else str(pred)
    fig.suptitle(f"test image {index} (class {name}, predicted {guess}): attention of patch {query} "
                 f"(ringed)", fontsize=9)
    fig.tight_layout()
    return [_save(fig, Path(out_dir) / "patch_attention.png")]

