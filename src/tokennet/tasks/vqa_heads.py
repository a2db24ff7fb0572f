"""Self-attention over the picture, head by head: how far each head looks, and whether an animal's patches attend to
the same animal's other patches.

The lecture: *"each attention layer can be attending to different things. One can learn to attend to shapes and
one ... to textures"*, and the notes' *"the learned projections happen to make each bird-head patch attend to the
other bird-head patches"*. Two measures of a trained question-answering transformer's patch tokens, per layer and
head (:func:`head_statistics`):

- **mean attention distance** (Dosovitskiy et al. 2021, https://arxiv.org/abs/2010.11929, Fig. 7): for a patch
  query ``i``, ``Σ_j Â_ij ‖c_i − c_j‖`` over the patch keys ``j`` (``Â``: its row of ``A`` renormalized over the
  patches, ``c``: a patch's centre in pixels), averaged over the patches and the pictures — the ViT paper's
  "distance in image space across which information is integrated". A head that looks at its neighbours has a
  small distance, one that looks across the picture a large one;
- **grouping**: for each patch of an animal that covers several patches, the share of ``Â`` on that animal's
  other patches, ``Σ_{j ∈ own, j ≠ i} Â_ij / (1 − Â_ii)``, over their share of the other patches
  ``(m − 1)/(N − 1)``: 1 for a head blind to objects, above 1 for one whose patches find their own animal
  (:func:`~tokennet.tasks.vqa.patch_grouping` is the same ratio for the mean of the heads).

Both need patch tokens that meet: under ``modality_mask="patch-local"`` or ``"summary-reads"`` a patch attends only
to itself, and there is nothing to measure (:func:`patches_meet`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..data.vqa import QASet, encode_questions, object_patches

__all__ = ["patches_meet", "predict", "question_maps", "head_statistics", "head_summary", "patch_distances",
           "summary_targets", "SUMMARY_TARGETS"]

EVAL_BATCH = 250

LOCAL_MASKS = ("patch-local", "summary-reads")  # masks under which a patch attends only to its own tokens


def patches_meet(config) -> bool:
    """Whether a transformer's patch tokens can attend to other patches in some layer (a CNN has no patches)."""
    return getattr(config, "modality_mask", None) is not None and config.modality_mask not in LOCAL_MASKS


@torch.no_grad()
def predict(model, images: torch.Tensor, questions: torch.Tensor, batch_size: int = EVAL_BATCH) -> torch.Tensor:
    """Answer ids ``(N,)`` for images ``(N, 3, H, W)`` and word ids ``(N, T)``, in batches."""
    dev = next(model.parameters()).device
    out = [model((images[i:i + batch_size].to(dev), questions[i:i + batch_size].to(dev))).logits.argmax(-1).cpu()
           for i in range(0, len(images), batch_size)]
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


def question_maps(model, qa: QASet, idx: list[int], words) -> list[Tensor]:
    """Every layer's attention ``(n, H, L, L)`` (float, on the CPU) for the questions ``idx`` of ``qa``."""
    config = model.config
    images = qa.images[idx]
    questions = encode_questions([qa.questions[i] for i in idx], words, config.max_question_len)
    dev = next(model.parameters()).device
    per_batch = [[m.float().cpu() for m in model.attention_maps((images[start:start + EVAL_BATCH].to(dev),
                                                                 questions[start:start + EVAL_BATCH].to(dev)))["self"]]
                 for start in range(0, len(idx), EVAL_BATCH)]
    return [torch.cat([batch_maps[layer] for batch_maps in per_batch]) for layer in range(len(per_batch[0]))]


def patch_distances(grid: tuple[int, int], patch_size: int) -> Tensor:
    """``(N, N)`` distances in pixels between the centres of the patches of ``grid`` (row-major)."""
    grid_h, grid_w = grid
    rows = torch.arange(grid_h, dtype=torch.float32).repeat_interleave(grid_w)  # (N,)
    cols = torch.arange(grid_w, dtype=torch.float32).repeat(grid_h)  # (N,)
    centres = torch.stack([rows, cols], 1) * patch_size  # (N, 2): the same offset on every centre cancels
    return torch.cdist(centres, centres)


def _animal_patches(qa: QASet, idx: list[int], grid, patch_size: int) -> list[tuple[int, list[int]]]:
    """``(question position, the patches of one animal)`` for every animal that covers more than one patch."""
    out = []
    for j, i in enumerate(idx):
        for box in [*(qa.boxes[i] if qa.boxes else []), *(qa.other_boxes[i] if qa.other_boxes else [])]:
            patches = object_patches([box], grid, patch_size)
            if len(patches) > 1:
                out.append((j, patches))
    return out


def _grouping(attn: Tensor, animals: list[tuple[int, list[int]]], N: int) -> list[float]:
    """Per head, the grouping ratio of patch-to-patch attention ``attn`` ``(n, H, N, N)`` (rows renormalized)."""
    mass = torch.zeros(attn.shape[1])
    share = 0.0
    for j, patches in animals:
        for src in patches:
            own = [other for other in patches if other != src]
            row = attn[j, :, src]  # (H, N)
            mass += row[:, own].sum(-1) / (1 - row[:, src]).clamp_min(1e-12)
            share += len(own) / (N - 1)
    return [round(float(value / share), 4) for value in mass]


