"""Models by name: config dataclasses, a registry of families and presets, save and load.

As in timm, every model is built by name (``create_model("gpt-mini", num_layers=4)``) and the tests
loop over the registry, so a model is tested the day it is registered. As in litgpt, configs are
plain data that serialize to JSON; unlike litgpt, each family has its own small config class.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .. import jsonio
from ..errors import ConfigError, RunError, unknown_name
from ..fileio import atomic_write_text, safetensors_write, sha256_file, temp_name_beside
from ..layers.blockquant import unwritten_blocks
from ..state import check_state_dict

__all__ = [
    "CountsParameters",
    "parameter_count",
    "ModelConfig",
    "TransformerConfig",
    "Output",
    "register_family",
    "register_preset",
    "create_model",
    "list_models",
    "list_families",
    "config_from_dict",
    "model_from_config",
    "save_pretrained",
    "load_pretrained",
    "preset_info",
]

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


@dataclass
class Output:
    """What every model's ``forward(inputs, targets=None)`` returns."""

    logits: Tensor
    loss: Tensor | None = None


class CountsParameters:
    """Mixin of the families' models: ``num_parameters()``, the count that run summaries and reports print."""

    def num_parameters(self) -> int:
        return sum(param.numel() for param in self.parameters())


def parameter_count(model: nn.Module) -> int:
    """The parameters ``model`` represents: its ``num_parameters()`` where it has one (a GPT counts each weight
    held in blocks, e.g. a GGUF's Q4 matrices kept on import, as the elements it stands for), else every
    ``nn.Parameter``'s elements. What import, training summaries and reports print and record."""
    count = getattr(model, "num_parameters", None)
    return int(count()) if callable(count) else sum(param.numel() for param in model.parameters())


@dataclass
class ModelConfig:
    """Base of every family's config: plain JSON-serializable fields, validated in ``__post_init__``."""

    family: str = dataclasses.field(default="", init=False)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]):
        names = {dc_field.name for dc_field in dataclasses.fields(cls) if dc_field.init}
        unknown = sorted(set(d) - names - {"family"})
        if unknown:
            raise ConfigError(f"unknown {cls.__name__} field(s) {unknown}; valid fields: {sorted(names)}")
        return cls(**{k: v for k, v in d.items() if k in names})

    def replace(self, **changes):
        return self.from_dict({**self.to_dict(), **changes})

    @staticmethod
    def _positive(**values) -> None:
        for k, v in values.items():
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise ConfigError(f"{k} must be a positive integer, got {v!r}")

    @staticmethod
    def _choice(name: str, value, choices) -> None:
        if value not in choices:
            raise ConfigError(f"{name} must be one of {list(choices)}, got {value!r}")

    @staticmethod
    def _fraction(**values) -> None:
        """Probabilities such as dropout: each in ``[0, 1)``."""
        for k, v in values.items():
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0 <= v < 1:
                raise ConfigError(f"{k} must be in [0, 1), got {v!r}")

    def _mlp_and_backend(self) -> None:
        """The fields every transformer family shares: ``mlp_ratio`` (with ``dim``) and ``backend``."""
        from ..attention.functional import BACKENDS

        ratio = self.mlp_ratio
        if (isinstance(ratio, bool) or not isinstance(ratio, numbers.Real)
                or not (ratio > 0 and round(ratio * self.dim) >= 1)):
            raise ConfigError(f"mlp_ratio must be positive (the MLP needs mlp_ratio·dim >= 1 units), got {ratio!r}")
        self._choice("backend", self.backend, BACKENDS)


