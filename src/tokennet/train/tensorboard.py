"""Optional TensorBoard event files next to ``log.jsonl`` (``--set tensorboard=true``).

``log.jsonl`` stays the source of truth (the report and every tool read it); the event files are a
copy of the same records for people who watch runs in TensorBoard. Without the ``tensorboard``
package the run goes on with one log line saying how to get it.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

__all__ = ["open_writer", "TensorBoardLog"]

log = logging.getLogger(__name__)


class TensorBoardLog:
    """Writes each numeric field of a log record as a scalar at the record's step.

    Training records (with ``loss``) go under ``train/``, evaluation records under ``eval/``.
    """

    def __init__(self, writer):
        self.writer = writer

    def write(self, record: dict[str, Any]) -> None:
        step = int(record.get("step", 0))
        group = "train" if "loss" in record else "eval"
        for k, v in record.items():
            if k == "step" or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                continue
            self.writer.add_scalar(f"{group}/{k}", v, step)
        self.writer.flush()  # records are rare (every log_interval steps): a watcher sees each one


def open_writer(log_dir: str | Path) -> TensorBoardLog | None:
    """A :class:`TensorBoardLog` into ``log_dir``, or None (and one warning) when tensorboard is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        log.warning("tensorboard=true: the tensorboard package is not installed (pip install tensorboard); "
                    "writing log.jsonl only")
        return None
    return TensorBoardLog(SummaryWriter(log_dir=str(log_dir)))
