"""The impala and the gazelle: does a patch's token learn what animal it shows from the patches that look like it?

The lecture (transcript): *"If this patch wants to get a better estimate of what it is, maybe it should attend to
other things that are similar, and then ensemble or average the results to now say, I'm not sure if I'm an impala
or I'm a gazelle or what I am. So I will attend to other things that look like me in the image. And then I will
update my own representation by aggregating information from the other things that are similar."*

:func:`species_probe` tests it on a trained question-answering transformer. Pictures drawn as training's are (the
run's scene generator, never the ones it trained on), each with one of the run's questions; every patch that one
animal covers is read at the trunk's input (depth 0: its patch embedding plus position) and after each block
``ℓ``; a **linear probe** — multinomial logistic regression on the standardized token — is fit on the patches of
70 % of the pictures to name the animal's species, and scored on the other 30 %. Its accuracy per depth is what
the patch's token *knows* there. The lecture predicts it rises with depth.

The **controls** run the same trained model with attention cut by a mask, in every layer, at inference (the
probe refit on what the cut model's tokens hold):

- ``own``: a patch never attends to the other patches of its own animal (what the lecture's patch would average);
- ``alike``: nor to any patch of another animal of the same species (every "thing that looks like me").

If the patches' gain with depth comes from the look-alikes, the cut runs gain less. An animal that fits in one
patch (the default's 16-pixel patches over 16-pixel cells) has no other patches: ``own`` then cuts nothing, and
``patches_per_animal`` says so.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..data.vqa import IMAGE_SIZE, SPECIES, encode_questions, object_patches, render, sample_items
from ..errors import RunError
from ..linear_probe import linear_probe

__all__ = ["PROBE_CUTS", "ProbePictures", "probe_pictures", "cut_mask", "depth_tokens", "species_probe",
           "check_probe_run", "probe_run"]

PROBE_CUTS = ("none", "own", "alike")  # the model as trained; own animal's patches cut; look-alikes cut
TRAIN_SHARE = 0.7  # the share of the pictures the probe is fit on (the rest score it)


@dataclass
class ProbePictures:
    """Pictures for the probe: ``images (P, 3, H, W)``, one question each, and per picture its animals as
    ``(species index, patch indices)``."""

    images: Tensor
    questions: list[str]
    animals: list[list[tuple[int, list[int]]]]


def check_probe_run(run) -> None:
    """Refuse a run the probe cannot read: no patch tokens (a CNN, any non-vqa task) or no generated animals."""
    config = getattr(run.model, "config", None)
    data = run.data
    if getattr(run.task, "kind", None) != "vqa" or not getattr(data, "generated", False):
        raise RunError(f"{run.path} is not a question-answering run on tokennet's generated animal scenes "
                       f"({run.task.a_name} run): the probe asks each patch which species it shows")
    if not hasattr(config, "num_patches"):
        raise RunError(f"{run.path}'s model ({type(run.model).__name__}) has no patch tokens to probe (a CNN)")


def probe_pictures(count: int, *, seed: int, clutter: int, grid, patch_size: int) -> ProbePictures:
    """``count`` pictures of the generator's size drawn from ``(seed, "probe")``, a key no training batch uses, with
    each animal's patches on ``grid`` (only animals that cover at least one patch no other animal covers)."""
    items = sample_items(count, "probe", seed=seed, held_out=False, num_clutter=clutter)
    images = torch.from_numpy(np.stack([render(item.scene, IMAGE_SIZE, seed=zlib.crc32(f"probe-{seed}-{i}".encode()))
                                        for i, item in enumerate(items)]))
    animals = []
    for item in items:
        covered = [set(object_patches([animal.box], grid, patch_size)) for animal in item.scene.animals]
        shared = {patch for first, mine in enumerate(covered) for second, theirs in enumerate(covered) if first < second
              for patch in mine & theirs}
        animals.append([(SPECIES.index(animal.species), sorted(patches - shared))
                        for animal, patches in zip(item.scene.animals, covered, strict=True) if patches - shared])
    return ProbePictures(images, [item.question for item in items], animals)


def cut_mask(config, pictures: ProbePictures, cut: str) -> Tensor | None:
    """``(P, 1, L, L)`` bool, False where a patch's token may not attend to a key under ``cut`` (None for ``none``):
    ``own`` the other patches of its animal, ``alike`` those and every patch of an animal of its species."""
    if cut not in PROBE_CUTS:
        raise ValueError(f"cut must be one of {', '.join(PROBE_CUTS)}, got {cut!r}")
    if cut == "none":
        return None
    n_text, N, per_patch = config.num_text, config.num_patches, config.tokens_per_patch
    L = n_text + per_patch * N
    allowed = torch.ones(len(pictures.images), 1, L, L, dtype=torch.bool)
    for picture, animals in enumerate(pictures.animals):
        for species, patches in animals:
            hidden = {patch for other_species, others in animals if other_species == species for patch in others} \
                if cut == "alike" else set(patches)
            for src in patches:
                keys = [n_text + t * N + patch for patch in hidden if patch != src for t in range(per_patch)]
                for t in range(per_patch):
                    allowed[picture, 0, n_text + t * N + src, keys] = False
    return allowed


