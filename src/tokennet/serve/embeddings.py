"""``POST /v1/embeddings``: a text-embedding run's vectors in the OpenAI format.

A sentence encoder (an imported MiniLM / BERT: :mod:`tokennet.tasks.embedding`) turns each text into one
L2-normalized vector, :math:`e = \\mathrm{mean}(h_{1..n}) / \\lVert\\mathrm{mean}(h_{1..n})\\rVert`, exactly as
``tokennet embed`` prints it (both call ``run.embed``). The request::

    {"model": "...", "input": "text" | ["text", ...], "encoding_format": "float" | "base64"}

``base64`` (what the ``openai`` Python client asks for by default) is the float32 little-endian bytes of each
vector. ``dimensions`` other than the model's width and token-id inputs are a 400 (the ids a client computes,
e.g. LangChain's tiktoken ids, are not this model's tokens).
"""

from __future__ import annotations

import base64
import threading
from typing import Any

import torch

from .protocol import APIError, check_model, usage

__all__ = ["Embedder", "parse_embeddings", "embeddings_body", "MAX_INPUTS"]

MAX_INPUTS = 2048  # texts in one request at most (OpenAI's limit)


class Embedder:
    """A text-embedding run served behind a lock (one batch at a time on the model)."""

    def __init__(self, run):
        self.run = run
        self.tokenizer = run.tokenizer
        self.dim = int(run.model.config.dim)
        self.context = int(run.model.config.max_len)
        self._lock = threading.Lock()

    def embed(self, texts: list[str]) -> tuple[torch.Tensor, int]:
        """``(B, D)`` unit vectors (``run.embed``) and the prompt tokens they took."""
        with self._lock, torch.inference_mode():
            vecs = self.run.embed(texts)
        tokens = sum(min(len(self.tokenizer.encode(t)), self.context) for t in texts)
        return vecs, tokens


def parse_embeddings(body: dict[str, Any], *, served: list[str], any_model: bool,
                     dim: int) -> tuple[list[str], str, str]:
    """The texts, the encoding format and the model name of an embeddings request (400s name the field)."""
    model = check_model(body.get("model"), served, any_model)
    x = body.get("input")
    if isinstance(x, str):
        x = [x]
    if isinstance(x, list) and x and all(isinstance(t, int) and not isinstance(t, bool) for t in x) or (
            isinstance(x, list) and x and all(isinstance(t, list) for t in x)):
        raise APIError(400, "input must be text: token ids are not accepted (a client's ids are not this model's "
                       "tokens; with LangChain set check_embedding_ctx_length=False)", param="input")
    if not isinstance(x, list) or not x or not all(isinstance(t, str) for t in x):
        raise APIError(400, "input must be a string or a non-empty list of strings", param="input")
    if len(x) > MAX_INPUTS:
        raise APIError(400, f"{len(x)} inputs in one request; at most {MAX_INPUTS}", param="input")
    if any(not t for t in x):
        raise APIError(400, "input must not contain empty strings", param="input")
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise APIError(400, f"encoding_format must be 'float' or 'base64', got {fmt!r}", param="encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and dimensions != dim:
        raise APIError(400, f"dimensions must be this model's {dim} (vectors are not shortened), got {dimensions!r}",
                       param="dimensions")
    return x, fmt, model


def embeddings_body(vecs: torch.Tensor, fmt: str, model: str, tokens: int) -> dict[str, Any]:
    """OpenAI's ``{"object": "list", "data": [{"object": "embedding", "index", "embedding"}], ...}``."""
    data = []
    for i, v in enumerate(vecs.float().cpu()):
        if fmt == "base64":
            embedding: Any = base64.b64encode(v.numpy().astype("<f4").tobytes()).decode("ascii")
        else:
            embedding = v.tolist()
        data.append({"object": "embedding", "index": i, "embedding": embedding})
    use = usage(tokens, 0)
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": use["prompt_tokens"], "total_tokens": use["total_tokens"]}}
