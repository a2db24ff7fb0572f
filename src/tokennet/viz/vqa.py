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

from ..data.vqa import encode_questions, object_patches
from .attention_maps import attention_rollout, overlay, patch_map, pyplot, save_figure, select, show_image
from .cnn import receptive_field_box, upsample_map

__all__ = ["question_rollout", "draw_transformer_item", "draw_cnn_item", "overlay", "draw_two_questions",
           "draw_sink_curve", "draw_patch_grouping", "draw_head_statistics"]


def question_rollout(maps: list[Tensor], num_text: int) -> Tensor:
    """The summary token's rolled-out attention over the patches ``(B, N)``, renormalized over the patches:
    row 0 of ``R = Â_L ⋯ Â_1``, ``Â = ½ mean_h A + ½ I`` (:func:`~tokennet.viz.attention_maps.attention_rollout`)."""
    relevance = attention_rollout(maps)[:, 0, num_text:]  # (B, N)
    return relevance / relevance.sum(-1, keepdim=True).clamp_min(1e-12)


def _title(question: str, got: str, expected: str | None) -> str:
    verdict = "" if expected is None else (" ✓" if got == expected else f" ✗ (expected {expected})")
    return f"{question} → {got}{verdict}"


@torch.no_grad()
def draw_transformer_item(model, spec, image: Tensor, question: str, got: str, expected: str | None, boxes,
                          path: Path, *, layer: int | None = None, head: int | None = None) -> Path:
    """One question over one image: rows = layers, columns = heads, the mean of heads, and (last row) the
    image and the rollout. Each panel is the summary token's attention over the patches, renormalized over
    the patches; the corner label is the share of the question's attention that went to the image at all."""
    cfg = model.config
    dev = next(model.parameters()).device
    question_ids = encode_questions([question], spec.words, cfg.max_question_len)
    maps = [m.float().cpu() for m in model.attention_maps((image[None].to(dev), question_ids.to(dev)))["self"]]
    layers, heads = select(cfg.num_layers, layer, "layer"), select(cfg.num_heads, head, "head")
    n = cfg.num_text
    geom = (cfg.grid, (cfg.image_size, cfg.image_size), (cfg.patch_size, cfg.patch_size),
            (cfg.patch_size, cfg.patch_size))
    cols = len(heads) + 1
    plt = pyplot()
    fig, axes = plt.subplots(len(layers) + 1, cols, figsize=(1.7 * cols + 0.4, 1.75 * (len(layers) + 1) + 0.5),
                             squeeze=False)
    for panel_row, layer_idx in enumerate(layers):
        row = maps[layer_idx][0, :, 0]  # (H, L): the summary token's row per head
        for j, head_idx in enumerate([*heads, None]):
            att = row.mean(0) if head_idx is None else row[head_idx]
            img = att[n:]
            overlay(axes[panel_row, j], image, patch_map(img / img.sum().clamp_min(1e-12), *geom), boxes,
                    f"to image {float(img.sum()):.2f}")
            which = "mean of heads" if head_idx is None else f"head {head_idx}"
            axes[panel_row, j].set_title(f"layer {layer_idx} · {which}", fontsize=7)
    roll = question_rollout(maps, n)[0]
    show_image(axes[-1, 0], image)
    axes[-1, 0].set_xticks([])
    axes[-1, 0].set_yticks([])
    axes[-1, 0].set_title("the image", fontsize=7)
    overlay(axes[-1, 1], image, patch_map(roll, *geom), boxes)
    axes[-1, 1].set_title(f"rollout ({cfg.num_layers} layers)", fontsize=7)
    for ax in axes[-1, 2:]:
        ax.axis("off")
    fig.suptitle(_title(question, got, expected) + "\nwhere the question's summary token looks (cyan: the objects "
                 "it asks about)", fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


@torch.no_grad()
def draw_cnn_item(model, spec, image: Tensor, question: str, got: str, expected: str | None, path: Path) -> Path:
    """The image with one unit's receptive field, and each unit's vote for the answer (its activation map)."""
    cfg = model.config
    dev = next(model.parameters()).device
    question_ids = encode_questions([question], spec.words, cfg.max_question_len)
    cam, _ = model.answer_map((image[None].to(dev), question_ids.to(dev)))
    image_hw = tuple(image.shape[-2:])
    field = model.receptive_field()
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(5.6, 3.1))
    show_image(axes[0], image)
    receptive_field_box(axes[0], field, image_hw)
    axes[0].set_title(f"one unit's receptive field: {field.size} px", fontsize=8)
    overlay(axes[1], image, upsample_map(cam[0].cpu(), image_hw))
    axes[1].set_title("each unit's vote for the answer (CAM, > 0)", fontsize=8)
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(_title(question, got, expected), fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


@torch.no_grad()
def draw_two_questions(model, spec, image: Tensor, questions, answers, boxes, path: Path) -> Path:
    """One picture, two questions, side by side: the summary token's rolled-out attention over the patches for
    each (cyan: the animal each asks about) — *if your problem changes, you'll attend to different things*."""
    cfg = model.config
    dev = next(model.parameters()).device
    question_ids = encode_questions(list(questions), spec.words, cfg.max_question_len)
    x = image[None].expand(len(questions), -1, -1, -1)
    maps = [m.float().cpu() for m in model.attention_maps((x.to(dev), question_ids.to(dev)))["self"]]
    roll = question_rollout(maps, cfg.num_text)  # (2, N)
    geom = (cfg.grid, (cfg.image_size, cfg.image_size), (cfg.patch_size, cfg.patch_size),
            (cfg.patch_size, cfg.patch_size))
    plt = pyplot()
    fig, axes = plt.subplots(1, len(questions), figsize=(2.9 * len(questions), 3.3), squeeze=False)
    for j, (text, got, box) in enumerate(zip(questions, answers, boxes, strict=True)):
        on_animal = float(roll[j][_patches(cfg, box)].sum())
        overlay(axes[0, j], image, patch_map(roll[j], *geom), box, f"on the asked animal {on_animal:.2f}")
        axes[0, j].set_title(f"{text}\n→ {got}", fontsize=7)
    fig.suptitle("the same picture, two questions: where the summary token looks (rollout)", fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


def _patches(c, boxes) -> list[int]:
    return object_patches(boxes, c.grid, c.patch_size)


def draw_sink_curve(sw: dict, path: Path, counted: dict | None = None) -> Path:
    """The learned counter against the hand-built one: per head (faint) and for the head that tracks it best
    (bold), the summary token's mean weight on the sink against ``k``, the number of animals counted, beside the
    construction's exact ``1 / (k + 1)`` (``tokennet demo counting``); with ``counted``
    (:func:`~tokennet.tasks.vqa.counted_mass`), a second panel: per layer, the summary token's weight on the ``k``
    counted animals, beside the construction's ``k / (k + 1)`` and the fitted ``k / (k + c)``."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2 if counted else 1, figsize=(9.2 if counted else 4.6, 3.2), squeeze=False)
    ax = axes[0, 0]
    counts = sw["k"]
    exact = [1 / (k + 1) for k in counts]
    ax.plot(counts, exact, "k--", lw=1.5, label="hand-built counter: 1/(k+1)")
    for name, curve in sw["heads"].items():
        best = name == sw["best"]
        ax.plot(list(curve["by_k"]), list(curve["by_k"].values()), "o-" if best else "-", lw=2 if best else 0.7,
                alpha=1 if best else 0.35, color="C3" if best else "C0",
                label=f"layer.head {name} (r = {curve['r']:.2f}), best" if best else None)
    ax.set_xlabel("k: animals counted (the answer)")
    ax.set_ylabel("summary token's weight on the sink")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=6.5)
    ax.set_title("does the trained model count with the sink? (each line: one head)", fontsize=8)
    if counted:
        ax = axes[0, 1]
        counts = counted["k"]
        ax.plot(counts, [k / (k + 1) for k in counts], "k--", lw=1.5, label="hand-built counter: k/(k+1)")
        for layer, layer_curve in counted["layers"].items():
            best = layer == counted["best"]
            ax.plot(list(layer_curve["by_k"]), list(layer_curve["by_k"].values()), "o-" if best else "-",
                    lw=2 if best else 0.8, alpha=1 if best else 0.45, color="C3" if best else "C0",
                    label=f"layer {layer}" + (f", best: fits k/(k+{layer_curve['c']:.1f})" if best else ""))
            if best:
                ax.plot(counts, [k / (k + layer_curve["c"]) for k in counts], ":", color="C3", lw=1.2)
        ax.set_xlabel("k: animals counted (the answer)")
        ax.set_ylabel("summary token's weight on the counted animals")
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=6.5)
        ax.set_title("what it does instead: the rest of the weight is its sink", fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


@torch.no_grad()
def draw_patch_grouping(model, spec, image: Tensor, question: str, boxes, path: Path, layer: int = 0) -> Path:
    """Objects group themselves: for one patch of each animal (its top-left patch), that patch token's attention
    over the other patches in ``layer`` (mean of heads), its own animal outlined. Needs patches smaller than an
    animal (e.g. ``patch_size=8``: four per animal)."""
    cfg = model.config
    dev = next(model.parameters()).device
    question_ids = encode_questions([question], spec.words, cfg.max_question_len)
    maps = model.attention_maps((image[None].to(dev), question_ids.to(dev)))["self"]
    att = maps[layer].float().cpu()[0].mean(0)  # (L, L)
    n = cfg.num_text
    geom = (cfg.grid, (cfg.image_size, cfg.image_size), (cfg.patch_size, cfg.patch_size),
            (cfg.patch_size, cfg.patch_size))
    shown = [box for box in boxes if len(_patches(cfg, [box])) > 1][:4]
    plt = pyplot()
    fig, axes = plt.subplots(1, max(1, len(shown)), figsize=(2.3 * max(1, len(shown)), 2.7), squeeze=False)
    for j, box in enumerate(shown):
        src = _patches(cfg, [box])[0]
        row = att[n + src, n:].clone()
        row[src] = 0  # its attention to itself is not grouping
        overlay(axes[0, j], image, patch_map(row / row.sum().clamp_min(1e-12), *geom), [box],
                f"own animal {float(row[_patches(cfg, [box])].sum() / row.sum().clamp_min(1e-12)):.2f}")
        axes[0, j].set_title(f"patch {src}'s attention (layer {layer})", fontsize=7)
    if not shown:
        axes[0, 0].axis("off")
        axes[0, 0].set_title(f"{cfg.patch_size}-px patches: one per animal, nothing to group", fontsize=7)
    fig.suptitle("objects group themselves: a patch looks at its own animal's other patches (cyan)", fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


def draw_head_statistics(stats: dict, path: Path) -> Path:
    """Each head's mean attention distance against its layer (as the ViT paper's Fig. 7 draws it), and, when some
    animal covers several patches, each head's grouping ratio (1 = blind to objects), from
    :func:`~tokennet.tasks.vqa_heads.head_statistics`."""
    plt = pyplot()
    panels = 2 if stats["grouping"] else 1
    fig, axes = plt.subplots(1, panels, figsize=(4.4 * panels, 3.1), squeeze=False)
    ax = axes[0, 0]
    for layer, heads in stats["distance"].items():
        ax.scatter([int(layer)] * len(heads), heads, s=22, color="C0")
        for head, value in enumerate(heads):
            ax.annotate(str(head), (int(layer), value), textcoords="offset points", xytext=(5, -3), fontsize=6)
    ax.axhline(stats["uniform_distance"], color="grey", ls=":", lw=1, label="attending to every patch alike")
    ax.set_ylim(0, 1.15 * max(stats["uniform_distance"], *(v for heads in stats["distance"].values() for v in heads)))
    ax.legend(fontsize=7)
    ax.set_xlabel("layer")
    ax.set_ylabel("mean attention distance (px)")
    ax.set_title(f"how far each head looks ({stats['patch_size']}-px patches; labels: heads)", fontsize=8)
    if stats["grouping"]:
        ax = axes[0, 1]
        for layer, heads in stats["grouping"].items():
            ax.scatter([int(layer)] * len(heads), heads, s=22, color="C2")
        ax.axhline(1.0, color="grey", ls=":", lw=1, label="blind to objects")
        ax.set_xlabel("layer")
        ax.set_ylabel("own animal's patches / their share")
        ax.set_title("does a patch attend to its own animal?", fontsize=8)
        ax.legend(fontsize=7)
    for ax in axes[0]:
        ax.set_xticks(sorted(int(layer) for layer in stats["distance"]))
    fig.tight_layout()
    return save_figure(fig, path)
