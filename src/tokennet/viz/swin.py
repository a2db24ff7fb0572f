"""``tokennet viz`` for Swin runs: the windows drawn on the image, and where one patch looks in each block.

- ``windows.png``: one panel per window layout of the model (each stage, unshifted and shifted), the image
  under its tokens coloured by *attention group* — the tokens that attend to each other (one window, or,
  where the shift wrapped a window around the edge, one of its parts: those parts are masked from each
  other). Thick lines are the group borders, thin ones the token cells.
- ``window_attention.png``: one panel per block, the attention of the token under a query pixel (default
  the image centre; ``--patch`` picks a first-stage patch) over the image, mean of heads (or ``--head``):
  zero outside its window, and the windows grow as the stages merge patches.
- ``rollout.png``: attention rollout (Abnar & Zuidema 2020) through the hierarchy: ``Â = ½ mean_h A + ½ I``
  per block, and between stages the patch merging as the row-stochastic matrix that averages each merged
  token's 2 × 2 children, so the relevance of the mean-pooled output comes back to the first stage's
  patches.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .attention_maps import (
    _outline,
    _overlay,
    _signal_strip,
    patch_map,
    plot_rollout,
    pyplot,
    save_figure,
    select,
    show_image,
)
from .vit import _check_index, drawn_input

__all__ = ["swin_viz", "plot_windows", "merge_matrix", "swin_rollout"]


def _cell_of(pixel: tuple[int, int], cell: tuple[int, int], grid: tuple[int, int]) -> int:
    """The row-major token index whose cell holds ``pixel``."""
    row, col = min(pixel[0] // cell[0], grid[0] - 1), min(pixel[1] // cell[1], grid[1] - 1)
    return row * grid[1] + col


def merge_matrix(grid: tuple[int, int], factor: tuple[int, int]) -> torch.Tensor:
    """Patch merging as a token map ``(L_out, L_in)``: row ``(r, c)`` averages the children ``(fh·r + i, fw·c + j)``
    that exist (an odd grid's padding is no child)."""
    grid_h, grid_w = grid
    factor_h, factor_w = factor
    out_h, out_w = -(-grid_h // factor_h), -(-grid_w // factor_w)
    m = torch.zeros(out_h * out_w, grid_h * grid_w)
    for row in range(grid_h):
        for col in range(grid_w):
            m[(row // factor_h) * out_w + col // factor_w, row * grid_w + col] = 1.0
    return m / m.sum(1, keepdim=True)


def swin_rollout(maps: list[torch.Tensor], grids: list[tuple[int, int]], factor: tuple[int, int],
                 residual: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """Relevance of the mean-pooled output over the first stage's tokens: ``(last block's row (L_first,),
    rollout (L_first,))``, both spread down to the first stage (see the module docstring).

    Args:
        maps: per block ``(H, L, L)`` on that block's grid (first block first).
        grids: per block, its grid.
        factor: the patch merging's ``(fh, fw)``.
    """
    v = torch.full((1, maps[-1].shape[-1]), 1.0 / maps[-1].shape[-1])  # the mean pool over the last tokens
    last = v @ maps[-1].float().mean(0)  # (1, L_last): the last block's attention of the pooled output
    down = None  # maps a row over the current stage's tokens to the first stage's
    for i in range(len(maps) - 1, -1, -1):
        att = maps[i].float().mean(0)
        att = (1 - residual) * att + residual * torch.eye(att.shape[0])
        v = v @ (att / att.sum(-1, keepdim=True))
        if i > 0 and grids[i - 1] != grids[i]:  # going down through a patch merging
            m = merge_matrix(grids[i - 1], factor)
            v = v @ m
            down = m if down is None else down @ m
    last = last if down is None else last @ down
    return last[0], v[0]


def plot_windows(image: torch.Tensor, layouts: list[dict], path: str | Path, *, title: str = "") -> Path:
    """The image under each layout's attention groups (see the module docstring).

    Args:
        image: ``(C, H, W)`` or ``(C, L)``.
        layouts: per panel, ``{"name", "layout" (WindowLayout), "cell" (token size in pixels)}``.
    """
    from matplotlib import colormaps

    plt = pyplot()
    one_d = image.dim() == 2
    n = len(layouts)
    fig, axes = plt.subplots(n if one_d else 1, 1 if one_d else n, squeeze=False,
                             figsize=(9.0, 1.3 * n + 0.6) if one_d else (2.7 * n + 0.4, 3.2))
    for ax, item in zip(axes.flatten(), layouts, strict=True):
        lay, (cell_h, cell_w) = item["layout"], item["cell"]
        grid_h, grid_w = lay.grid
        groups = lay.groups().view(grid_h, grid_w)
        _, ids = torch.unique(groups, return_inverse=True)  # groups numbered 0..k-1 in order
        colours = torch.tensor(colormaps["tab20"](((ids % 20).float() / 19.999).flatten().numpy()))[:, :3]
        if one_d:
            L = image.shape[-1]
            strip = torch.zeros(L, 3)
            for j in range(grid_w):
                strip[j * cell_w:(j + 1) * cell_w] = colours[j]
            ax.imshow(strip[None].numpy(), aspect="auto", extent=(-0.5, L - 0.5, -1, 1), alpha=0.6)
            trace = image.float().reshape(-1)
            trace = (trace - trace.min()) / (trace.max() - trace.min() + 1e-8) * 1.8 - 0.9
            ax.plot(range(L), trace.numpy(), color="black", lw=1.2)
            for j in range(1, grid_w):
                if groups[0, j] != groups[0, j - 1]:
                    ax.axvline(j * cell_w - 0.5, color="black", lw=2)
            ax.set_yticks([])
            ax.set_xlim(-0.5, L - 0.5)
        else:
            H, W = image.shape[-2:]
            show_image(ax, image, brightness=0.8)
            rgb = colours.view(grid_h, grid_w, 3).repeat_interleave(cell_h, 0).repeat_interleave(cell_w, 1)[:H, :W]
            ax.imshow(torch.cat([rgb, torch.full((*rgb.shape[:2], 1), 0.45)], -1).numpy(), interpolation="nearest")
            for row in range(grid_h):
                for col in range(grid_w):
                    y, x = row * cell_h - 0.5, col * cell_w - 0.5
                    if col > 0:  # the left edge of cell (r, c): thick where the group changes
                        ax.plot([x, x], [y, min(y + cell_h, H - 0.5)], color="black",
                                lw=2.2 if groups[row, col] != groups[row, col - 1] else 0.3)
                    if row > 0:
                        ax.plot([x, min(x + cell_w, W - 0.5)], [y, y], color="black",
                                lw=2.2 if groups[row, col] != groups[row - 1, col] else 0.3)
            ax.set_xlim(-0.5, W - 0.5)
            ax.set_ylim(H - 0.5, -0.5)
            ax.set_xticks([])
            ax.set_yticks([])
        ax.set_title(item["name"], fontsize=8)
    fig.suptitle(title or "Swin's windows", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.94))  # leave the suptitle its own row above the panels' titles
    return save_figure(fig, path)


def swin_viz(run, out_dir: Path, *, index: int | None = None, patch: int | None = None, layer: int | None = None,
             head: int | None = None, data: str | None = None, image: str | Path | None = None, **_) -> list[Path]:
    """Write ``windows.png`` and ``window_attention.png`` for a Swin run (options as :func:`~.vit.vit_viz`).

    Args:
        patch: the query: a patch of the first stage's grid (default: the one under the image centre).
        layer: draw only this block (default: every block).
        head: this head only (default: the mean of the heads).
    """
    model, config = run.model, run.model.config
    x, _, what = drawn_input(run, data=data, index=index, image=image)
    image_hw = (1, x.shape[-1]) if config.is_1d else tuple(x.shape[-2:])
    grid0 = model.patch_embed.grid(image_hw)
    blocks = model.block_layouts(grid0)
    out_dir = Path(out_dir)

    seen, panels = set(), []
    for block in blocks:
        lay = block["layout"]
        key = (block["stage"], lay.shift)
        if key in seen:
            continue
        seen.add(key)
        kind = f"SW-MSA, shifted by {lay.shift[1] if config.is_1d else lay.shift[0]}" if any(lay.shift) else "W-MSA"
        win = f"{lay.window[1]}" if config.is_1d else f"{lay.window[0]}×{lay.window[1]}"
        panels.append({"layout": lay, "cell": block["cell"],
                       "name": f"stage {block['stage'] + 1}: {kind}\n{lay.num_windows} window(s) of {win} tokens"})
    files = [plot_windows(x, panels, out_dir / "windows.png",
                          title=f"Swin's windows: tokens that attend to each other share a colour — {what}")]

    _check_index("patch", patch, grid0[0] * grid0[1])
    if patch is None:
        pixel = (image_hw[0] // 2, image_hw[1] // 2)
    else:
        patch_h, patch_w = config.patch_hw
        pixel = ((patch // grid0[1]) * patch_h + patch_h // 2, (patch % grid0[1]) * patch_w + patch_w // 2)
    which = select(len(blocks), layer, "layer")
    with torch.no_grad():
        maps = model.attention_maps(x[None].to(next(model.parameters()).device))["self"]
    plt = pyplot()
    n = len(which)
    cols = min(n, 4)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, squeeze=False,
                             figsize=(3.6 * cols, 1.8 * rows + 0.5) if config.is_1d else (2.6 * cols, 2.7 * rows + 0.4))
    for ax in axes.flatten()[n:]:
        ax.axis("off")
    for ax, i in zip(axes.flatten(), which, strict=False):
        block, att = blocks[i], maps[i][0].float().cpu()  # (H, L, L)
        _check_index("head", head, att.shape[0])
        q = _cell_of(pixel, block["cell"], block["grid"])
        row = att[:, q].mean(0) if head is None else att[head, q]  # (L,)
        geom = {"grid": block["grid"], "patch": block["cell"], "stride": block["cell"], "offset": (0, 0),
                "image_hw": image_hw}
        box = ((q // block["grid"][1]) * block["cell"][0], (q % block["grid"][1]) * block["cell"][1], *block["cell"])
        if config.is_1d:
            _signal_strip(ax, x, row, geom, box=box, peak=float(row.max()))
        else:
            heat = patch_map(row, block["grid"], image_hw, block["cell"], block["cell"])
            _overlay(ax, x, heat, peak=float(row.max()))
            _outline(ax, box)
        shifted = "SW-MSA" if any(block["layout"].shift) else "W-MSA"
        ax.set_title(f"block {i} (stage {block['stage'] + 1}, {shifted})", fontsize=8)
    who = "mean of heads" if head is None else f"head {head}"
    fig.suptitle(f"where the token under pixel {pixel} looks, per block ({who}) — {what}", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.94), h_pad=2.0)  # room for each row's titles
    files.append(save_figure(fig, out_dir / "window_attention.png"))

    last, rel = swin_rollout([m[0].cpu() for m in maps], [block["grid"] for block in blocks], config.merge_factor)
    geom0 = {"grid": grid0, "patch": config.patch_hw, "stride": config.patch_hw, "offset": (0, 0), "image_hw": image_hw}
    files.append(plot_rollout(x, last, rel, geom0, out_dir / "rollout.png", query="mean-pooled output",
                              title=f"attention rollout through {len(blocks)} blocks and the merges — {what}"))
    return files
