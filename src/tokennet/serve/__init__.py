"""``tokennet serve``: an OpenAI-compatible HTTP server for a language-model run, with continuous batching.

- :mod:`.engine`: the decoding loop that batches every running request into one forward per step;
- :mod:`.cache`: the shared KV cache of sequences at different lengths;
- :mod:`.protocol`: the OpenAI request fields, checked, and the response bodies;
- :mod:`.app`: the ASGI application (Starlette) and :func:`serve` (uvicorn).
"""

from .engine import Engine, SamplingParams, Sequence

__all__ = ["Engine", "SamplingParams", "Sequence"]
