"""LoRA: low-rank adapters on a frozen model's linear layers (Hu et al. 2021, https://arxiv.org/abs/2106.09685).

A frozen linear layer ``y = W x + b`` gets a trainable low-rank update::

    y = W x + b + (α / r) · B A dropout(x),    A ∈ R^(r × K),  B ∈ R^(N × r),  r ≪ min(N, K)

``A`` starts Kaiming-uniform and ``B`` at zero (peft's default), so the adapted model starts exactly
at the base model; only ``A`` and ``B`` train, so the optimizer keeps moments for ``r (N + K)`` numbers
per layer instead of ``N K``. After training the update folds into the weight, ``W' = W + (α/r) B A``
(:func:`merge_lora`), and the model is an ordinary one again: nothing at inference knows about LoRA.

A fused projection holds several maps in one matrix (``qkv_proj = [W_q; W_k; W_v]``). It gets one
adapter per map, as separate ``q``/``k``/``v`` layers would (peft on Llama, litgpt's ``LoRAQKVLinear``):
the ``S`` maps' ``A`` matrices are stacked into one ``(S·r, K)`` matrix, so the down-projection of all
of them is one matmul, and ``B`` is block-diagonal (``B_s`` maps ``A_s x`` to map ``s``'s rows only).

Targets are leaf module names (``qkv_proj``, ``out_proj``, ``fc1``, ``fc2``, ``gate``, ...) or the groups
``attn`` and ``mlp`` (:data:`TARGET_GROUPS`). A target that names no linear layer, or a rank larger
than a layer allows, is a :class:`~tokennet.errors.ConfigError`.

Some modules cannot be adapted: a classification head created afresh for new classes has no trained
weight for a low-rank update to correct, so adapters trained against it would learn to fit a random
projection. ``modules_to_save`` names modules that train in full beside the adapters instead (peft's
``modules_to_save``, which sequence classification fills with the classifier on its own): their parameters
stay trainable, no adapter goes inside them, and the adapter file holds their full weights.

An adapter can be saved alone (:func:`save_adapter`): a safetensors file of the ``A``/``B`` tensors and of the
modules trained in full, with the SHA-256 of its base model's weights (:func:`base_sha256`, which leaves the
modules trained in full out: the file replaces them) in the header; :func:`load_adapter` refuses it on any
other base.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import jsonio
from ..dropout import Dropout
from ..errors import ConfigError, DataError
from ..fileio import safetensors_write

__all__ = ["LoRAConfig", "LoRALinear", "TARGET_GROUPS", "apply_lora", "merge_lora", "strip_lora", "lora_layers",
           "lora_state_dict", "saved_modules", "base_sha256", "save_adapter", "load_adapter", "ADAPTER_FORMAT"]

TARGET_GROUPS = {"attn": ("qkv_proj", "q_proj", "kv_proj", "out_proj"), "mlp": ("fc1", "fc2", "gate")}
ADAPTER_FORMAT = "tokennet-lora/1"
_ADAPTER_KEYS = ("lora_A", "lora_B")


@dataclass
class LoRAConfig:
    """What to adapt and how.

    Args:
        rank: r, the rank of each update ``B A``.
        alpha: α; the update is scaled by ``α / r`` (so changing r at fixed α keeps its size comparable).
        dropout: dropout on the adapter's input (the base layer sees ``x`` unchanged).
        targets: leaf names of the linear layers to adapt, or the groups ``"attn"`` and ``"mlp"``; a
            comma-separated string is accepted (``"attn,mlp"``).
        modules_to_save: modules that train in full (every parameter, no adapter inside them) and are saved
            whole with the adapters: a module's dotted name or its last components (``"head.fc"``, ``"fc"``
            names every module whose name ends in ``.fc``); a comma-separated string is accepted.
    """

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = field(default=("attn", "mlp"))
    modules_to_save: tuple[str, ...] = ()

    def __post_init__(self):
        self.targets = _names(self.targets)
        self.modules_to_save = _names(self.modules_to_save)
        if isinstance(self.rank, bool) or not isinstance(self.rank, numbers.Integral) or self.rank < 1:
            raise ConfigError(f"lora_rank must be a positive integer, got {self.rank!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, numbers.Real) or not (
                self.alpha > 0 and math.isfinite(self.alpha)):
            raise ConfigError(f"lora_alpha must be a positive number, got {self.alpha!r}")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, numbers.Real) or not 0 <= self.dropout < 1:
            raise ConfigError(f"lora_dropout must be in [0, 1), got {self.dropout!r}")
        if not self.targets or not all(isinstance(t, str) and t for t in self.targets):
            raise ConfigError(f"lora_targets must name at least one layer (e.g. 'attn,mlp'), got {self.targets!r}")
        if not all(isinstance(t, str) and t.strip(".") == t and t for t in self.modules_to_save):
            raise ConfigError(f"lora_modules_to_save must be module names (e.g. 'head'), got {self.modules_to_save!r}")

    @property
    def scaling(self) -> float:
        """``α / r``."""
        return self.alpha / self.rank

    def to_dict(self) -> dict:
        return {**asdict(self), "targets": list(self.targets), "modules_to_save": list(self.modules_to_save)}


def _names(value) -> tuple:
    """A tuple of names from a tuple, a list or a comma-separated string."""
    if isinstance(value, str):
        return tuple(t.strip() for t in value.split(",") if t.strip())
    return tuple(value)


class LoRALinear(nn.Linear):
    """A frozen ``nn.Linear`` plus a trainable low-rank update: ``y = x Wᵀ + b + s · dropout(x) Aᵀ B_bdᵀ``.

    It *is* an ``nn.Linear`` holding the base layer's own ``weight`` and ``bias`` (the same parameters, under
    the same names, frozen), so code that reads ``.weight`` keeps working and a state dict keeps the base's
    keys beside ``lora_A`` and ``lora_B``.

    Args:
        base: the layer to adapt (its parameters are shared, not copied).
        rank, alpha, dropout: see :class:`LoRAConfig`.
        splits: output rows of each map of a fused projection (e.g. ``[q_dim, kv_dim, kv_dim]``); one
            adapter per map. Default: one map.
        fused: without dropout, compute the layer as one autograd node that accumulates the adapter's update
            into the base's output and ``∂x`` in place (:class:`_LoRAFunction`); same result as autograd's
            two-GEMM form up to float rounding. Under ``torch.compile`` the layer is traced in that form.
    """

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0,
                 splits: list[int] | None = None, fused: bool = True):
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.splits = list(splits or [base.out_features])
        if sum(self.splits) != base.out_features:
            raise ValueError(f"splits {self.splits} must add up to out_features={base.out_features}")
        self.rank, self.alpha, self.scaling = rank, alpha, alpha / rank
        self.weight = base.weight
        self.bias = base.bias
        self.weight.requires_grad_(False)
        if self.bias is not None:
            self.bias.requires_grad_(False)
        S, K = len(self.splits), self.in_features
        base_weight = base.weight
        device, dtype = base_weight.device, base_weight.dtype
        self.lora_A = nn.Parameter(torch.empty(S * rank, K, device=device, dtype=dtype))  # (S·r, K)
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, rank, device=device, dtype=dtype))  # (N, r)
        for block in self.lora_A.split(rank):  # peft's init, per map: U(±1/√K)
            nn.init.kaiming_uniform_(block, a=math.sqrt(5))
        self.lora_dropout = Dropout(dropout) if dropout > 0 else nn.Identity()
        self.fused = fused

    def _frozen_weight(self, kind: str) -> Tensor:
        """The frozen ``W``; under autocast, its copy in the autocast dtype, cast once and kept (beside the module's
        state, not in it) until ``W`` changes: replaced, moved, or written in place. Autocast itself casts a
        weight at every call unless it requires a gradient, and a frozen one does not: the cast of the whole
        base, at every step, is what this keeps."""
        weight = self.weight
        if not torch.is_autocast_enabled(kind):
            return weight
        dtype = torch.get_autocast_dtype(kind)
        if weight.dtype == dtype:
            return weight
        key = (weight.data_ptr(), weight._version, weight.device, dtype)
        kept = self.__dict__.get("_cast_weight")
        if kept is None or kept[0] is not weight or kept[1] != key:
            kept = self.__dict__["_cast_weight"] = (weight, key, weight.detach().to(dtype))
        return kept[2]

    def block_b(self) -> Tensor:
        """``B`` as the block-diagonal ``(N, S·r)`` matrix: rows of map ``s`` read only ``A_s x``."""
        if len(self.splits) == 1:
            return self.lora_B
        return torch.block_diag(*self.lora_B.split(self.splits))  # (N, S·r)

    def delta_weight(self) -> Tensor:
        """The update ``ΔW = (α / r) B_bd A`` ``(N, K)``."""
        return (self.block_b() @ self.lora_A) * self.scaling

    def forward(self, x: Tensor) -> Tensor:
        """``(..., K) → (..., N)``.

        Without dropout (``fused``, the default) one autograd node (:class:`_LoRAFunction`) computes the base GEMM and
        accumulates the adapter's update into its output in place; backward accumulates ``∂x`` of the base and of
        the adapter into one tensor. Autograd's two-GEMM form (below) holds a second output-wide tensor and adds it.
        """
        # Traced by torch.compile, the autograd form below: Inductor plans the GEMMs and fuses the rest itself.
        if (self.fused and isinstance(self.lora_dropout, nn.Identity) and not self.weight.requires_grad
                and (self.bias is None or not self.bias.requires_grad) and not torch.compiler.is_compiling()):
            rows = x.reshape(-1, self.in_features)  # (M, K)
            y = _LoRAFunction.apply(rows, self._frozen_weight(x.device.type), self.bias, self.lora_A, self.lora_B,
                                    self.scaling, self.splits, self.rank)
            return y.view(*x.shape[:-1], self.out_features)
        y = F.linear(x, self.weight, self.bias)  # (..., N)
        z = F.linear(self.lora_dropout(x), self.lora_A) * self.scaling  # (..., S·r): scale the narrow side
        # y + z B_bdᵀ as one GEMM that accumulates into y (no separate pass over the N-wide output).
        return torch.addmm(y.reshape(-1, self.out_features), z.reshape(-1, z.shape[-1]),
                           self.block_b().t()).view(y.shape)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}, "
                f"alpha={self.alpha}, splits={self.splits}")


class _LoRAFunction(torch.autograd.Function):
    """``y = x Wᵀ + b + s (x Aᵀ) B_bdᵀ`` ``(M, K) → (M, N)`` with ``W`` and ``b`` frozen, in one autograd node.

    Forward: ``y = x Wᵀ + b`` (one GEMM), ``z = s · x Aᵀ`` ``(M, S·r)``, then ``y[:, map s] += z_s B_sᵀ`` in place (one
    rank-r GEMM per map, no block-diagonal matrix built). Saved: ``x`` and the narrow ``z``. Backward:
    ``∂z_s = ∂y[:, map s] B_s``, ``∂B_s = ∂y[:, map s]ᵀ z_s``, ``∂A = s ∂zᵀ x`` and ``∂x = ∂y W + s ∂z A`` accumulated
    into one tensor (``addmm``); ``W`` and ``b`` get no gradient. Against autograd's form this saves the
    ``(M, N)``-wide sum of two outputs in forward and of two input gradients in backward, and the nodes between.

    Under ``torch.autocast`` (``--set precision=bf16``) every product runs in the autocast dtype, as autocast runs
    a plain linear layer's: the operands are cast once in forward (the cast ``W`` is kept for backward, as autograd
    keeps an autocast ``F.linear``'s), ``y`` comes out in that dtype, and ``∂A``, ``∂B`` go back in the adapters' own
    dtype (float32) for the optimizer.
    """

    @staticmethod
    def forward(ctx, x, W, bias, A, B, scaling, splits, rank):
        kind = x.device.type
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None
        ctx.dtypes = (x.dtype, A.dtype, B.dtype)  # the gradients' dtypes
        with torch.autocast(kind, enabled=False):
            if dtype is not None:  # the products in the autocast dtype
                x, W, A, B = (t.to(dtype) for t in (x, W, A, B))
                bias = None if bias is None else bias.to(dtype)
            y = torch.addmm(bias, x, W.t()) if bias is not None else x @ W.t()  # (M, N)
            z = (x @ A.t()).mul_(scaling)  # (M, S·r)
            start = 0
            for index, n in enumerate(splits):
                y[:, start:start + n].addmm_(z[:, index * rank:(index + 1) * rank], B[start:start + n].t())
                start += n
        ctx.save_for_backward(x, W, A, B, z)
        ctx.scaling, ctx.splits, ctx.rank = scaling, splits, rank
        return y

    @staticmethod
    def backward(ctx, gy):
        x, W, A, B, z = ctx.saved_tensors
        grad_y = gy.to(z.dtype)
        rank, start, grad_z, grad_B = ctx.rank, 0, [], []
        for index, n in enumerate(ctx.splits):
            grad = grad_y[:, start:start + n]  # (M, n)
            grad_z.append(grad @ B[start:start + n])  # (M, r)
            grad_B.append(grad.t() @ z[:, index * rank:(index + 1) * rank])  # (n, r)
            start += n
        grad_z = (grad_z[0] if len(grad_z) == 1 else torch.cat(grad_z, 1)).mul_(ctx.scaling)  # (M, S·r): ∂(x Aᵀ)
        grad_x = torch.addmm(grad_z @ A, grad_y, W) if ctx.needs_input_grad[0] else None  # (M, K)
        grad_A = grad_z.t() @ x if ctx.needs_input_grad[3] else None  # (S·r, K)
        grad_B = (grad_B[0] if len(grad_B) == 1 else torch.cat(grad_B, 0)) if ctx.needs_input_grad[4] else None
        grad_x, grad_A, grad_B = (None if grad is None else grad.to(t)
                                  for grad, t in zip((grad_x, grad_A, grad_B), ctx.dtypes))
        return grad_x, None, None, grad_A, grad_B, None, None, None


def _splits(parent: nn.Module, name: str, lin: nn.Linear) -> list[int]:
    """The maps fused in a projection of an attention layer (``[W_q; W_k; W_v]``, ``[W_k; W_v]``)."""
    q_dim, kv_dim = getattr(parent, "q_dim", None), getattr(parent, "kv_dim", None)
    if q_dim is not None and kv_dim is not None:
        if name == "qkv_proj" and lin.out_features == q_dim + 2 * kv_dim:
            return [q_dim, kv_dim, kv_dim]
        if name == "kv_proj" and lin.out_features == 2 * kv_dim:
            return [kv_dim, kv_dim]
    return [lin.out_features]


def _resolve_targets(model: nn.Module, targets: tuple[str, ...]) -> set[str]:
    leaves = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear) and n}
    wanted: set[str] = set()
    for t in targets:
        names = TARGET_GROUPS.get(t, (t,))
        found = leaves.intersection(names)
        if not found:
            raise ConfigError(f"lora target {t!r} names no linear layer of this {type(model).__name__} "
                              f"(its linear layers: {', '.join(sorted(leaves))}; groups: {', '.join(TARGET_GROUPS)})")
        wanted |= found
    return wanted


def _matches(full: str, name: str) -> bool:
    return full == name or full.endswith("." + name)


def saved_modules(model: nn.Module, config: LoRAConfig) -> dict[str, nn.Module]:
    """``{dotted name: module}`` of the modules ``config.modules_to_save`` names in ``model`` (the outermost
    where one holds another), in the model's order.

    Raises:
        ConfigError: a name matches no module (or only the model itself); a module shares a parameter with a
            module outside it (a head tied to an embedding: training it in full would change the base).
    """
    if not config.modules_to_save:
        return {}
    named = [(n, m) for n, m in model.named_modules() if n]
    found: dict[str, nn.Module] = {}
    for want in config.modules_to_save:
        hits = [(n, m) for n, m in named if _matches(n, want)]
        if not hits:
            top = ", ".join(n for n, _ in model.named_children())
            raise ConfigError(f"lora_modules_to_save {want!r} names no module of this {type(model).__name__} "
                              f"(a dotted name such as 'head' or 'head.fc'; its top-level modules: {top})")
        found.update(hits)
    outer = {n: m for n, m in found.items() if not any(n.startswith(other + ".") for other in found)}
    inside = {id(param): n for n, m in outer.items() for param in m.parameters()}
    for pname, param in model.named_parameters(remove_duplicate=False):
        owner = inside.get(id(param))
        if owner is not None and not pname.startswith(owner + "."):
            raise ConfigError(f"lora_modules_to_save: {owner} shares a parameter with {pname}, outside it (tied "
                              "weights); training it in full would change the base model")
    return {n: m for n, m in named if n in outer}


def _under(key: str, prefixes) -> bool:
    return any(key.startswith(prefix + ".") for prefix in prefixes)


def apply_lora(model: nn.Module, config: LoRAConfig) -> nn.Module:
    """Freeze every parameter of ``model`` and put a :class:`LoRALinear` on each targeted linear layer, in place.

    Returns the model. Only the adapters' ``lora_A``/``lora_B`` and the parameters of the modules to save
    (``config.modules_to_save``, :func:`saved_modules`) require gradients afterwards, so the trainer's optimizer
    (which skips frozen parameters) keeps state for them alone. No adapter goes inside a module to save (it
    trains in full). A layer whose weight is shared with an embedding (a tied LM head) is not adapted:
    merging would untie it.

    Raises:
        ConfigError: a target names no linear layer; the rank exceeds ``min(in, out)`` of a layer (of each
            map of a fused one); the model already has adapters; a module to save is unknown or tied to a
            module outside it.
    """
    if lora_layers(model):
        raise ConfigError("the model already has LoRA adapters; merge or strip them first")
    wanted = _resolve_targets(model, config.targets)
    saved = saved_modules(model, config)
    in_saved = {id(m) for module in saved.values() for m in module.modules()}
    embed_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    plan = []
    for pname, parent in model.named_modules():
        for name, child in parent.named_children():
            if (type(child) is not nn.Linear or name not in wanted or id(child.weight) in embed_ids
                    or id(child) in in_saved):
                continue
            splits = _splits(parent, name, child)
            limit = min(child.in_features, *splits)
            if config.rank > limit:
                full = f"{pname}.{name}" if pname else name
                raise ConfigError(f"lora_rank={config.rank} is larger than layer {full} allows "
                                  f"(min(in, out) = {limit}); choose a rank <= {limit}")
            plan.append((parent, name, child, splits))
    if not plan:
        raise ConfigError(f"lora targets {list(config.targets)} match only layers tied to an embedding or trained "
                          f"in full ({', '.join(saved) or 'none'}); nothing to adapt")
    for param in model.parameters():
        param.requires_grad_(False)
    for parent, name, child, splits in plan:
        setattr(parent, name, LoRALinear(child, config.rank, config.alpha, config.dropout, splits))
    for m in saved.values():
        for param in m.parameters():
            param.requires_grad_(True)
    return model


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    """``{module name: LoRALinear}`` of every adapted layer."""
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}


def _replace(model: nn.Module, weight_of) -> nn.Module:
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, LoRALinear):
                lin = nn.Linear(child.in_features, child.out_features, bias=child.bias is not None,
                                device=child.weight.device, dtype=child.weight.dtype)
                with torch.no_grad():
                    lin.weight.copy_(weight_of(child))
                    if child.bias is not None:
                        lin.bias.copy_(child.bias)
                setattr(parent, name, lin)
    for param in model.parameters():
        param.requires_grad_(True)
    return model


@torch.no_grad()
def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into its weight, ``W ← W + (α/r) B A``, as plain ``nn.Linear`` layers, in place.

    The result is an ordinary model (every parameter trainable again) whose outputs equal the adapted
    model's up to float rounding; it saves, loads and exports as any other.
    """
    return _replace(model, lambda m: m.weight + m.delta_weight())


