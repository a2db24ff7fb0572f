"""Which device to run on: one rule for the CLI, the recipes and the plots."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from .errors import ConfigError

__all__ = ["resolve_device", "cpu_flags", "native_bf16", "one_thread"]


def resolve_device(device: str) -> torch.device:
    """``"auto"`` → CUDA when present, else MPS when present, else CPU; anything else is checked."""
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ConfigError(f"unknown device {device!r}; use auto, cpu, cuda, cuda:N or mps") from None
    if dev.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"tokennet does not run on device {device!r}; use auto, cpu, cuda, cuda:N or mps")
    if dev.type == "cpu" and dev.index not in (None, 0):
        # torch accepts "cpu:7", but there is one CPU device: an index other than 0 is a typo, not a choice.
        raise ConfigError(f"device {device!r} does not exist: the CPU is one device, 'cpu' (or 'cpu:0')")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} requested but CUDA is not available; use device 'cpu' or 'auto'")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ConfigError(f"device {device!r} does not exist: this machine has {torch.cuda.device_count()} CUDA "
                          f"device(s), cuda:0..cuda:{torch.cuda.device_count() - 1}")
    if dev.type == "mps" and not (getattr(torch.backends, "mps", None) is not None
                                  and torch.backends.mps.is_available()):
        raise ConfigError(f"device {device!r} requested but MPS is not available; use device 'cpu' or 'auto'")
    return dev


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (``/proc/cpuinfo``'s ``flags`` line; empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AMX or AVX-512 BF16): where bf16 autocast speeds up
    convolutions and matmuls rather than emulating them."""
    return bool({"amx_bf16", "avx512_bf16"} & cpu_flags())


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Torch's intra-op threads set to one inside the ``with`` block, and back to what they were after (an
    exception too). For small models, small batches and token-by-token decoding on a CPU, which are
    latency-bound: extra threads only add synchronisation, and far more when other processes share the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)

