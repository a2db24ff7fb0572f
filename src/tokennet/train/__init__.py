"""Training: the shared trainer, AdamW + schedule, crash-safe checkpoints, torchrun scale-out."""

from .checkpoint import Checkpoint, latest_checkpoint, read_checkpoint, save_checkpoint
from .distributed import DistInfo, init_distributed
from .optim import MuonAdamW, configure_optimizer, cosine_lr, wsd_lr
from .trainer import BatchSource, TrainConfig, Trainer, TrainingStopped

__all__ = [
    "Trainer",
    "TrainConfig",
    "TrainingStopped",
    "BatchSource",
    "configure_optimizer",
    "cosine_lr",
    "wsd_lr",
    "MuonAdamW",
    "save_checkpoint",
    "read_checkpoint",
    "latest_checkpoint",
    "Checkpoint",
    "DistInfo",
    "init_distributed",
]