@dataclass
class TransformerConfig(ModelConfig):
    """The fields every transformer family shares, declared once (a family adds its own after them).

    Args:
        dim: width ``D`` of every token vector.
        num_layers: depth ``L``, the number of blocks.
        num_heads: attention heads ``H``, each of width ``D / H``.
        mlp_ratio: the MLP's hidden width as a multiple of ``D``.
        dropout: dropout probability (on tokens, attention weights and residual branches, as the family says).
        backend: attention backend (``"auto"``, ``"sdpa"``, ``"math"``, ``"flash"``).
        value_proj: learn the self-attention's value map ``W_v`` (default). ``False`` takes ``W_v = I``, ``V = X``
            (the lecture: *"W_v may be the identity"*): each head mixes the input tokens' own slice, and the
            output projection ``W_o`` is the only map after the mixing. Needs every head its own keys and values
            (``num_kv_heads`` = ``num_heads``) and ``mixer="attention"``.

    A family gives them its own defaults in its class statement, and declares nothing else about them::

        @dataclass
        class GPTConfig(TransformerConfig, defaults=dict(dim=384, num_layers=6, num_heads=6)):
            vocab_size: int = 256
            ...

    :meth:`_check_transformer` validates them (the family's ``__post_init__`` calls it).
    """

    dim: int = 128
    num_layers: int = 2
    num_heads: int = 4
    mlp_ratio: float = 4.0
    dropout: float = 0.0
    backend: str = "auto"
    value_proj: bool = True

    def __init_subclass__(cls, defaults: dict[str, Any] | None = None, **kw):
        # Runs when the class statement ends, before @dataclass reads it: a shared field given a new default
        # is re-declared on the subclass (dataclasses keep an overridden field in its first position).
        super().__init_subclass__(**kw)
        if not defaults:
            return
        shared = {dc_field.name: dc_field.type for dc_field in dataclasses.fields(TransformerConfig) if dc_field.init}
        unknown = sorted(set(defaults) - set(shared))
        if unknown:
            raise TypeError(f"{cls.__name__}: defaults for {unknown}, which are not shared transformer fields "
                            f"{sorted(shared)}; declare them in the class body")
        annotations = dict(cls.__dict__.get("__annotations__", {}))
        for name, value in defaults.items():
            annotations.setdefault(name, shared[name])
            setattr(cls, name, value)
        cls.__annotations__ = annotations

    def _check_transformer(self) -> None:
        """Positive width, depth and heads, heads dividing the width, dropout in ``[0, 1)``, the MLP's ratio and
        the backend."""
        self._positive(dim=self.dim, num_layers=self.num_layers, num_heads=self.num_heads)
        if self.dim % self.num_heads:
            raise ConfigError(f"num_heads={self.num_heads} must divide dim={self.dim}")
        self._fraction(dropout=self.dropout)
        self._mlp_and_backend()

    def _mlp_and_backend(self) -> None:
        """The MLP's ratio and the backend (:meth:`ModelConfig._mlp_and_backend`), and ``value_proj``."""
        super()._mlp_and_backend()
        if not isinstance(self.value_proj, bool):
            raise ConfigError(f"value_proj must be true or false, got {self.value_proj!r}")
        if self.value_proj:
            return
        if getattr(self, "mixer", "attention") != "attention":
            raise ConfigError("value_proj=false (W_v = I) needs mixer='attention' (the token mixer has no W_v)")
        kv_heads = getattr(self, "num_kv_heads", None)
        if kv_heads not in (None, self.num_heads):
            raise ConfigError(f"value_proj=false (W_v = I) needs num_kv_heads=num_heads={self.num_heads} (the values "
                              f"are the tokens themselves, one slice per head), got num_kv_heads={kv_heads}")

    def _position_mode(self, multiple: int = 1) -> None:
        """A family with ``position_mode`` / ``pos_dim`` fields (the encoders that take added positions): the mode
        in :data:`~tokennet.position.concat.POSITION_MODES`, ``pos_dim`` given exactly with ``"concat"``, in
        ``[1, dim)`` and a multiple of ``multiple`` (Fourier positions: 4)."""
        from ..position.concat import POSITION_MODES

        self._choice("position_mode", self.position_mode, POSITION_MODES)
        if self.position_mode == "add":
            if self.pos_dim is not None:
                raise ConfigError(f"pos_dim={self.pos_dim} is for position_mode='concat'; leave it unset with 'add' "
                                  "(added positions take all of dim)")
            return
        if self.pos_dim is None:
            raise ConfigError(f"position_mode='concat' needs pos_dim, the positions' share of dim={self.dim} "
                              f"(e.g. pos_dim={self.dim // 4})")
        pos_dim = self.pos_dim
        if (isinstance(pos_dim, bool) or not isinstance(pos_dim, numbers.Integral) or not 1 <= pos_dim < self.dim
                or pos_dim % multiple):
            rule = f" and a multiple of {multiple}" if multiple > 1 else ""
            raise ConfigError(f"pos_dim must be an integer in [1, dim={self.dim}){rule} (the tokens keep "
                              f"dim - pos_dim), got {pos_dim!r}")

_FAMILIES: dict[str, tuple[type[ModelConfig], type[nn.Module]]] = {}
_PRESETS: dict[str, tuple[str, dict[str, Any], str]] = {}


def register_family(family: str, config_cls: type[ModelConfig], model_cls: type[nn.Module]) -> None:
    """Register a model family: its config dataclass and its module class."""
    _FAMILIES[family] = (config_cls, model_cls)


