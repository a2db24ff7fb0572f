"""State-dict checks shared by model loading (``models.registry``) and training checkpoints (``train``)."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["check_state_dict"]


def check_state_dict(expected: dict[str, Any], got: dict[str, torch.Tensor], where: str,
                     error: type[Exception] = ValueError) -> None:
    """Raise ``error`` naming the first missing/unexpected tensor or shape/dtype mismatch.

    Args:
        error: the exception class to raise; callers pass theirs (e.g. ``RunError`` for a damaged run
            directory), since this module imports nothing from tokennet.
    """
    missing = [k for k in expected if k not in got]
    if missing:
        raise error(f"{where} does not match the model: missing tensor {missing[0]!r}")
    unexpected = [k for k in got if k not in expected]
    if unexpected:
        raise error(f"{where} does not match the model: unexpected tensor {unexpected[0]!r}")
    for k, t in expected.items():
        if tuple(got[k].shape) != tuple(t.shape):
            raise error(
                f"{where}: tensor {k!r} has shape {tuple(got[k].shape)}, the model expects {tuple(t.shape)}"
            )
        if got[k].dtype != t.dtype:
            raise error(f"{where}: tensor {k!r} has dtype {got[k].dtype}, the model expects {t.dtype}")
