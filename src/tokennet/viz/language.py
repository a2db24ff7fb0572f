"""``tokennet viz`` for language models: token-to-token attention over a text, per layer and head.

The lecture's first attention picture: row ``i`` is how much token ``i`` takes from each earlier token
(``A = softmax(Q Kᵀ / √E)`` under the causal mask, so the upper triangle is empty). The weights come
from ``model.attention_maps`` (the plain formula), so runs trained with a fused backend work.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import DataError
from .alignment import plot_alignment, text_file_name
from .attention_maps import select as _select

__all__ = ["language_viz", "text_encoder_viz", "DEFAULT_TEXT"]

DEFAULT_TEXT = "The attention of each token looks back at the tokens before it."
MAX_TOKENS = 48  # beyond this the labels are unreadable


def language_viz(run, out_dir: Path, *, text: str | None = None, layer: int | None = None,
                 head: int | None = None, **_) -> list[Path]:
    """Write ``token_attention.png``: causal self-attention over :data:`DEFAULT_TEXT`, or over ``text`` as
    ``token_attention-<its first words>.png`` (so the default picture is not overwritten).

    Args:
        run: a loaded language-model :class:`~tokennet.run.Run`.
        out_dir: where the PNG goes.
        text: the text to read (at most 48 tokens and the model's context are drawn).
        layer, head: draw only this layer / head (default: all, with the mean of heads).
    """
    return _token_attention(run, out_dir, text=text, layer=layer, head=head, context=run.model.config.block_size,
                            kind="causal self-attention")


def text_encoder_viz(run, out_dir: Path, *, text: str | None = None, layer: int | None = None,
                     head: int | None = None, **_) -> list[Path]:
    """Write ``token_attention.png`` for a text encoder (e.g. an imported BERT / MiniLM): bidirectional
    self-attention over ``text`` (with the encoder's own ``[CLS]`` … ``[SEP]``), every token attending
    to every other; arguments as in :func:`language_viz`."""
    return _token_attention(run, out_dir, text=text, layer=layer, head=head, context=run.model.config.max_len,
                            kind="bidirectional self-attention")


def _token_attention(run, out_dir: Path, *, text, layer, head, context: int, kind: str) -> list[Path]:
    model, tok = run.model, run.tokenizer
    if tok is None:
        raise DataError(f"{run.path} has no tokenizer.json: drawing attention over text needs one")
    file_name = text_file_name("token_attention", text)
    text = DEFAULT_TEXT if text is None else text
    if not text.strip():
        raise DataError("the text is empty; give a sentence to draw")
    ids = tok.encode(text)[: min(MAX_TOKENS, context)]
    idx = torch.tensor([ids], device=next(model.parameters()).device)
    maps = run.attention_maps(idx)["self"]  # per layer (1, H, T, T)
    weights = torch.stack([m[0].float().cpu() for m in maps])  # (L, H, T, T)
    layers = _select(weights.shape[0], layer, "layer")
    heads = _select(weights.shape[1], head, "head")
    labels = [tok.decode([i], skip_special=False) for i in ids]
    shown = tok.decode(ids)
    title = f"{kind} over {shown!r}" + ("" if len(ids) == len(tok.encode(text)) else " (cut)")
    return [plot_alignment(weights[layers][:, heads], labels, labels, Path(out_dir) / file_name,
                           layers=layers, heads=heads, title=title)]

