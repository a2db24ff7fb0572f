"""``tokennet viz`` for question-answering runs: where the question looks, and what a CNN's units vote.

- **Transformer**: row ``q`` (the question's summary token) of every layer's ``A = softmax(Q Kᵀ / √E)``,
  restricted to the patch columns and drawn over the image — per layer and head, the mean of the heads, and
  the rollout through all layers (Abnar & Zuidema 2020). The objects the question asks about are outlined.
- **CNN**: the answer's class activation map, ``M(u) = w_answer · h_u`` (the logit is their mean), and
  one unit's receptive field drawn as a box: what any single unit could have looked at.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from ..data.vqa import encode_questions
from .attention_maps import attention_rollout, patch_map, pyplot, save_figure, select, show_image

__all__ = ["question_rollout", "draw_transformer_item", "draw_cnn_item", "overlay"]


def question_rollout(maps: list[Tensor], num_text: int) -> Tensor:
    """The summary token's rolled-out attention over the patches ``(B, N)``, renormalized over the patches:
    row 0 of ``R = Â_L ⋯ Â_1``, ``Â = ½ mean_h A + ½ I`` (:func:`~tokennet.viz.attention_maps.attention_rollout`)."""
    r = attention_rollout(maps)[:, 0, num_text:]  # (B, N)
    return r / r.sum(-1, keepdim=True).clamp_min(1e-12)


def overlay(ax, image: Tensor, heat: Tensor, boxes=(), label: str | None = None) -> None:
    """The image, dimmed, under a heat map ``(H, W)`` scaled to its maximum; object boxes outlined in cyan."""
    from matplotlib import colormaps
    from matplotlib.patches import Rectangle

    show_image(ax, image, brightness=0.6)
    h = heat.detach().float().cpu()
    h = (h / h.max().clamp_min(1e-12)).numpy()
    rgba = colormaps["inferno"](h)
    rgba[..., 3] = 0.75 * h
    ax.imshow(rgba, interpolation="nearest")
    for top, left, bh, bw in boxes:
        ax.add_patch(Rectangle((left - 0.5, top - 0.5), bw, bh, fill=False, edgecolor="cyan", linewidth=1.2))
    if label:
        ax.text(0.02, 0.02, label, transform=ax.transAxes, fontsize=6.5, color="white",
                bbox={"facecolor": "black", "alpha": 0.5, "pad": 1, "linewidth": 0})
    ax.set_xticks([])
    ax.set_yticks([])


def _title(question: str, got: str, expected: str | None) -> str:
    verdict = "" if expected is None else (" ✓" if got == expected else f" ✗ (expected {expected})")
    return f"{question} → {got}{verdict}"


@torch.no_grad()
def draw_transformer_item(model, spec, image: Tensor, question: str, got: str, expected: str | None, boxes,
                          path: Path, *, layer: int | None = None, head: int | None = None) -> Path:
    """One question over one image: rows = layers, columns = heads, the mean of heads, and (last row) the
    image and the rollout. Each panel is the summary token's attention over the patches, renormalized over
    the patches; the corner label is the share of the question's attention that went to the image at all."""
    c = model.config
    dev = next(model.parameters()).device
    q = encode_questions([question], spec.words, c.max_question_len)
    maps = [m.float().cpu() for m in model.attention_maps((image[None].to(dev), q.to(dev)))["self"]]
    layers, heads = select(c.num_layers, layer, "layer"), select(c.num_heads, head, "head")
    n = c.num_text
    geom = (c.grid, (c.image_size, c.image_size), (c.patch_size, c.patch_size), (c.patch_size, c.patch_size))
    cols = len(heads) + 1
    plt = pyplot()
    fig, axes = plt.subplots(len(layers) + 1, cols, figsize=(1.7 * cols + 0.4, 1.75 * (len(layers) + 1) + 0.5),
                             squeeze=False)
    for r, li in enumerate(layers):
        row = maps[li][0, :, 0]  # (H, L): the summary token's row per head
        for j, h in enumerate([*heads, None]):
            a = row.mean(0) if h is None else row[h]
            img = a[n:]
            overlay(axes[r, j], image, patch_map(img / img.sum().clamp_min(1e-12), *geom), boxes,
                    f"to image {float(img.sum()):.2f}")
            axes[r, j].set_title(f"layer {li} · {'mean of heads' if h is None else f'head {h}'}", fontsize=7)
    roll = question_rollout(maps, n)[0]
    show_image(axes[-1, 0], image)
    axes[-1, 0].set_xticks([])
    axes[-1, 0].set_yticks([])
    axes[-1, 0].set_title("the image", fontsize=7)
    overlay(axes[-1, 1], image, patch_map(roll, *geom), boxes)
    axes[-1, 1].set_title(f"rollout ({c.num_layers} layers)", fontsize=7)
    for ax in axes[-1, 2:]:
        ax.axis("off")
    fig.suptitle(_title(question, got, expected) + "\nwhere the question's summary token looks (cyan: the objects "
                 "it asks about)", fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


@torch.no_grad()
def draw_cnn_item(model, spec, image: Tensor, question: str, got: str, expected: str | None, path: Path) -> Path:
    """The image with one unit's receptive field, and each unit's vote for the answer (its activation map)."""
    from .cnn import receptive_field_box, upsample_map

    c = model.config
    dev = next(model.parameters()).device
    q = encode_questions([question], spec.words, c.max_question_len)
    cam, _ = model.answer_map((image[None].to(dev), q.to(dev)))
    hw = tuple(image.shape[-2:])
    rf = model.receptive_field()
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(5.6, 3.1))
    show_image(axes[0], image)
    receptive_field_box(axes[0], rf, hw)
    axes[0].set_title(f"one unit's receptive field: {rf.size} px", fontsize=8)
    overlay(axes[1], image, upsample_map(cam[0].cpu(), hw))
    axes[1].set_title("each unit's vote for the answer (CAM, > 0)", fontsize=8)
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(_title(question, got, expected), fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)
