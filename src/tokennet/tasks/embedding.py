"""The text-embedding task: one L2-normalized vector per text (imported sentence encoders)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..errors import RunError
from ..viz.explore.text import TextEncoderExplorer
from . import Embedder
from .base import Task, register_task, verb

if TYPE_CHECKING:
    from ..run import Run

__all__ = ["TextEmbedding"]

logger = logging.getLogger(__name__)


@register_task
class TextEmbedding(Task):
    """A sentence encoder: ``run.embed(texts) → (B, D)`` unit vectors; cosine similarity is their dot product."""

    name = "text embedding"
    kind = "text-embedding"
    families = ("text-encoder",)
    viz_uses = ("text", "layer", "head")
    explorer = TextEncoderExplorer
    protocol = Embedder

    def draw(self, run: Run, out_dir: Path, **options) -> list[Path]:
        """``token_attention.png``: bidirectional self-attention over ``--text``."""
        from ..viz.language import text_encoder_viz

        return text_encoder_viz(run, out_dir, **options)

    @verb
    def embed(self, run: Run, texts, *, batch_size: int = 32, **kw) -> torch.Tensor:
        """Embed ``texts`` (a string or a list of strings). Texts longer than the model's context are
        truncated (keeping the final separator), and a warning says so."""
        tok, model = run.tokenizer, run.model
        if tok is None:
            raise RunError(f"{run.path} has no tokenizer.json: embedding text needs one")
        if isinstance(texts, str):
            texts = [texts]
        if not texts:
            raise RunError("give at least one text to embed")
        max_len = model.config.max_len
        rows = []
        for i, t in enumerate(texts):
            ids = tok.encode(t)
            if len(ids) > max_len:
                logger.warning("text %d is %d tokens, longer than the model's context of %d: truncated", i,
                               len(ids), max_len)
                ids = ids[: max_len - 1] + ids[-1:]  # keep [SEP]
            rows.append(ids)
        out = []
        with torch.no_grad():
            for start in range(0, len(rows), batch_size):
                chunk = rows[start:start + batch_size]
                n = max(len(row) for row in chunk)
                ids = torch.full((len(chunk), n), tok.pad_id, dtype=torch.long)  # (B, N), right-padded
                mask = torch.zeros(len(chunk), n, dtype=torch.bool)
                for j, row in enumerate(chunk):
                    ids[j, :len(row)] = torch.tensor(row)
                    mask[j, :len(row)] = True
                out.append(model.embed(ids.to(run.device), mask.to(run.device)).cpu())
        return torch.cat(out)