@torch.no_grad()
def depth_tokens(model, images: Tensor, questions: Tensor, extra_mask: Tensor | None = None) -> list[Tensor]:
    """The residual stream ``(B, L, D)`` at the trunk's input and after each block (``num_layers + 1`` float tensors on
    the CPU), with ``extra_mask`` (``(B, 1, L, L)`` bool) ANDed into every block's attention mask."""
    device = next(model.parameters()).device
    images, questions = images.to(device), questions.to(device)
    extra_mask = None if extra_mask is None else extra_mask.to(device)
    seen: list[Tensor] = []
    handles = []
    blocks = model.encoder.layers()

    def before(_block, args, kwargs):
        if not seen:
            seen.append(args[0].detach().float().cpu())
        if extra_mask is not None:
            mask = kwargs.get("mask")
            kwargs["mask"] = extra_mask if mask is None else mask & extra_mask
        return args, kwargs

    def after(_block, _args, output):
        seen.append((output[0] if isinstance(output, tuple) else output).detach().float().cpu())

    for block in dict.fromkeys(blocks):  # a shared block is hooked once and called at every depth
        handles.append(block.register_forward_pre_hook(before, with_kwargs=True))
        handles.append(block.register_forward_hook(after))
    try:
        model.forward_features((images, questions))
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _patch_rows(config, pictures: ProbePictures, picks: range) -> tuple[list[int], list[list[int]], Tensor]:
    """For the pictures ``picks``: each labelled patch's picture, its token positions, and the species labels."""
    n_text, N, per_patch = config.num_text, config.num_patches, config.tokens_per_patch
    owners, positions, labels = [], [], []
    for picture in picks:
        for species, patches in pictures.animals[picture]:
            for patch in patches:
                owners.append(picture)
                positions.append([n_text + t * N + patch for t in range(per_patch)])
                labels.append(species)
    return owners, positions, torch.tensor(labels)


def _features(stream: Tensor, owners: list[int], positions: list[list[int]]) -> Tensor:
    """Each labelled patch's token (the mean of its tokens when a patch has two) from ``stream (P, L, D)``."""
    return torch.stack([stream[picture, pos].mean(0) for picture, pos in zip(owners, positions, strict=True)])


def species_probe(model, words, pictures: ProbePictures, *, cuts=PROBE_CUTS, batch: int = 100) -> dict[str, Any]:
    """Per cut, the probe's test accuracy at each depth (``{cut: [acc at depth 0, …, after block L]}``, %), with
    ``chance`` (the majority species' share of the test patches), ``patches_per_animal`` and the counts."""
    config = model.config
    questions = encode_questions(pictures.questions, words, config.max_question_len)
    split = round(TRAIN_SHARE * len(pictures.images))
    fit_rows = _patch_rows(config, pictures, range(split))
    score_rows = _patch_rows(config, pictures, range(split, len(questions)))
    patch_counts = [len(patches) for animals in pictures.animals for _, patches in animals]
    test_labels = score_rows[2]
    out: dict[str, Any] = {"depths": config.num_layers + 1, "pictures": len(questions),
                           "test_pictures": len(questions) - split, "fit_patches": len(fit_rows[2]),
                           "test_patches": len(test_labels),
                           "patches_per_animal": round(sum(patch_counts) / max(1, len(patch_counts)), 3),
                           "chance": round(100.0 * float(torch.bincount(test_labels).max()) / len(test_labels), 2)}
    was_training = model.training
    model.eval()
    try:
        for cut in cuts:
            mask = cut_mask(config, pictures, cut)
            streams = [torch.cat(parts) for parts in zip(*[
                depth_tokens(model, pictures.images[i:i + batch], questions[i:i + batch],
                             None if mask is None else mask[i:i + batch]) for i in range(0, len(questions), batch)])]
            out[cut] = [linear_probe(_features(stream, *fit_rows[:2]), fit_rows[2], _features(stream, *score_rows[:2]),
                                     score_rows[2], len(SPECIES)) for stream in streams]
    finally:
        model.train(was_training)
    return out


def probe_run(run, *, pictures: int = 400, cuts=PROBE_CUTS) -> dict[str, Any]:
    """:func:`species_probe` on ``pictures`` new pictures of ``run``'s generator, after :func:`check_probe_run`
    (what ``tokennet probe RUN`` prints)."""
    check_probe_run(run)
    config = run.model.config
    drawn = probe_pictures(pictures, seed=run.data.seed, clutter=run.data.clutter, grid=config.grid,
                           patch_size=config.patch_size)
    return species_probe(run.model, run.data.words, drawn, cuts=cuts)
