"""Models by name. Every module of this package is imported, and each family's module registers itself
(``register_family``, ``register_preset``), so a new family edits nothing else."""

import importlib as _importlib
import pkgutil as _pkgutil

from .registry import (
    ModelConfig,
    Output,
    create_model,
    list_families,
    list_models,
    load_pretrained,
    model_from_config,
    save_pretrained,
)

__all__ = [
    "ModelConfig",
    "Output",
    "create_model",
    "list_models",
    "list_families",
    "model_from_config",
    "save_pretrained",
    "load_pretrained",
]

for _m in _pkgutil.iter_modules(__path__):
    if not _m.name.startswith("_"):
        _importlib.import_module(f"{__name__}.{_m.name}")
