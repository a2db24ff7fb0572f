"""llama.cpp's greedy decoding as the benches time it (shared by bench/interop.py and bench/int8_kernels.py)."""

from __future__ import annotations

import time

import numpy as np


def greedy(llm, prompt: list[int], steps: int) -> tuple[list[int], list[float]]:
    """Greedy tokens of a ``llama_cpp.Llama`` after ``prompt`` and the time after each: ``(tokens, stamps)``."""
    vocab = llm.n_vocab()

    def argmax() -> int:
        return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))))

    llm.reset()
    llm.eval(prompt)
    out, stamps = [argmax()], [time.perf_counter()]
    for _ in range(steps - 1):
        llm.eval([out[-1]])
        out.append(argmax())
        stamps.append(time.perf_counter())
    return out, stamps
