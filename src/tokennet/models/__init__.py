"""Models by name. Importing this package registers every family (one module each)."""

from . import (
    ast,  # noqa: F401  (registers the family)
    bahdanau,  # noqa: F401  (registers the family)
    captioner,  # noqa: F401  (registers the families)
    cnn,  # noqa: F401  (registers the family)
    gpt,  # noqa: F401  (registers the family)
    graph,  # noqa: F401  (registers the family)
    seq2seq,  # noqa: F401  (registers the family)
    sphere,  # noqa: F401  (registers the family)
    swin,  # noqa: F401  (registers the family)
    text_encoder,  # noqa: F401  (registers the family)
    vit,  # noqa: F401  (registers the family)
    vqa,  # noqa: F401  (registers the families)
)
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
