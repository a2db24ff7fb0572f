"""The peak memory that torch's allocator hands out while a function runs (the CPU has no allocator statistics).

On the CPU torch keeps no ``max_memory_allocated``; its profiler, with ``profile_memory=True``, records every
allocation and free of the CPU allocator with its size. :func:`peak_allocated` runs ``fn`` under it and returns
the highest running sum: the most bytes held at once by tensors allocated during ``fn``, above what was held
when it started (tensors that existed before it count only once freed, as a negative). Unlike the resident
set, it does not depend on what the C allocator keeps mapped, so it is the same in every run; it also leaves out
what is not a tensor (Python objects, the interpreter). On CUDA it is ``torch.cuda.max_memory_allocated`` above
the bytes allocated at the start.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["peak_allocated"]


def peak_allocated(fn: Callable[[], Any], device: torch.device | str = "cpu") -> tuple[Any, int]:
    """``(fn(), peak bytes)``: the most bytes of tensors allocated during ``fn`` and alive at one time."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        out = fn()
        torch.cuda.synchronize(device)
        return out, torch.cuda.max_memory_allocated(device) - start
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    events = sorted(((event.start_ns(), event.nbytes()) for event in prof.profiler.kineto_results.events()
                     if event.name() == "[memory]" and event.device_type() == torch.autograd.DeviceType.CPU))
    held = peak = 0
    for _, n in events:
        held += n
        peak = max(peak, held)
    return out, peak
