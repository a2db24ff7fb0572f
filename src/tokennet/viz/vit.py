"""``tokennet viz`` for ViT runs: patch attention per layer and head, <cls> rollout, position similarity.

The run's test image ``index`` is drawn (the run's ``--data``, or ``data=``). Attention weights are
recomputed with the plain formula for the inspected layers, so runs trained with the fused backend work.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import DataError, RunError
from ..tokens.image import patch_padding
from .attention_maps import (
    attention_rollout,
    cosine_similarity_matrix,
    plot_patch_attention,
    plot_position_similarity,
    plot_rollout,
)

__all__ = ["vit_viz", "grid_geometry", "drawn_input"]


def grid_geometry(config, input_hw: tuple[int, int] | None = None) -> dict:
    """``grid, patch, stride, offset, image_hw`` of a ViT config's patch grid on an input of ``input_hw``."""
    image_hw = config.image_hw if input_hw is None else tuple(input_hw)
    patch, stride = config.patch_hw, config.stride_hw
    offset = (0, 0)
    if config.patch_embed == "conv-stem":
        # Stride-2 convolutions with padding 1 centre token k on pixel p·k: its cell is [p·k − p/2, p·k + p/2).
        offset = (patch[0] // 2, patch[1] // 2)
    elif config.pad:
        offset = tuple(patch_padding(side, patch_side, stride_side) // 2
                       for side, patch_side, stride_side in zip(image_hw, patch, stride, strict=True))
    from ..tokens.image import grid_size

    # A conv stem's token stands for a p × p cell around its centre (its receptive field is wider).
    return {"grid": grid_size(image_hw, patch, stride, pad=config.pad_grid), "patch": patch, "stride": stride,
            "offset": offset, "image_hw": image_hw}


def _check_index(name: str, value: int | None, n: int) -> None:
    if value is not None and not 0 <= value < n:
        raise DataError(f"{name} {value} out of range: 0..{n - 1}")


def drawn_input(run, *, data: str | None = None, index: int | None = None,
                image: str | Path | None = None) -> tuple[torch.Tensor, object, str]:
    """The input a picture draws: test image ``index`` (default 0) of the run's data (or ``data``), or an image
    file; returns ``(x (C, H, W) or (C, L), the dataset, "what: label …, predicted …")``."""
    from ..data.vision_data import ImageDataset

    model = run.model
    config = model.config
    spec = ImageDataset(source=data) if data is not None else run.data
    if spec is None:
        raise RunError(f"{run.path} has no run.json to say which data it was trained on; name the data")
    dataset = spec.load()
    if image is not None:
        from ..data.image_files import read_image

        if config.is_1d:
            raise DataError("drawing an image file needs a 2-D image model; this run classifies 1-D signals")
        x = read_image(image, channels=config.in_channels)  # (C, H, W)
        label, source = "?", Path(image).name
    else:
        index = 0 if index is None else index
        _check_index("index", index, len(dataset.y_test))
        x = dataset.x_test[index]  # (C, H, W) or (C, L)
        label, source = dataset.classes[int(dataset.y_test[index])], f"{dataset.name} test #{index}"
    with torch.no_grad():
        logits = model(x[None].to(next(model.parameters()).device)).logits
    pred = dataset.classes[int(logits.argmax(-1))] if config.num_classes == dataset.num_classes else "?"
    return x, dataset, f"{source}: label {label}, predicted {pred}"


def vit_viz(run, out_dir: Path, *, index: int | None = None, patch: int | None = None,
            layer: int | None = None, head: int | None = None, data: str | None = None,
            image: str | Path | None = None, **_) -> list[Path]:
    """Write ``patch_attention.png``, ``rollout.png`` and ``position_similarity.png`` for a ViT run, and for a
    DeiT (``distill``) ``distillation.png``: its distillation token's attention beside its class token's.

    Args:
        run: a loaded :class:`~tokennet.run.Run` of a ViT.
        out_dir: where the PNGs go.
        index: test image to draw (default 0).
        patch: the query patch (default: the centre of the grid).
        layer: draw only this layer (default: all).
        head: draw only this head (default: all, and their mean).
        data: the dataset (default: the run's).
        image: draw this image file instead of a test image (2-D models; grey images are repeated to the
            model's channels; another size works when the patches tile it: positions are interpolated).
    """
    model = run.model
    dev = next(model.parameters()).device
    config = model.config
    x, dataset, what = drawn_input(run, data=data, index=index, image=image)

    n_layers, n_heads = config.num_layers, config.num_heads
    _check_index("layer", layer, n_layers)
    _check_index("head", head, n_heads)
    geom = grid_geometry(config, (1, x.shape[-1]) if config.is_1d else tuple(x.shape[-2:]))
    grid_h, grid_w = geom["grid"]
    n_patches, P = grid_h * grid_w, config.num_prefix
    patch = (grid_h // 2) * grid_w + grid_w // 2 if patch is None else patch
    _check_index("patch", patch, n_patches)

    with torch.no_grad():  # per layer (H, P+N, P+N)
        maps = [layer_att[0].float().cpu() for layer_att in model.attention_maps(x[None].to(dev))["self"]]
    files = []

    layers = list(range(n_layers)) if layer is None else [layer]
    rows = {i: maps[i][:, P + patch, P:] for i in layers}  # (H, N): the patch's query row over the patches
    row, col = divmod(patch, grid_w)
    top, left = row * geom["stride"][0] - geom["offset"][0], col * geom["stride"][1] - geom["offset"][1]
    if config.is_1d:
        where = f"samples {max(0, left)}–{min(x.shape[-1], left + geom['patch'][1]) - 1}"
    else:
        where = f"grid row {row}, column {col}; pixels from ({top}, {left})"
    files.append(plot_patch_attention(x, rows, geom, patch, out_dir / "patch_attention.png",
                                      heads=None if head is None else [head],
                                      title=f"where patch {patch} ({where}) looks — {what}"))

    roll = attention_rollout([m[None] for m in maps])[0]  # (P + N, P + N)
    if config.pool == "cls":
        query, last, rel = "<cls>", maps[-1][:, 0, P:].mean(0), roll[0, P:]
    else:  # mean pooling: the output is the mean of the patch tokens, so average their rows
        query, last, rel = "mean-pooled output", maps[-1][:, P:, P:].mean((0, 1)), roll[P:, P:].mean(0)
    files.append(plot_rollout(x, last, rel, geom, out_dir / "rollout.png", query=query,
                              title=f"attention rollout ({n_layers} layers) — {what}"))

    if config.distill:
        files.append(plot_distillation(model, x, maps, roll, geom, out_dir / "distillation.png", what=what))

    if config.position != "none":
        sim = cosine_similarity_matrix(model.position_table(geom["grid"]).cpu())
        kind = "learned" if config.position == "learned" else "2-D Fourier"
        files.append(plot_position_similarity(sim, geom["grid"], out_dir / "position_similarity.png",
                                              title=f"{kind} position embeddings: cosine similarity "
                                                    f"({grid_h}×{grid_w} patches)"))
    return files



def plot_distillation(model, x: torch.Tensor, maps: list[torch.Tensor], roll: torch.Tensor, geom: dict,
                      path: Path, *, what: str = "") -> Path:
    """DeiT's two tokens side by side: the class token's and the distillation token's last-layer attention
    (mean of heads) and rollout over the image, and how alike the two tokens end up (DeiT's Table 1 note:
    they start almost orthogonal and converge in depth, without becoming the same)."""
    from .attention_maps import _overlay, _signal_strip, patch_map, pyplot, save_figure

    config = model.config
    P, dist_index = config.num_prefix, config.dist_index
    tokens = ([("<cls>", 0)] if config.pool == "cls" else []) + [("<dist>", dist_index)]
    with torch.no_grad():
        features = model.forward_features(x[None].to(next(model.parameters()).device))[0].float().cpu()  # (P + N, D)
        cls_vec = features[0] if config.pool == "cls" else features[P:].mean(0)
        cos = float(torch.nn.functional.cosine_similarity(cls_vec, features[dist_index], dim=0))
    plt = pyplot()
    one_d = x.dim() == 2
    fig, axes = plt.subplots(len(tokens), 2, squeeze=False, figsize=(7.0, 1.9 * len(tokens) + 0.4) if one_d
                             else (5.6, 2.8 * len(tokens) + 0.4))
    for row, (name, t) in zip(axes, tokens, strict=True):
        for ax, (kind, vals) in zip(row, [("last layer (mean of heads)", maps[-1][:, t, P:].mean(0)),
                                          ("rollout", roll[t, P:])], strict=True):
            if one_d:
                _signal_strip(ax, x, vals, geom, peak=float(vals.max()))
            else:
                _overlay(ax, x, patch_map(vals, geom["grid"], geom["image_hw"], geom["patch"], geom["stride"],
                                          geom["offset"]), peak=float(vals.max()))
            ax.set_title(f"{name}: {kind}", fontsize=9)
    head = "class" if config.pool == "cls" else "mean-pooled class"
    fig.suptitle(f"DeiT: the distillation token beside the {head} token (final cosine {cos:.2f}) — {what}",
                 fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)
