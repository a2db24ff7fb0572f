"""Attention you can see: where one patch looks, attention rollout, similarity of learned positions.

- **Patch attention**: row ``i`` of a layer's attention matrix ``A = softmax(Q Kᵀ / √E)`` is how much
  patch ``i`` takes from every other patch; drawn over the image, per layer and head.
- **Attention rollout** (Abnar & Zuidema 2020, https://arxiv.org/abs/2005.00928): follow the attention
  through the residual stream, ``R = Â_L ⋯ Â_1`` with ``Â_ℓ = ½ mean_h A_ℓ + ½ I`` (rows renormalized);
  row 0 of ``R`` says which patches the <cls> token drew on.
- **Position similarity** (ViT, Dosovitskiy et al. 2021, Fig. 7): the cosine similarity of each patch's
  position embedding with every other one's, on the patch grid — which positions the model learned
  are near each other.

The tensor functions are plain torch; the plotting functions write PNGs with matplotlib's Agg backend.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import DataError

__all__ = [
    "attention_rollout",
    "overlay",
    "cosine_similarity_matrix",
    "patch_map",
    "patch_box",
    "plot_patch_attention",
    "plot_rollout",
    "plot_position_similarity",
    "select",
    "pyplot",
    "save_figure",
    "show_image",
]


# -- tensors ------------------------------------------------------------------------------------------
def attention_rollout(maps: list[Tensor], *, residual: float = 0.5, head_fusion: str = "mean") -> Tensor:
    """Attention rollout ``R = Â_L ⋯ Â_1``, ``Â_ℓ = (1 − r)·fuse_h(A_ℓ) + r·I`` with rows renormalized.

    Args:
        maps: per layer, first layer first, attention ``(B, H, N, N)`` (rows sum to 1).
        residual: weight ``r`` of the identity, standing for the residual connection.
        head_fusion: ``"mean"``, ``"max"`` or ``"min"`` over heads.

    Returns:
        ``(B, N, N)``: row ``i`` is how much token ``i`` of the last layer draws on each input token.
    """
    if not maps:
        raise ValueError("attention_rollout needs at least one layer's attention")
    if not 0 <= residual <= 1:
        raise ValueError(f"residual must be in [0, 1], got {residual}")
    fuse = {"mean": lambda att: att.mean(1), "max": lambda att: att.amax(1), "min": lambda att: att.amin(1)}
    if head_fusion not in fuse:
        raise ValueError(f"head_fusion must be one of {sorted(fuse)}, got {head_fusion!r}")
    B, _, N, _ = maps[0].shape
    eye = torch.eye(N, dtype=maps[0].dtype, device=maps[0].device)
    rollout = eye.expand(B, N, N)
    for layer_att in maps:
        a_hat = (1 - residual) * fuse[head_fusion](layer_att) + residual * eye  # (B, N, N)
        a_hat = a_hat / a_hat.sum(-1, keepdim=True).clamp_min(1e-12)
        rollout = a_hat @ rollout  # later layers act on what the earlier ones mixed
    return rollout


def cosine_similarity_matrix(table: Tensor) -> Tensor:
    """``S_ij = cos(P_i, P_j)`` for the rows of ``table`` ``(N, D)`` → ``(N, N)``."""
    unit_rows = F.normalize(table.float(), dim=-1)
    return unit_rows @ unit_rows.t()


def patch_box(index: int, grid: tuple[int, int], patch: tuple[int, int], stride: tuple[int, int],
              offset: tuple[int, int] = (0, 0)) -> tuple[int, int, int, int]:
    """``(top, left, height, width)`` in image pixels of patch ``index`` (row-major on ``grid``).

    ``offset`` is the padding added before the first row/column (patches of a padded image).
    """
    grid_h, grid_w = grid
    if not 0 <= index < grid_h * grid_w:
        raise DataError(f"patch {index} out of range: the grid {grid_h}×{grid_w} has patches 0..{grid_h * grid_w - 1}")
    row, col = divmod(index, grid_w)
    return row * stride[0] - offset[0], col * stride[1] - offset[1], patch[0], patch[1]


def patch_map(values: Tensor, grid: tuple[int, int], image_hw: tuple[int, int], patch: tuple[int, int],
              stride: tuple[int, int], offset: tuple[int, int] = (0, 0)) -> Tensor:
    """Spread per-patch values ``(gh·gw,)`` over the image ``(H, W)``: each pixel gets the mean of the
    patches covering it (one patch when they do not overlap)."""
    grid_h, grid_w = grid
    patch_h, patch_w = patch
    H = (grid_h - 1) * stride[0] + patch_h
    W = (grid_w - 1) * stride[1] + patch_w
    cols = values.float().reshape(1, 1, grid_h * grid_w).expand(1, patch_h * patch_w, grid_h * grid_w)  # (1, ph·pw, N)
    total = F.fold(cols, (H, W), kernel_size=patch, stride=stride)  # (1, 1, H, W)
    count = F.fold(torch.ones_like(cols), (H, W), kernel_size=patch, stride=stride)
    full = (total / count.clamp_min(1))[0, 0]
    top, left = offset
    out = full.new_zeros(image_hw)
    crop_h = min(image_hw[0], H - top)
    crop_w = min(image_hw[1], W - left)
    out[:crop_h, :crop_w] = full[top:top + crop_h, left:left + crop_w]
    return out


# -- plotting ------------------------------------------------------------------------------------------
def _plt():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _show_image(ax, image: Tensor, brightness: float = 1.0) -> None:
    """Draw ``(C, H, W)`` (grey or RGB), scaled to ``[0, brightness]`` (dimmed under a heat map)."""
    img = image.detach().float().cpu()
    img = img[:1] if img.shape[0] < 3 else img[:3]
    low, high = img.min(), img.max()
    img = (img - low) / (high - low + 1e-8) * brightness
    if img.shape[0] == 1:
        ax.imshow(img[0].numpy(), cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
    else:
        ax.imshow(img.permute(1, 2, 0).numpy(), interpolation="nearest")


def overlay(ax, image: Tensor, heat: Tensor, boxes=(), label: str | None = None) -> None:
    """The image, dimmed, under a heat map ``(H, W)`` scaled to its maximum; object boxes outlined in cyan."""
    from matplotlib import colormaps
    from matplotlib.patches import Rectangle

    show_image(ax, image, brightness=0.6)
    heat_np = heat.detach().float().cpu()
    heat_np = (heat_np / heat_np.max().clamp_min(1e-12)).numpy()
    rgba = colormaps["inferno"](heat_np)
    rgba[..., 3] = 0.75 * heat_np
    ax.imshow(rgba, interpolation="nearest")
    for top, left, box_h, box_w in boxes:
        ax.add_patch(Rectangle((left - 0.5, top - 0.5), box_w, box_h, fill=False, edgecolor="cyan", linewidth=1.2))
    if label:
        ax.text(0.02, 0.02, label, transform=ax.transAxes, fontsize=6.5, color="white",
                bbox={"facecolor": "black", "alpha": 0.5, "pad": 1, "linewidth": 0})
    ax.set_xticks([])
    ax.set_yticks([])


def _overlay(ax, image: Tensor, heat: Tensor, peak: float | None = None) -> None:
    """The image in grey under the heat map, scaled to its own largest value; the heat is transparent where
    it is low, so the image shows where the attention is not. ``peak`` (the largest attention weight) is
    printed in the corner: near 1/N the panel is close to uniform, near 1 it is one patch."""
    from matplotlib import colormaps

    _show_image(ax, image, brightness=0.55)  # dimmed, so the heat's colours stay true where they cover it
    heat_np = heat.detach().float().cpu()
    heat_np = (heat_np / heat_np.max().clamp_min(1e-12)).numpy()  # 0..1: the largest weight is full colour
    rgba = colormaps["inferno"](heat_np)
    rgba[..., 3] = 0.9 * heat_np
    ax.imshow(rgba, interpolation="nearest")
    if peak is not None:
        _peak_label(ax, peak)
    ax.set_xticks([])
    ax.set_yticks([])


def _clip(box, hw) -> tuple[int, int, int, int]:
    """A ``(top, left, h, w)`` box cut to the image (patches of padded images reach past its edges)."""
    top, left, box_h, box_w = box
    clipped_top, clipped_left = max(0, top), max(0, left)
    return clipped_top, clipped_left, min(hw[0], top + box_h) - clipped_top, min(hw[1], left + box_w) - clipped_left


def _outline(ax, box, color="cyan") -> None:
    from matplotlib.patches import Rectangle

    top, left, box_h, box_w = box
    ax.add_patch(Rectangle((left - 0.5, top - 0.5), box_w, box_h, fill=False, edgecolor=color, linewidth=2))


def _peak_label(ax, peak: float) -> None:
    import matplotlib.patheffects as pe

    ax.text(0.03, 0.03, f"max {peak:.2f}", transform=ax.transAxes, fontsize=7, color="white",
            path_effects=[pe.withStroke(linewidth=2, foreground="black")])


def _signal_strip(ax, signal: Tensor, values: Tensor, geom: dict, box=None, peak: float | None = None) -> None:
    """A 1-D signal over a strip of per-patch values (the 1-D form of an overlay)."""
    trace = signal.detach().float().cpu().reshape(-1)
    L = len(trace)
    heat = patch_map(values, geom["grid"], (1, L), geom["patch"], geom["stride"], geom["offset"])[0]
    low, high = float(trace.min()), float(trace.max())
    pad = 0.1 * (high - low + 1e-6)
    ax.imshow(heat[None].numpy(), cmap="inferno", aspect="auto", extent=(-0.5, L - 0.5, low - pad, high + pad),
              vmin=0.0, vmax=float(heat.max()) + 1e-12, interpolation="nearest", alpha=0.85)
    ax.plot(range(L), trace.numpy(), color="white", linewidth=2.2)
    ax.plot(range(L), trace.numpy(), color="tab:blue", linewidth=1.2)
    if box is not None:
        from matplotlib.patches import Rectangle

        _, left, _, box_w = box
        ax.add_patch(Rectangle((left - 0.5, low - pad), box_w, high - low + 2 * pad, fill=False, edgecolor="cyan",
                               linewidth=2))
    if peak is not None:
        _peak_label(ax, peak)
    ax.set_xlim(-0.5, L - 0.5)
    ax.set_yticks([])


def plot_patch_attention(image: Tensor, rows: dict[int, Tensor], geom: dict, patch: int, path: str | Path, *,
                         heads: list[int] | None = None, title: str = "") -> Path:
    """Where patch ``patch`` looks: one row per layer, one column per head plus their mean, over the image.

    Args:
        image: ``(C, H, W)``, or ``(C, L)`` for a 1-D signal.
        rows: layer → attention of the chosen patch's query row over the patches ``(H, N)``.
        geom: ``grid, patch, stride, offset, image_hw`` of the patch grid.
        patch: the chosen patch (outlined).
        path: the PNG to write.
        heads: the head indices (columns) to draw; default all, plus their mean.
        title: figure title.
    """
    plt = _plt()
    one_d = image.dim() == 2
    layers = list(rows)
    n_heads = next(iter(rows.values())).shape[0]
    heads = list(range(n_heads)) if heads is None else heads
    with_mean = len(heads) > 1
    ncols = 1 + len(heads) + int(with_mean)
    cell = (2.6, 1.3) if one_d else (1.9, 1.9)
    fig, axes = plt.subplots(len(layers), ncols, figsize=(cell[0] * ncols, cell[1] * len(layers) + 0.8),
                             squeeze=False)
    box = _clip(patch_box(patch, geom["grid"], geom["patch"], geom["stride"], geom["offset"]), geom["image_hw"])
    for row, layer in enumerate(layers):
        att = rows[layer]  # (H, N)
        cols = [(f"head {head}", att[head]) for head in heads]
        cols += [("mean of heads", att[heads].mean(0))] if with_mean else []
        ax0 = axes[row, 0]
        if row == 0:
            if one_d:
                _signal_strip(ax0, image, torch.zeros(att.shape[-1]), geom, box)
            else:
                _show_image(ax0, image)
                _outline(ax0, box)
                ax0.set_xticks([])
                ax0.set_yticks([])
            ax0.set_title(f"input, patch {patch}", fontsize=9)
        else:
            ax0.axis("off")
        for col, (name, vals) in enumerate(cols, start=1):
            ax = axes[row, col]
            if one_d:
                _signal_strip(ax, image, vals, geom, box, peak=float(vals.max()))
            else:
                heat = patch_map(vals, geom["grid"], geom["image_hw"], geom["patch"], geom["stride"], geom["offset"])
                _overlay(ax, image, heat, peak=float(vals.max()))
                _outline(ax, box)
            if row == 0:
                ax.set_title(name, fontsize=9)
            if col == 1:
                ax.set_ylabel(f"layer {layer}", fontsize=9)
    fig.suptitle((title or f"attention of patch {patch} to every patch") + "\n(each panel scaled to its largest "
                 f"weight, printed in its corner; uniform = {1 / att.shape[-1]:.2f})", fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def plot_rollout(image: Tensor, last_layer: Tensor, rollout: Tensor, geom: dict, path: str | Path, *,
                 title: str = "", query: str = "<cls>") -> Path:
    """Input | the query's last-layer attention (mean of heads) | attention rollout, over the image.

    Args:
        image: ``(C, H, W)`` or ``(C, L)``.
        last_layer: per-patch attention of the query in the last layer ``(N,)``.
        rollout: per-patch rollout relevance of the query ``(N,)``.
        geom: the patch grid (see :func:`plot_patch_attention`).
        path: the PNG to write.
        title: figure title.
        query: name of the query token, for the panel titles.
    """
    plt = _plt()
    one_d = image.dim() == 2
    fig, axes = plt.subplots(1, 3, figsize=(10.5, 2.6) if one_d else (8.4, 3.2), squeeze=False)
    panels = [("input", None), (f"{query}: last layer (mean of heads)", last_layer), (f"{query}: rollout", rollout)]
    for ax, (name, vals) in zip(axes[0], panels, strict=True):
        if one_d:
            _signal_strip(ax, image, torch.zeros(len(rollout)) if vals is None else vals, geom,
                          peak=None if vals is None else float(vals.max()))
        elif vals is None:
            _show_image(ax, image)
            ax.set_xticks([])
            ax.set_yticks([])
        else:
            _overlay(ax, image, patch_map(vals, geom["grid"], geom["image_hw"], geom["patch"], geom["stride"],
                                          geom["offset"]), peak=float(vals.max()))
        ax.set_title(name, fontsize=9)
    fig.suptitle(title or "attention rollout", fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def plot_position_similarity(sim: Tensor, grid: tuple[int, int], path: str | Path, *, title: str = "") -> Path:
    """Cosine similarity of position embeddings: for 2-D grids one small map per patch, laid out on the
    grid (ViT Fig. 7); for 1-D (or very large grids) the ``N × N`` matrix.

    Args:
        sim: ``(N, N)`` cosine similarities, patches row-major on ``grid``.
        grid: ``(gh, gw)``.
        path: the PNG to write.
        title: figure title.
    """
    plt = _plt()
    grid_h, grid_w = grid
    sims = sim.detach().float().cpu()
    if grid_h == 1 or grid_w == 1 or grid_h * grid_w > 400:
        fig, ax = plt.subplots(figsize=(5.2, 4.5))
        mappable = ax.imshow(sims.numpy(), cmap="viridis", vmin=-1, vmax=1, interpolation="nearest")
        from matplotlib.ticker import MaxNLocator

        ax.set_xlabel("patch j")
        ax.set_ylabel("patch i")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        fig.colorbar(mappable, ax=ax, label="cosine similarity")
    else:
        size = min(0.75, 9.0 / max(grid_h, grid_w))
        fig, axes = plt.subplots(grid_h, grid_w, figsize=(size * grid_w + 1.2, size * grid_h + 0.7), squeeze=False,
                                 gridspec_kw={"wspace": 0.06, "hspace": 0.06})
        for i in range(grid_h * grid_w):
            ax = axes[i // grid_w, i % grid_w]
            mappable = ax.imshow(sims[i].reshape(grid_h, grid_w).numpy(), cmap="viridis", vmin=-1, vmax=1,
                                 interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
        for col in range(grid_w):
            axes[-1, col].set_xlabel(str(col + 1), fontsize=7)
        for row in range(grid_h):
            axes[row, 0].set_ylabel(str(row + 1), fontsize=7, rotation=0, labelpad=8)
        fig.supxlabel("input patch column", fontsize=9)
        fig.supylabel("input patch row", fontsize=9)
        fig.colorbar(mappable, ax=axes, shrink=0.8, label="cosine similarity")
    fig.suptitle(title or "position embedding similarity", fontsize=10)
    return _save(fig, path)


def _save(fig, path) -> Path:
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def select(n: int, which: int | None, what: str) -> list[int]:
    """The indices a ``--layer`` / ``--head`` / ``--index`` option picks: all of ``0..n-1``, or the one given
    (a ``DataError`` naming the range when it is out of it)."""
    if which is None:
        return list(range(n))
    if not 0 <= which < n:
        raise DataError(f"{what} {which} out of range: 0..{n - 1}")
    return [which]


# Public names of the plotting helpers that task modules draw with.
pyplot = _plt
save_figure = _save
show_image = _show_image
