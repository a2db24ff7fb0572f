"""Training: the shared trainer, AdamW + schedule, crash-safe checkpoints."""

from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from .optim import configure_optimizer, cosine_lr
from .trainer import BatchSource, TrainConfig, Trainer, TrainingStopped, resolve_device

__all__ = [
    "Trainer",
    "TrainConfig",
    "TrainingStopped",
    "BatchSource",
    "resolve_device",
    "configure_optimizer",
    "cosine_lr",
    "save_checkpoint",
    "load_checkpoint",
    "latest_checkpoint",
]