def register_preset(name: str, family: str, description: str = "", **defaults) -> None:
    """Register a named preset: a family plus default config values."""
    if family not in _FAMILIES:
        raise ValueError(f"unknown family {family!r}; register it first")
    _PRESETS[name] = (family, defaults, description)


def list_models() -> list[str]:
    """The names accepted by :func:`create_model`."""
    return sorted(_PRESETS)


def list_families() -> list[str]:
    return sorted(_FAMILIES)


def preset_info(name: str) -> tuple[str, dict[str, Any], str]:
    """``(family, defaults, description)`` of a preset."""
    if name not in _PRESETS:
        raise ConfigError(unknown_name("model", name, list_models(), listed=0, where="`tokennet list` shows them"))
    return _PRESETS[name]


def config_from_dict(d: dict[str, Any]) -> ModelConfig:
    """Rebuild a config from its JSON form (which names its family)."""
    family = d.get("family")
    if family not in _FAMILIES:
        raise ConfigError(f"config names unknown model family {family!r}; known: {', '.join(list_families())}")
    cfg_cls = _FAMILIES[family][0]
    return cfg_cls.from_dict({k: v for k, v in d.items() if k != "family"})


def model_from_config(config: ModelConfig | dict[str, Any]) -> nn.Module:
    """Build a model from a config object or its dict form."""
    if isinstance(config, dict):
        config = config_from_dict(config)
    model = _FAMILIES[config.family][1](config)
    if getattr(config, "value_proj", True) is False and not any(
            getattr(m, "value_proj", True) is False for m in model.modules()):
        # A family that does not pass the option down to its attention would silently keep W_v: refuse.
        raise ConfigError(f"the {config.family} family does not take value_proj=false yet; leave it true")
    return model


def create_model(name: str, **overrides) -> nn.Module:
    """Build a registered model: ``create_model("gpt", vocab_size=65, num_layers=4)``.

    Args:
        name: a preset from :func:`list_models`.
        **overrides: config fields replacing the preset's defaults.
    """
    family, defaults, _ = preset_info(name)
    cfg_cls = _FAMILIES[family][0]
    return model_from_config(cfg_cls.from_dict({**defaults, **overrides}))


def load_state_assigned(model: nn.Module, state: dict[str, torch.Tensor], *, strict: bool = True):
    """``model.load_state_dict(state, assign=True)``: the tensors of ``state`` become the model's (no copy into
    buffers allocated for them — a model holding a file's blocks takes them at the file's size), with the model's
    tied tensors (one tensor under two names, e.g. a tied embedding and LM head) tied again to the one loaded."""
    groups: dict[int, list[str]] = {}
    mine = model.state_dict(keep_vars=True)
    for k, t in mine.items():
        groups.setdefault(id(t), []).append(k)
    state = {k: v.to(mine[k].dtype) if k in mine and v.dtype != mine[k].dtype else v for k, v in state.items()}
    result = model.load_state_dict(state, strict=strict, assign=True)
    for names in groups.values():
        if len(names) < 2:
            continue
        src = next((k for k in names if k in state), names[0])
        mod_name, _, attr = src.rpartition(".")
        owner = model.get_submodule(mod_name)
        value = owner._parameters[attr] if attr in owner._parameters else owner._buffers[attr]
        for k in names:
            if k != src:
                m, _, tied_attr = k.rpartition(".")
                sub = model.get_submodule(m)
                (sub._parameters if tied_attr in sub._parameters else sub._buffers)[tied_attr] = value
    return result


def save_pretrained(model: nn.Module, directory: str | Path, *, extra: dict[str, Any] | None = None) -> Path:
    """Save a model as a directory: ``config.json`` and ``model.safetensors`` (never pickle).

    Files are written to temporary names and renamed, so a crash never leaves half a model. The
    weights' SHA-256 goes into ``config.json``, so a tampered or truncated file is caught on load.
    """
    from safetensors.torch import save_model

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tmp_w = temp_name_beside(directory / WEIGHTS_FILE, "tmp")  # a killed writer's is swept by the next save
    try:
        with safetensors_write(tmp_w):
            save_model(model, str(tmp_w))
        meta = {**(extra or {}), "weights_sha256": sha256_file(tmp_w)}
    except BaseException:
        tmp_w.unlink(missing_ok=True)
        raise
    tmp_w.replace(directory / WEIGHTS_FILE)
    cfg = {**model.config.to_dict(), "tokennet": meta}
    atomic_write_text(directory / CONFIG_FILE, json.dumps(cfg, indent=2) + "\n")
    return directory


