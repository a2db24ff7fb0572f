"""The report panels of conditional decoders: translation and captioning.

A table of held-out inputs, references and the model's outputs, where a miss is highlighted (the row,
and the characters or words of the output that differ from the reference), and the cross-attention
picture of ``tokennet viz`` (an alignment, or each caption word's attention over the image).
"""

from __future__ import annotations

import difflib
import io

import torch

from .html import Section, esc, img, inline_img, number, table

__all__ = ["translation_panel", "captioning_panel", "mark_differences"]

ROWS = 12


def mark_differences(output: list[str], reference: list[str], sep: str = "") -> str:
    """The output as HTML, with the pieces that are not in the reference (in order) inside ``<mark>``."""
    matcher = difflib.SequenceMatcher(a=output, b=reference, autojunk=False)
    keep = [False] * len(output)
    for block in matcher.get_matching_blocks():
        for i in range(block.a, block.a + block.size):
            keep[i] = True
    parts = [esc(piece) if kept else f'<mark class="diff">{esc(piece)}</mark>'
             for piece, kept in zip(output, keep, strict=True)]
    return sep.join(parts) if output else "<em>(empty)</em>"


def _summary(run, misses: int, n: int, keys: tuple[str, ...]) -> str:
    shown = " · ".join(f"{k} {number(run.metrics[k], k)}" for k in keys if k in run.metrics)
    return (f'<p class="sub">{shown + " (metrics.json) · " if shown else ""}{n - misses} of the first {n} held-out '
            "examples right; differences from the reference are marked in the output.</p>")


def translation_panel(run, log) -> list[Section]:  # noqa: ARG001
    from . import viz_pictures

    pairs = run.data.held_out()[:ROWS]
    sources, refs = [pair[0] for pair in pairs], [pair[1] for pair in pairs]
    outs = [run.translate(src) for src in sources]
    rows, classes, misses = [], [], 0
    for i, (src, ref, out) in enumerate(zip(sources, refs, outs, strict=True)):
        misses += out != ref
        rows.append([str(i), f"<code>{esc(src)}</code>", f"<code>{esc(ref)}</code>",
                     f"<code>{mark_differences(list(out), list(ref))}</code>"])
        classes.append("hit" if out == ref else "miss")
    body = _summary(run, misses, len(rows), ("exact_match", "bleu", "chrf")) \
        + table(["#", "input", "reference", "output"], rows, classes, col_classes={-1: "out"})
    index = next((i for i, (output, expected) in enumerate(zip(outs, refs, strict=True)) if output != expected), 0)
    layer = run.model.config.num_layers - 1 if hasattr(run.model.config, "num_layers") else None
    pics = "".join(img(png, name, f"cross-attention of example #{index} (tokennet viz --index {index})",
                       cls="wide") for name, png in viz_pictures(run, index=index, layer=layer))
    return [("Translations", body), ("Alignment", pics)]


def _png_of_image(x: torch.Tensor, scale: int = 2) -> bytes:
    """A ``(3, H, W)`` image in [0, 1] as PNG bytes, enlarged ``scale`` times (nearest neighbour)."""
    from PIL import Image

    pixels = (x.clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()  # (H, W, 3)
    picture = Image.fromarray(pixels).resize((pixels.shape[1] * scale, pixels.shape[0] * scale), Image.NEAREST)
    buf = io.BytesIO()
    picture.save(buf, format="PNG")
    return buf.getvalue()


def captioning_panel(run, log) -> list[Section]:  # noqa: ARG001
    from ...data.shapes import caption, images_of
    from . import viz_pictures

    scenes = run.data.held_out()[:ROWS]
    images = images_of(scenes, run.model.config.image_size)  # (B, 3, H, W)
    outs = run.caption(images)
    refs = [caption(scene) for scene in scenes]
    rows, classes, misses = [], [], 0
    for i, (x, ref, out) in enumerate(zip(images, refs, outs, strict=True)):
        misses += out != ref
        rows.append([str(i), inline_img(_png_of_image(x), f"held-out image #{i}"), esc(ref),
                     mark_differences(out.split(), ref.split(), " ")])
        classes.append("hit" if out == ref else "miss")
    html = table(["#", "image", "reference", "output"], rows, classes, col_classes={-1: "out"})
    index = next((i for i, (output, expected) in enumerate(zip(outs, refs, strict=True)) if output != expected), 0)
    pics = "".join(img(png, name, f"each word's attention over held-out image #{index} "
                       f"(tokennet viz --index {index})", cls="wide") for name, png in viz_pictures(run, index=index))
    return [("Captions", _summary(run, misses, len(rows), ("exact_match",)) + html), ("Caption attention", pics)]