@torch.no_grad()
def strip_lora(model: nn.Module) -> nn.Module:
    """Drop every adapter, leaving the base weights as plain ``nn.Linear`` layers, in place.

    Modules trained in full (``modules_to_save``) keep the weights they have (as peft's ``unload`` keeps
    them): there is no adapter in them to drop.
    """
    return _replace(model, lambda m: m.weight)


def lora_state_dict(model: nn.Module, config: LoRAConfig | None = None) -> dict[str, Tensor]:
    """The adapters' tensors: ``{"<layer>.lora_A": (S·r, K), "<layer>.lora_B": (N, r)}``, and with ``config``
    every tensor of its modules to save (``"head.fc.weight"``, ...), under their names in ``model``."""
    saved = saved_modules(model, config) if config is not None else {}
    return {k: v for k, v in model.state_dict().items()
            if k.rsplit(".", 1)[-1] in _ADAPTER_KEYS or _under(k, saved)}


def base_sha256(model: nn.Module, config: LoRAConfig | None = None) -> str:
    """SHA-256 of the base model's weights: every state-dict tensor except the adapters, by name, dtype, shape,
    bytes; with ``config``, also except its modules to save (an adapter file holds them whole, so it fits a
    base whatever those modules hold: a new head's random initialization is no part of the base).

    A checksum of tensor contents rather than of a file, so a base imported on the fly and the same base
    saved as a run have one checksum, and adapting a model does not change it.
    """
    saved = saved_modules(model, config) if config is not None else {}
    digest = hashlib.sha256()
    for k, t in sorted(model.state_dict().items()):
        if k.rsplit(".", 1)[-1] in _ADAPTER_KEYS or _under(k, saved):
            continue
        t = t.detach().cpu().contiguous()
        digest.update(f"{k}|{t.dtype}|{tuple(t.shape)}\n".encode())
        digest.update(t.view(-1).view(torch.uint8).numpy() if t.numel() else b"")
    return digest.hexdigest()


