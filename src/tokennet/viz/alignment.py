"""Cross-attention made visible: translation alignments and where each caption word looks in the image.

- **Alignment heatmaps** (Bahdanau et al. 2015, Fig. 3): for a translated sentence, the
  cross-attention ``A = softmax(Q_y K_xᵀ / √E)`` of every output token (rows) over the source tokens
  (columns), one panel per decoder layer and head. A Bahdanau model has one map (its additive
  attention).
- **Caption attention** (Xu et al. 2015, "Show, Attend and Tell", Fig. 2): for each word of a
  generated caption, its attention over the image patches, drawn over the image as light (patches
  the word attends to stay bright, the others go dark; each map scaled to its own maximum). For the
  decoder-only captioner it is the text row's self-attention restricted to the image tokens and
  renormalized (the rest of that row goes to earlier words).

Rows are labelled by the token *produced* at that step: row ``t`` is the attention of the query at
``y_{t−1}`` (``<bos>`` for the first) while predicting ``y_t``. Weights are recomputed with the plain
formula (``model.attention_maps``), so runs trained with the fused backend work.

:func:`seq2seq_viz` and :func:`caption_viz` are registered with :mod:`tokennet.viz` for
``tokennet viz RUN_DIR``.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import torch
from torch import Tensor, nn

from ..errors import DataError, RunError

__all__ = ["alignments", "plot_alignment", "plot_caption_attention", "seq2seq_viz", "caption_viz"]


# -- tensors ------------------------------------------------------------------------------------------
@torch.no_grad()
def alignments(model: nn.Module, inputs: Tensor, tgt_in: Tensor) -> Tensor:
    """Cross-attention weights ``(L, B, H, T, S)`` of a conditional model under teacher forcing.

    ``S`` is the source length (translation) or the number of image patches (captioning); every row
    sums to 1 (or 0 for a source that is all padding).

    Args:
        model: a Seq2Seq, Bahdanau, Captioner or PrefixCaptioner.
        inputs: source ids ``(B, S)`` or images ``(B, C, H, W)``.
        tgt_in: ``<bos>`` and the output tokens ``(B, T)``.
    """
    was_training = model.training
    model.eval()
    try:
        maps = model.attention_maps((inputs, tgt_in))
    finally:
        model.train(was_training)
    if "cross" in maps:  # encoder–decoder: each (B, H, T, S)
        return torch.stack(maps["cross"])
    # Decoder-only over [image; text]: the text queries' rows over the image keys, renormalized.
    P = model.config.num_patches
    weights = torch.stack(maps["self"])[..., P:, :P]  # (L, B, H, T, P)
    return weights / weights.sum(-1, keepdim=True).clamp_min(1e-12)


# -- plots --------------------------------------------------------------------------------------------
def _plt():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path) -> Path:
    plt = _plt()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _show(ch: str) -> str:
    return {" ": "␣", "": "∅"}.get(ch, ch)


def plot_alignment(weights: Tensor, source: list[str], output: list[str], path: str | Path, *,
                   layers: list[int] | None = None, heads: list[int] | None = None, title: str = "") -> Path:
    """Heatmaps of ``weights`` ``(L, H, T, S)``: output tokens (rows) × source tokens (columns).

    One panel per (layer, head); a last column shows the mean over heads when several are drawn.

    Args:
        weights: attention of one example.
        source: labels of the S source tokens.
        output: labels of the T output tokens (what each row produced).
        path: the PNG to write.
        layers, heads: the indices the rows/columns of panels stand for (default 0..L-1, 0..H-1).
        title: figure title.
    """
    plt = _plt()
    L, H, T, S = weights.shape
    if len(source) != S or len(output) != T:
        raise ValueError(f"weights are {T}×{S} but got {len(output)} output and {len(source)} source labels")
    layers = list(range(L)) if layers is None else layers
    heads = list(range(H)) if heads is None else heads
    with_mean = H > 1
    cols = H + with_mean
    cell = 0.26
    panel_w, panel_h = max(2.4, cell * S + 0.9), max(1.8, cell * T + 0.9)
    fig, axes = plt.subplots(L, cols, figsize=(panel_w * cols, panel_h * L), squeeze=False, layout="constrained")
    for i in range(L):
        for j in range(cols):
            ax = axes[i][j]
            panel = weights[i].mean(0) if j == H else weights[i, j]
            mappable = ax.imshow(panel.float().cpu().numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="equal")
            ax.set_xticks(range(S), [_show(label) for label in source], fontsize=8)
            ax.set_yticks(range(T), [_show(label) for label in output], fontsize=8)
            ax.tick_params(length=0)
            name = "mean of heads" if j == H else f"head {heads[j]}"
            ax.set_title(f"layer {layers[i]}, {name}" if L * cols > 1 else "attention", fontsize=9)
            if j == 0:
                ax.set_ylabel("output (produced)", fontsize=8)
            if i == L - 1:
                ax.set_xlabel("source", fontsize=8)
    fig.colorbar(mappable, ax=axes, shrink=0.8, aspect=30, label="attention weight")
    if title:
        fig.suptitle(title, fontsize=11)
    return _save(fig, path)


def plot_caption_attention(image: Tensor, weights: Tensor, words: list[str], grid: tuple[int, int],
                           path: str | Path, *, title: str = "") -> Path:
    """For each word, its attention over the image patches ``weights`` ``(T, P)`` drawn over ``image``.

    Args:
        image: ``(C, H, W)`` in [0, 1].
        weights: one row per word, over the ``P = gh·gw`` patches in row-major order.
        words: the T words (what each row produced).
        grid: the patch grid ``(gh, gw)``.
        path: the PNG to write.
        title: figure title (e.g. the caption and the reference).
    """
    plt = _plt()
    T, P = weights.shape
    grid_h, grid_w = grid
    if grid_h * grid_w != P or len(words) != T:
        raise ValueError(f"weights are {T}×{P}, grid {grid_h}×{grid_w}, {len(words)} words: they do not agree")
    img = image.permute(1, 2, 0).float().cpu().clamp(0, 1).numpy()  # (H, W, C)
    img_h, img_w = img.shape[:2]
    n = T + 1
    cols = min(n, 6)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.0 * cols, 2.2 * rows + 0.5), squeeze=False, layout="constrained")
    for k, ax in enumerate(axes.flat):
        if k > T:
            ax.axis("off")  # unused panel
            continue
        ax.set_xticks([])
        ax.set_yticks([])
        for spine in ax.spines.values():  # a frame, so a white background still shows where the image ends
            spine.set_edgecolor("0.6")
    axes[0][0].imshow(img, interpolation="nearest")
    axes[0][0].set_title("image", fontsize=9)
    for t in range(T):
        ax = axes[(t + 1) // cols][(t + 1) % cols]
        heat = weights[t].float().cpu().reshape(1, 1, grid_h, grid_w)
        heat = heat / heat.max().clamp_min(1e-12)  # each word's map on its own scale
        heat = torch.nn.functional.interpolate(heat, size=(img_h, img_w), mode="nearest")[0, 0].numpy()  # patch blocks
        # Attention as light: what the word looks at stays bright, the rest goes dark.
        ax.imshow(img * (0.12 + 0.88 * heat[..., None]), interpolation="nearest")
        ax.set_title(_show(words[t]), fontsize=10)
    if title:
        fig.suptitle(title, fontsize=9)
    return _save(fig, path)


# -- `tokennet viz` -----------------------------------------------------------------------------------
from .attention_maps import select as _select  # noqa: E402


def _tokens_out(model, tok, ids: list[int]) -> tuple[Tensor, list[str]]:
    """``<bos> y`` for teacher forcing and the labels of what each row produces (``y`` then ``<eos>``)."""
    config = model.config
    tgt_in = torch.tensor([[config.bos_id, *ids]])
    return tgt_in, [tok.decode([i]) for i in ids] + ["<eos>"]


def text_file_name(stem: str, text: str | None) -> str:
    """``stem.png`` for the default input; ``stem-<the text's first words>.png`` for a text the user gave, so that a
    picture of another text never overwrites the default one (``token_attention-hello-world.png``)."""
    if text is None:
        return f"{stem}.png"
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40].strip("-")
    return f"{stem}-{slug or hashlib.sha256(text.encode()).hexdigest()[:8]}.png"


def seq2seq_viz(run, out_dir: Path, *, index: int | None = None, layer: int | None = None,
                head: int | None = None, text: str | None = None, **_) -> list[Path]:
    """Write ``alignment.png`` (``alignment-<its first words>.png`` for ``text``): the cross-attention of a
    translation, per decoder layer and head.

    Args:
        run: a loaded translation :class:`~tokennet.run.Run` (Transformer or Bahdanau).
        out_dir: where the PNG goes.
        index: the test example to translate (default 0); ignored when ``text`` is given.
        layer, head: draw only this decoder layer / head.
        text: translate this source instead of a test example.
    """
    from ..decode import greedy_search, strip_special

    out_dir = Path(out_dir)
    model, tok = run.model, run.tokenizer
    config = model.config
    file_name = text_file_name("alignment", text)
    if text is None:
        if run.data is None:
            raise RunError(f"{run.path} has no run.json to draw test examples from; give a source text")
        pairs = run.data.held_out()
        index = 0 if index is None else index
        _select(len(pairs), index, "index")
        text, ref = pairs[index][0], pairs[index][1]
    else:
        text, ref = text.strip(), None
        if not text:
            raise DataError("the source text is empty; give a source sentence")
    ids = tok.encode(text)
    if len(ids) > config.max_source_len:
        raise DataError(f"the source is {len(ids)} tokens, longer than the model's maximum of {config.max_source_len}")
    dev = next(model.parameters()).device
    src = torch.tensor([ids], device=dev)
    out_ids = strip_special(greedy_search(model, src), config.eos_id, config.pad_id)[0]
    tgt_in, labels = _tokens_out(model, tok, out_ids)
    weights = alignments(model, src, tgt_in.to(dev))[:, 0]  # (L, H, T, S)
    layers = _select(weights.shape[0], layer, "layer")
    heads = _select(weights.shape[1], head, "head")
    weights = weights[layers][:, heads]
    output = tok.decode(out_ids)
    title = f"{text!r} → {output!r}" + ("" if ref is None else f"   (reference {ref!r})")
    source_labels = [tok.decode([i]) if i != tok.unk_id else "<unk>" for i in ids]
    return [plot_alignment(weights, source_labels, labels, out_dir / file_name, layers=layers, heads=heads,
                           title=title)]


def caption_viz(run, out_dir: Path, *, index: int | None = None, layer: int | None = None,
                head: int | None = None, image: str | Path | None = None, **_) -> list[Path]:
    """Write ``caption_attention.png``: each generated word's attention over the image patches.

    The map is averaged over heads and layers unless ``layer`` / ``head`` pick one.

    Args:
        run: a loaded captioning :class:`~tokennet.run.Run` (either form).
        out_dir: where the PNG goes.
        index: the held-out test image (default 0); ignored when ``image`` is given.
        layer, head: use only this layer / head.
        image: caption this image file instead (the model's size; see
            :func:`~tokennet.tasks.captioning.load_caption_images`).
    """
    from ..data.shapes import caption, images_of
    from ..decode import greedy_search, strip_special

    out_dir = Path(out_dir)
    model, tok = run.model, run.tokenizer
    config = model.config
    dev = next(model.parameters()).device
    if image is not None:
        ref, image = None, run.task.images(run, [image]).to(dev)
    else:
        if run.data is None:
            raise RunError(f"{run.path} has no run.json to draw the test images from; give an image file")
        scenes = run.data.held_out()
        index = 0 if index is None else index
        _select(len(scenes), index, "index")
        ref = caption(scenes[index])
        image = images_of([scenes[index]], config.image_size).to(dev)
    out_ids = strip_special(greedy_search(model, image), config.eos_id, config.pad_id)[0]
    tgt_in, words = _tokens_out(model, tok, out_ids)
    weights = alignments(model, image, tgt_in.to(dev))[:, 0]  # (L, H, T, P)
    layers = _select(weights.shape[0], layer, "layer")
    heads = _select(weights.shape[1], head, "head")
    word_maps = weights[layers][:, heads].mean(dim=(0, 1))  # (T, P)
    which = ("all layers" if layer is None else f"layer {layer}") + ", " + \
        ("mean of heads" if head is None else f"head {head}")
    got = tok.decode(out_ids)
    title = f"generated: {got!r}\n" + (f"reference: {ref!r}   ({which})" if ref is not None else f"({which})")
    return [plot_caption_attention(image[0], word_maps, [word.strip() for word in words], config.grid,
                                   out_dir / "caption_attention.png", title=title)]

