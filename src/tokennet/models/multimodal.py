"""One transformer for every modality: one stack of blocks shared by the single-task models of several tasks.

The lecture's claim, as a model: only the domain step differs between modalities —

    T⁰_t = tokens_t(x) + P_t               per task t: its own tokenizer and positions (the single-task model's)
    Tᴸ   = blocks(T⁰_t; M_t)                ONE stack of blocks, one set of weights; the mask M_t causal for text,
                                            full (or the graph's / the sphere's bias) elsewhere
    y    = head_t(Tᴸ)                       per task (tasks in ``shared_head`` share one head module)

Each part is the task's own family (``gpt``, ``vit``, ``ast``, ``sphere``, ``graph``), built from its config with
the trunk's shape; its stack of blocks is then replaced by the shared one (:class:`SharedStack` for the
bidirectional families, the :class:`~tokennet.layers.stack.Decoder` itself for the language model, which calls it
with ``is_causal=True`` and its KV caches). Every part stays a complete model of its family, so its task's verbs,
pictures and metrics apply to it unchanged; the shared modules are registered under every part that uses them and
saved once (safetensors' tied tensors).

``forward((task, x), targets)`` runs one task's batch: ``Output(logits of that task, weights[task] · loss)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from ..errors import ConfigError
from ..layers.stack import AttentionMaps, Decoder
from .registry import (
    CountsParameters,
    Output,
    TransformerConfig,
    config_from_dict,
    model_from_config,
    register_family,
    register_preset,
)

__all__ = ["MultimodalConfig", "MultimodalModel", "SharedStack", "TRUNK_FIELDS", "CAUSAL_FAMILIES"]

TRUNK_FIELDS = ("dim", "num_layers", "num_heads", "mlp_ratio", "dropout", "backend", "value_proj")
CAUSAL_FAMILIES = ("gpt",)  # parts whose stack is called causally (the language model's Decoder call)
STACK_ATTR = {"gpt": "decoder"}  # where a family keeps its stack of blocks (the others: ``encoder``)
HEAD_ATTR = "head"  # a classifier part's head (vit/ast: norm + linear; sphere: linear on the mean)

# The parts of the default preset: each task's single-task preset shape, with the trunk's width and depth.
DEFAULT_PARTS: dict[str, dict[str, Any]] = {
    "text": {"family": "gpt", "vocab_size": 65, "block_size": 64},
    "image": {"family": "vit", "image_size": 8, "patch_size": 4, "patch_stride": 2, "in_channels": 1,
              "num_classes": 10, "pool": "mean"},
    "sphere": {"family": "sphere", "num_centres": 48, "num_samples": 256, "patch_size": 8, "rings": 2,
               "sh_degree": 3, "num_classes": 10, "position": "frame", "descriptor": "zonal-frame"},
    "graph": {"family": "graph", "node_features": 2, "num_outputs": 6, "position": "spectral-kernel", "pe_dim": 8},
}


@dataclass
class MultimodalConfig(TransformerConfig, defaults=dict(dim=64, num_layers=2, num_heads=4, mlp_ratio=2.0)):
    """Config of :class:`MultimodalModel`.

    Args:
        dim, num_layers, num_heads, mlp_ratio, dropout, backend, value_proj: the one trunk (each part's own value
            of these fields is replaced by the trunk's).
        parts: task name → that task's model config as a dict (``family`` and its fields).
        shared_head: the classifier tasks whose heads are one module (same number of classes): "which digit is
            this?" whether drawn, spoken or projected onto a sphere.
        weights: task name → the weight of its loss (default 1).
    """

    parts: dict = field(default_factory=lambda: {k: dict(v) for k, v in DEFAULT_PARTS.items()})
    shared_head: list = field(default_factory=lambda: ["image", "sphere"])
    weights: dict = field(default_factory=dict)

    def __post_init__(self):
        self.family = "multimodal"
        self._check_transformer()
        if not isinstance(self.parts, dict) or not self.parts:
            raise ConfigError("parts must name at least one task and its model config")
        for name, part in self.parts.items():
            if not isinstance(part, dict) or "family" not in part:
                raise ConfigError(f"parts[{name!r}] must be a model config dict with a 'family'")
            if part["family"] == "multimodal":
                raise ConfigError(f"parts[{name!r}] cannot itself be a multimodal model")
        unknown = sorted(set(self.shared_head) - set(self.parts))
        if unknown:
            raise ConfigError(f"shared_head names tasks without a part: {unknown}; parts: {sorted(self.parts)}")
        for name, weight in self.weights.items():
            if name not in self.parts:
                raise ConfigError(f"weights names {name!r}, which has no part; parts: {sorted(self.parts)}")
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
                raise ConfigError(f"the loss weight of {name!r} must be a positive number, got {weight!r}")

    def part_config(self, name: str):
        """The config of part ``name``: its own fields, with the trunk's shape."""
        trunk = {k: getattr(self, k) for k in TRUNK_FIELDS}
        return config_from_dict({**self.parts[name], **trunk})  # (every part is a TransformerConfig: it has them all)


class SharedStack(nn.Module):
    """The shared :class:`~tokennet.layers.stack.Decoder` called as an encoder (every token may attend to every
    unmasked token): what a bidirectional family's ``self.encoder(x, mask=, bias=, rope=, return_weights=)`` call
    expects."""

    def __init__(self, stack: Decoder):
        super().__init__()
        self.stack = stack

    def layers(self):
        return self.stack.layers()

    def forward(self, x: Tensor, *, mask=None, rope=None, bias=None, return_weights: bool = False):
        if isinstance(bias, (list, tuple)):
            raise ValueError("the shared trunk takes one attention bias for every layer")
        return self.stack(x, mask=mask, is_causal=False, rope=rope, bias=bias, return_weights=return_weights)


class MultimodalModel(CountsParameters, nn.Module):
    """Per task its own tokens, positions, mask and head; one trunk (see the module docstring)."""

    def __init__(self, config: MultimodalConfig):
        super().__init__()
        self.config = cfg = config
        self.trunk = Decoder(cfg.dim, cfg.num_layers, cfg.num_heads, mlp_ratio=cfg.mlp_ratio, norm="pre",
                             dropout=cfg.dropout, backend=cfg.backend, value_proj=cfg.value_proj)
        self.parts = nn.ModuleDict({name: model_from_config(cfg.part_config(name)) for name in cfg.parts})
        bidirectional = SharedStack(self.trunk)
        for name, part in self.parts.items():
            family = part.config.family
            attr = STACK_ATTR.get(family, "encoder")
            if not isinstance(getattr(part, attr, None), nn.Module):
                raise ConfigError(f"part {name!r} ({family}) has no stack of blocks at .{attr} to share")
            setattr(part, attr, self.trunk if family in CAUSAL_FAMILIES else bidirectional)
        if cfg.shared_head:
            head = getattr(self.parts[cfg.shared_head[0]], HEAD_ATTR)
            for name in cfg.shared_head[1:]:
                self._share_head(name, head)

    def _share_head(self, name: str, head: nn.Module) -> None:
        part = self.parts[name]
        mine = getattr(part, HEAD_ATTR, None)
        out = [m.out_features for m in head.modules() if isinstance(m, nn.Linear)][-1:]
        have = [m.out_features for m in mine.modules() if isinstance(m, nn.Linear)][-1:] if mine is not None else []
        if not out or out != have:
            raise ConfigError(f"shared_head: part {name!r} has {have or 'no'} classes, the shared head {out}")
        setattr(part, HEAD_ATTR, head)

    @property
    def tasks(self) -> list[str]:
        return list(self.parts)

    def part(self, name: str) -> nn.Module:
        """The single-task model of ``name`` (its trunk the shared one)."""
        if name not in self.parts:
            raise ValueError(f"this model was trained on {', '.join(self.parts)}; it has no {name!r} part")
        return self.parts[name]

    @staticmethod
    def _unpack(inputs) -> tuple[str, Any]:
        if not (isinstance(inputs, (tuple, list)) and len(inputs) == 2 and isinstance(inputs[0], str)):
            raise ValueError("a multimodal model takes (task name, that task's input)")
        return inputs[0], inputs[1]

    def forward(self, inputs, targets=None) -> Output:
        """``inputs = (task, x)``: that part's logits, and its loss times the task's weight."""
        name, x = self._unpack(inputs)
        out = self.part(name)(x, targets)
        loss = None if out.loss is None else out.loss * float(self.config.weights.get(name, 1.0))
        return Output(out.logits, loss)

    def attention_maps(self, inputs) -> AttentionMaps:
        name, x = self._unpack(inputs)
        return self.part(name).attention_maps(x)

    def example_input(self, batch_size: int = 2):
        name = self.tasks[0]
        return (name, self.parts[name].example_input(batch_size))

    def example_targets(self, batch_size: int = 2):
        return self.parts[self.tasks[0]].example_targets(batch_size)


register_family("multimodal", MultimodalConfig, MultimodalModel)
register_preset("multimodal", "multimodal", "one trunk, several modalities: each part its single-task model's "
                "tokens, positions, mask and head (default: text, digits images, digits on the sphere, graphs)")