def save_adapter(model: nn.Module, path: str | Path, config: LoRAConfig, *, base: str | None = None) -> Path:
    """Write the adapters of ``model`` alone as safetensors, with the base weights' checksum in the header.

    The file also holds the full weights of ``config.modules_to_save`` (peft's ``modules_to_save``).

    Args:
        model: an adapted model (:func:`apply_lora`), before merging.
        path: the ``.safetensors`` file to write (atomically).
        config: the adapters' settings, stored with them.
        base: the base checksum (default :func:`base_sha256` of ``model`` and ``config``).
    """
    from safetensors.torch import save_file

    if not lora_layers(model):
        raise ConfigError("the model has no LoRA adapters to save")
    tensors = {k: v.detach().contiguous() for k, v in lora_state_dict(model, config).items()}
    path = Path(path)
    meta = {"format": ADAPTER_FORMAT, "base_sha256": base or base_sha256(model, config),
            "lora": json.dumps(config.to_dict())}
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with safetensors_write(tmp):
            save_file(tensors, str(tmp), metadata=meta)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def load_adapter(model: nn.Module, path: str | Path) -> LoRAConfig:
    """Put the adapters saved in ``path`` onto ``model`` (a plain base model), in place; returns their config.

    The modules the file holds whole (``modules_to_save``) get its weights; they must have its shapes (a
    classifier with a new head: build the base with the adapter's number of classes, e.g. with
    :func:`tokennet.interop.init.with_num_classes`; what that head holds before does not matter).

    Raises:
        DataError: the file is not a tokennet adapter, its base checksum is not this model's weights' (an
            adapter is only meaningful on the exact base it was trained on), or its tensors do not fit.
    """
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    try:
        with safe_open(str(path), "pt") as reader:
            meta = reader.metadata() or {}
            tensors = {k: reader.get_tensor(k) for k in reader.keys()}  # noqa: SIM118 - safe_open has no __iter__
    except (SafetensorError, OSError) as err:
        raise DataError(f"{path} is not a safetensors file: {err}") from None
    if meta.get("format") != ADAPTER_FORMAT:
        raise DataError(f"{path} is not a tokennet LoRA adapter (no '{ADAPTER_FORMAT}' header)")
    try:
        config = LoRAConfig(**jsonio.loads(meta["lora"], what=f"{path}: the LoRA settings in the header"))
    except (KeyError, TypeError, ValueError) as err:  # ConfigError is a ValueError
        raise DataError(f"{path}: unreadable LoRA settings in the header ({err})") from None
    try:
        got = base_sha256(model, config)
    except ConfigError as err:
        raise DataError(f"{path}: its modules trained in full do not fit this model: {err}") from None
    if meta.get("base_sha256") != got:
        raise DataError(f"{path} was trained on base weights {str(meta.get('base_sha256'))[:12]}…, not on this "
                        f"model ({got[:12]}…); load it onto the base it was trained on")
    apply_lora(model, config)
    expected = lora_state_dict(model, config)
    bad = sorted(set(expected) ^ set(tensors)) or [k for k in expected if expected[k].shape != tensors[k].shape]
    if bad:
        strip_lora(model)
        k = bad[0]
        have = f"{tuple(tensors[k].shape)}" if k in tensors else "nothing"
        want = f"{tuple(expected[k].shape)}" if k in expected else "nothing"
        raise DataError(f"{path}: its adapters do not fit this model's layers ({k}: the file holds {have}, "
                        f"the model {want})")
    model.load_state_dict(tensors, strict=False)
    return config