@torch.no_grad()
def head_statistics(model, qa: QASet, words, *, limit: int = 200) -> dict[str, Any]:
    """Per layer and head, over the first ``limit`` questions of ``qa``: ``distance`` (mean attention distance in
    pixels; ``uniform_distance``: that of a head attending to every patch alike), ``patch_share`` (the share of a
    patch query's attention that goes to patches at all, the rest to the question's tokens) and, when some animal
    covers several patches, ``grouping`` (the ratio above). Each is ``{layer: [one value per head]}``; ``{}`` for a
    model whose patches never meet."""
    config = model.config
    if not patches_meet(config):
        return {}
    N, n_text = config.num_patches, config.num_text
    idx = list(range(min(limit, len(qa))))
    dist = patch_distances(config.grid, config.patch_size)  # (N, N)
    animals = _animal_patches(qa, idx, config.grid, config.patch_size)
    out: dict[str, Any] = {"distance": {}, "patch_share": {}, "grouping": {}, "patch_size": config.patch_size,
                           "questions": len(idx), "uniform_distance": round(float(dist.mean()), 3)}
    for layer, amap in enumerate(question_maps(model, qa, idx, words)):
        rows = amap[:, :, n_text:]  # (n, H, N, L): the patch queries' rows
        to_patches = rows[..., n_text:]  # (n, H, N, N)
        total = to_patches.sum(-1, keepdim=True)  # (n, H, N, 1)
        attn = to_patches / total.clamp_min(1e-12)
        out["distance"][layer] = [round(float(value), 3) for value in (attn * dist).sum(-1).mean((0, 2))]
        out["patch_share"][layer] = [round(float(value), 4) for value in total[..., 0].mean((0, 2))]
        if animals:
            out["grouping"][layer] = _grouping(attn, animals, N)
    return out


def head_summary(stats: dict[str, Any]) -> dict[str, float]:
    """:func:`head_statistics` as flat metrics: ``head_distance_layer<ℓ>_head<h>`` (pixels),
    ``head_grouping_layer<ℓ>_head<h>``, and over all heads the smallest and largest distance
    (``head_distance_min``, ``head_distance_max``: do the heads differ?) and the largest grouping ratio."""
    if not stats:
        return {}
    out: dict[str, float] = {}
    for kind in ("distance", "grouping"):
        for layer, heads in stats[kind].items():
            out.update({f"head_{kind}_layer{layer}_head{head}": value for head, value in enumerate(heads)})
    distances = [value for heads in stats["distance"].values() for value in heads]
    out["head_distance_min"], out["head_distance_max"] = min(distances), max(distances)
    if stats["grouping"]:
        out["head_grouping_max"] = max(value for heads in stats["grouping"].values() for value in heads)
    return out


SUMMARY_TARGETS = ("asked", "other_patches", "words", "summary", "sink")


@torch.no_grad()
def summary_targets(model, qa: QASet, words) -> dict[str, Any]:
    """What the question's summary token (the token the answer is read from) attends to, per layer and head.

    Its row of each head's ``A`` is split, over the questions of ``qa`` about at least one animal, into the share on
    the asked animals' patches (``asked``), on the picture's other patches (``other_patches``), on the question's
    words (``words``), on itself (``summary``) and on the sink (``sink``, 0 without one); the five sum to 1.
    ``asked_patch_share`` is the asked animals' share of the patches: what ``asked`` would be for a head that
    looks at every patch alike.

    Returns:
        ``{"questions": n, "asked_patch_share": s, "shares": {layer: [{target: share} per head]}}``; ``{}`` when no
        question of ``qa`` is about an animal.
    """
    config = model.config
    idx = [i for i in range(len(qa)) if qa.boxes and qa.boxes[i]]
    if not idx:
        return {}
    n_text, first_word = config.num_text, 1 + int(getattr(config, "sink", False))
    asked = torch.zeros(len(idx), config.num_patches)  # (n, N): 1 on the asked animals' patches
    for row, i in enumerate(idx):
        asked[row, object_patches(qa.boxes[i], config.grid, config.patch_size)] = 1.0
    shares: dict[int, list[dict[str, float]]] = {}
    for layer, amap in enumerate(question_maps(model, qa, idx, words)):
        row = amap[:, :, 0]  # (n, H, L): the summary token's row in each head
        on_asked = (row[..., n_text:] * asked[:, None]).sum(-1)  # (n, H)
        parts = {"asked": on_asked, "other_patches": row[..., n_text:].sum(-1) - on_asked,
                 "words": row[..., first_word:n_text].sum(-1), "summary": row[..., 0],
                 "sink": row[..., 1] if first_word == 2 else torch.zeros_like(on_asked)}
        means = {target: part.mean(0) for target, part in parts.items()}  # each (H,)
        shares[layer] = [{target: round(float(means[target][head]), 4) for target in SUMMARY_TARGETS}
                         for head in range(row.shape[1])]
    return {"questions": len(idx), "asked_patch_share": round(float(asked.mean()), 4), "shares": shares}