def read_config(directory: str | Path) -> dict[str, Any]:
    """The ``config.json`` of a saved model, with a clear error when it is not one."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise RunError(f"{directory} is not a saved tokennet model: {CONFIG_FILE} is missing")
    try:
        data = jsonio.load(path)
    except jsonio.JSONTooDeep as err:  # its message names the file
        raise RunError(str(err)) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise RunError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(data, dict) or "family" not in data:
        raise RunError(f"{path} is not a tokennet model config (no 'family' field)")
    return data


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")


def load_pretrained(directory: str | Path, *, map_location: str | torch.device = "cpu",
                    allow_pickle: bool = False) -> nn.Module:
    """Load a model saved by :func:`save_pretrained`; the weights must match the config exactly.

    Weights load only from safetensors, which cannot run code. A pickle-based file (``.bin``, ``.pt``)
    is refused unless ``allow_pickle=True``, and even then read with ``torch.load(weights_only=True)``.
    The file's SHA-256 is checked against the one recorded at save time.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file, load_model

    directory = Path(directory)
    data = read_config(directory)
    meta = data.pop("tokennet", None) or {}
    if not isinstance(meta, dict):
        raise RunError(f"{directory / CONFIG_FILE} is not a valid model config: 'tokennet' is not an object")
    try:
        config = config_from_dict(data)
    # a hand-edited or foreign config.json (TypeError: a field of the wrong type)
    except (ConfigError, TypeError) as err:
        raise RunError(f"{directory / CONFIG_FILE} is not a valid model config: {err}") from None
    with unwritten_blocks():  # every weight comes from the file next (a missing one is an error below)
        model = model_from_config(config)
    wpath = directory / WEIGHTS_FILE
    if not wpath.is_file():
        pickled = (sorted(pickle_path for pickle_path in directory.iterdir() if pickle_path.suffix in PICKLE_SUFFIXES)
                   if directory.is_dir() else [])
        if not pickled:
            raise RunError(f"{directory} has no {WEIGHTS_FILE}")
        if not allow_pickle:
            raise RunError(f"refusing to load pickle-based weights {pickled[0]} (unpickling can run code); "
                           "convert them to safetensors, or pass allow_pickle=True")
        try:
            loaded = torch.load(pickled[0], map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - any failure of an untrusted file is reported the same way
            raise RunError(f"{pickled[0]} could not be loaded as plain tensors: {str(err).splitlines()[0]}") from None
        if not isinstance(loaded, dict):
            raise RunError(f"{pickled[0]} does not hold a state dict")
        check_state_dict(model.state_dict(), loaded, str(pickled[0]), RunError)
        model.load_state_dict(loaded)
        return model.to(map_location)
    expected = meta.get("weights_sha256")
    if expected is not None and sha256_file(wpath) != expected:
        raise RunError(f"{wpath} does not match the checksum recorded in {CONFIG_FILE}: "
                       "the file was modified or truncated")
    try:
        # safetensors' load_model, without its copy into the model's fresh tensors (twice a model in memory):
        # the file's tensors become the model's; names save_model left out as duplicates of a tied tensor stay
        # tied to the one it kept.
        state = load_file(str(wpath), device=str(map_location))
        expected = model.state_dict(keep_vars=True)
        shared = {id(t) for k, t in expected.items() if k in state}
        if set(state) <= set(expected) and all(k in state or id(t) in shared for k, t in expected.items()):
            load_state_assigned(model, state, strict=False)
            missing, unexpected = [], []
        else:  # other names (an older layout a module's load hook renames, or a damaged file): safetensors' way
            del state
            missing, unexpected = load_model(model, str(wpath), strict=False, device=str(map_location))
    except (SafetensorError, RuntimeError, OSError) as err:
        # torch's "Error(s) in loading state_dict for GPT:" says nothing; the line after it names the tensor.
        lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
        detail = lines[1] if len(lines) > 1 and lines[0].startswith("Error(s) in loading") else lines[0]
        raise RunError(f"{wpath} is corrupt or does not match its config: {detail}") from None
    if missing or unexpected:
        what = f"missing tensor {sorted(missing)[0]!r}" if missing else f"unexpected tensor {sorted(unexpected)[0]!r}"
        raise RunError(f"{wpath} does not match its config: {what}")
    # A file without a recorded checksum (a hand-made or older run) can hold bit flips the format cannot see.
    bad = next((n for n, param in model.named_parameters()
                if param.is_floating_point() and not torch.isfinite(param).all()), None)
    if bad is not None:
        raise RunError(f"{wpath}: tensor {bad!r} holds NaN or infinite values (a damaged file, or a run that "
                       "diverged)")
    return model
