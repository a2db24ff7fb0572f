"""``tokennet viz`` for CNN classifiers: the class activation map and one unit's receptive field.

A GAP + linear head makes the logit a mean of local votes, ``z_c = mean_u w_c · h_u + b_c``; the map
``M_c(u) = w_c · h_u`` (Zhou et al. 2016, https://arxiv.org/abs/1512.04150) shows which units voted for the
class, and the receptive field says how much of the image any one of them could see.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from .attention_maps import overlay, pyplot, save_figure, show_image

__all__ = ["draw_class_activation", "receptive_field_box", "upsample_map"]


def upsample_map(m: Tensor, hw: tuple[int, int]) -> Tensor:
    """A feature-map-sized map ``(h, w)`` spread over the image ``hw`` (nearest neighbour), negatives cut to 0."""
    return torch.nn.functional.interpolate(m[None, None].float().clamp_min(0), size=hw, mode="nearest")[0, 0]


def receptive_field_box(ax, rf, hw: tuple[int, int]) -> None:
    """Outline, at the image's centre, the receptive field of one unit (clipped to the image)."""
    from matplotlib.patches import Rectangle

    box_h = min(rf.size, hw[0])
    box_w = min(rf.size, hw[1])
    ax.add_patch(Rectangle(((hw[1] - box_w) / 2 - 0.5, (hw[0] - box_h) / 2 - 0.5), box_w, box_h, fill=False,
                           edgecolor="cyan", linewidth=1.5))


@torch.no_grad()
def draw_class_activation(model, x: Tensor, path: Path, *, title: str = "", classes=None) -> Path:
    """The image with one unit's receptive field, and the predicted class's activation map over it."""
    dev = next(model.parameters()).device
    cam, cls = model.class_activation_map(x[None].to(dev))
    image_hw = tuple(x.shape[-2:])
    name = classes[int(cls)] if classes is not None and int(cls) < len(classes) else str(int(cls))
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(5.6, 3.0))
    show_image(axes[0], x)
    field = model.receptive_field()
    receptive_field_box(axes[0], field, image_hw)
    axes[0].set_title(f"one unit's receptive field: {field.size} px", fontsize=8)
    overlay(axes[1], x, upsample_map(cam[0].cpu(), image_hw))
    axes[1].set_title(f"votes for {name} (CAM, > 0)", fontsize=8)
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)
