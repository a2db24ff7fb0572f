"""Optimizers and learning-rate schedules.

- AdamW with weight-decay groups (GPT-2, nanoGPT);
- Muon for the hidden matrices with AdamW for everything else (:class:`MuonAdamW`);
- warm-up + cosine decay (:func:`cosine_lr`) and warm-up–stable–decay (:func:`wsd_lr`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.optim.adamw import adamw as _adamw_update

from ..errors import ConfigError

__all__ = ["configure_optimizer", "cosine_lr", "wsd_lr", "schedule_lr", "MuonAdamW", "newton_schulz",
           "muon_param_names", "OPTIMIZERS", "SCHEDULES"]

OPTIMIZERS = ("adamw", "muon")
SCHEDULES = ("cosine", "wsd")

# Quintic Newton–Schulz coefficients from Keller Jordan's Muon (maximize the slope at 0, 5 steps).
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def _adamw_groups(model: nn.Module, weight_decay: float, exclude: set[int] = frozenset()) -> list[dict]:
    seen, decay, no_decay = set(exclude), [], []
    for param in model.parameters():
        if not param.requires_grad or id(param) in seen:  # tied weights appear once
            continue
        seen.add(id(param))
        (decay if param.dim() >= 2 else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def muon_param_names(model: nn.Module) -> list[str]:
    """Names of the parameters Muon updates: the 2-D weights of the hidden linear layers.

    Muon orthogonalizes a matrix's update, which suits a linear map between hidden spaces. The token
    embedding is a lookup table (one row per token, most rows see no gradient in a step), and the LM
    head maps into the vocabulary's logit space; both, and every gain and bias, stay with AdamW
    (Jordan et al. 2024, https://kellerjordan.github.io/posts/muon/). So: every ``nn.Linear`` weight
    except one that is (or is tied to) an ``nn.Embedding`` or is named ``lm_head``/``head``.
    """
    embed_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    names, seen = [], set()
    for mname, m in model.named_modules():
        if not isinstance(m, nn.Linear) or not m.weight.requires_grad:
            continue
        weight = m.weight
        leaf = mname.rsplit(".", 1)[-1]
        if id(weight) in embed_ids or id(weight) in seen or leaf in ("lm_head", "head"):
            continue
        seen.add(id(weight))
        names.append(f"{mname}.weight" if mname else "weight")
    return names


def _row_splits(model: nn.Module) -> dict[int, list[int]]:
    """Fused projections to orthogonalize block by block: ``[W_q; W_k; W_v]`` is three maps, not one."""
    splits = {}
    for m in model.modules():
        proj = getattr(m, "qkv_proj", None)
        if isinstance(proj, nn.Linear) and hasattr(m, "q_dim") and hasattr(m, "kv_dim"):
            splits[id(proj.weight)] = [m.q_dim, m.kv_dim, m.kv_dim]
    return splits


def configure_optimizer(
    model: nn.Module,
    *,
    lr: float,
    weight_decay: float = 0.1,
    betas: tuple[float, float] = (0.9, 0.99),
    device_type: str = "cpu",
    optimizer: str = "adamw",
    muon_lr: float = 0.02,
    muon_momentum: float = 0.95,
    muon_weight_decay: float = 0.0,
    ns_steps: int = 5,
) -> torch.optim.Optimizer:
    """AdamW (Loshchilov & Hutter 2019) that decays matrices only, or Muon + AdamW.

    Weight decay pulls weights toward 0; for matrices (linear layers, embeddings) that regularizes,
    while decaying biases and LayerNorm gains only fights the normalization. So parameters with
    ``dim >= 2`` decay and the rest do not, as in GPT-2 and nanoGPT.

    With ``optimizer="muon"``, the hidden matrices (:func:`muon_param_names`) go to Muon with learning
    rate ``muon_lr``; embeddings, the head, gains and biases to AdamW with ``lr``, in one optimizer
    (:class:`MuonAdamW`), so checkpoints hold one state dict.
    """
    if optimizer not in OPTIMIZERS:
        raise ConfigError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    if optimizer == "adamw":
        # The fused kernel updates every parameter in one pass, on CPU as on CUDA: on a small CPU model it
        # is ~10× faster than the default per-parameter loop (bench/gpt_train.py measures the whole step).
        options = {"fused": True} if device_type in ("cpu", "cuda") else {}
        return torch.optim.AdamW(_adamw_groups(model, weight_decay), lr=lr, betas=betas, **options)
    params = dict(model.named_parameters())
    muon = [params[n] for n in muon_param_names(model)]
    adam = _adamw_groups(model, weight_decay, exclude={id(param) for param in muon})
    return MuonAdamW(muon, adam, lr=lr, betas=betas, muon_lr=muon_lr, momentum=muon_momentum,
                     muon_weight_decay=muon_weight_decay, ns_steps=ns_steps, row_splits=_row_splits(model))


def newton_schulz(G: Tensor, steps: int = 5, eps: float = 1e-7) -> Tensor:
    """Approximately orthogonalize a batch of matrices ``(..., m, n)``: ``G = U S Vᵀ → U S' Vᵀ``, ``S' ≈ 1``.

    Quintic iteration ``X ← a X + (b A + c A²) X`` with ``A = X Xᵀ``, started from ``G / ‖G‖_F`` (so every
    singular value is ≤ 1). Runs in fp32: on CPUs without bf16 matmul units, bf16 is several times slower
    (PyTorch's ``torch.optim.Muon`` casts to bf16, ~15× slower per step here; bench/gpt_train.py).
    """
    coef_x, coef_a, coef_a2 = NS_COEFFICIENTS  # the docstring's a, b, c; ``iterate`` is its X
    iterate = G.float()
    tall = iterate.size(-2) > iterate.size(-1)
    if tall:  # iterate on the short side: A is (min, min)
        iterate = iterate.mT
    iterate = iterate / (iterate.norm(dim=(-2, -1), keepdim=True) + eps)
    for _ in range(steps):
        A = iterate @ iterate.mT
        B = torch.baddbmm(A, A, A, beta=coef_a, alpha=coef_a2) if A.dim() == 3 else coef_a * A + coef_a2 * (A @ A)
        if iterate.dim() == 3:
            iterate = torch.baddbmm(iterate, B, iterate, beta=coef_x)
        else:
            iterate = coef_x * iterate + B @ iterate
    return iterate.mT if tall else iterate


class MuonAdamW(torch.optim.Optimizer):
    """Muon (MomentUm Orthogonalized by Newton–Schulz) for hidden matrices, AdamW for the rest.

    Muon (Jordan et al. 2024, https://kellerjordan.github.io/posts/muon/): ``M ← μ M + (1−μ) G``; the
    update is the Nesterov mix ``U = (1−μ) G + μ M`` orthogonalized, ``W ← W − η √max(1, m/n) NS(U)``
    (``W`` is ``m × n``). Every step of a matrix then has the same spectral size whatever the gradient's
    scale, so the rare directions learn as fast as the dominant one. Matrices of one shape are
    orthogonalized together in one batched matmul chain (the small matrices of a CPU model would
    otherwise pay per-call overhead); a fused ``[W_q; W_k; W_v]`` is orthogonalized as three blocks.

    The other groups get AdamW, decoupled weight decay ``W ← W (1 − η λ)``, bias-corrected moments.
    Groups carry ``"kind": "muon" | "adamw"``.

    Args:
        muon_params: the matrices for Muon.
        adam_groups: parameter groups (dicts with ``params`` and ``weight_decay``) for AdamW.
        lr, betas, eps: AdamW's.
        muon_lr, momentum, muon_weight_decay, ns_steps: Muon's learning rate, momentum μ, decoupled
            weight decay and Newton–Schulz steps.
        row_splits: ``id(param) → [rows, ...]`` for fused matrices orthogonalized block by block.
    """

    def __init__(self, muon_params, adam_groups, *, lr: float = 1e-3, betas=(0.9, 0.99), eps: float = 1e-8,
                 muon_lr: float = 0.02, momentum: float = 0.95, muon_weight_decay: float = 0.0, ns_steps: int = 5,
                 row_splits: dict[int, list[int]] | None = None):
        muon_params = list(muon_params)
        for param in muon_params:
            if param.dim() != 2:
                raise ValueError(f"Muon updates 2-D matrices only, got a parameter of shape {tuple(param.shape)}")
        if not 0 <= momentum < 1:
            raise ConfigError(f"muon_momentum must be in [0, 1), got {momentum}")
        if not (muon_lr > 0 and math.isfinite(muon_lr)):
            raise ConfigError(f"muon_lr must be a positive number, got {muon_lr}")
        if ns_steps < 1:
            raise ConfigError(f"ns_steps must be >= 1, got {ns_steps}")
        groups = [{"params": muon_params, "kind": "muon", "lr": muon_lr, "momentum": momentum,
                   "weight_decay": muon_weight_decay, "ns_steps": ns_steps}]
        groups += [{**group, "kind": "adamw"} for group in adam_groups if group["params"]]
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": 0.0, "momentum": momentum,
                    "ns_steps": ns_steps}
        super().__init__(groups, defaults)
        self._splits = dict(row_splits or {})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["kind"] == "muon":
                self._muon(group)
            else:
                self._adamw(group)
        return loss

    def _muon(self, g: dict) -> None:
        params = [param for param in g["params"] if param.grad is not None]
        if not params:
            return
        momentum, lr, weight_decay = g["momentum"], g["lr"], g["weight_decay"]
        grads = [param.grad for param in params]
        bufs = []
        for param in params:
            state = self.state[param]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(param)
            bufs.append(state["momentum_buffer"])
        torch._foreach_lerp_(bufs, grads, 1 - momentum)
        updates = torch._foreach_lerp(grads, bufs, momentum)  # Nesterov: (1−μ) G + μ M
        # Bucket every (block of a) matrix by shape; orthogonalize each bucket in one batched chain.
        # Under FSDP a parameter is a DTensor sharded by rows: orthogonalize the whole matrix (the same
        # computation on every rank) and keep this rank's rows.
        full = [_full(update) for update in updates]
        out = [torch.empty_like(update) for update in full]
        buckets: dict[tuple[int, int], list[tuple[Tensor, Tensor]]] = {}
        for param, update, result in zip(params, full, out, strict=True):
            rows = self._splits.get(id(param), [update.shape[0]])
            for result_rows, update_rows in zip(result.split(rows), update.split(rows), strict=True):
                buckets.setdefault(tuple(update_rows.shape), []).append((result_rows, update_rows))
        for (m, n), items in buckets.items():
            ortho = newton_schulz(torch.stack([update_rows for _, update_rows in items]), g["ns_steps"])  # (k, m, n)
            for (result_rows, _), ortho_rows in zip(items, ortho.unbind(0), strict=True):
                result_rows.copy_(ortho_rows).mul_(max(1.0, m / n) ** 0.5)
        if weight_decay:
            torch._foreach_mul_(params, 1 - lr * weight_decay)
        for param, result in zip(params, out, strict=True):
            _local(param).add_(_local_rows(param, result), alpha=-lr)

    def _adamw(self, g: dict) -> None:
        """PyTorch's own AdamW update (``torch.optim.adamw.adamw``: fused on CPU and CUDA, foreach under FSDP)
        on this group, with the state kept under ``torch.optim.AdamW``'s keys."""
        params = [param for param in g["params"] if param.grad is not None]
        if not params:
            return
        for param in params:
            state = self.state[param]
            if "exp_avg" not in state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
                state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(param), torch.zeros_like(param)
        states = [self.state[param] for param in params]
        fused = params[0].device.type in ("cpu", "cuda") and not any(_is_dtensor(param) for param in params)
        (beta1, beta2) = g["betas"]
        _adamw_update(params, [param.grad for param in params], [state["exp_avg"] for state in states],
                      [state["exp_avg_sq"] for state in states], [], [state["step"] for state in states],
                      fused=fused, foreach=not fused, amsgrad=False, beta1=beta1, beta2=beta2, lr=g["lr"],
                      weight_decay=g["weight_decay"], eps=g["eps"], maximize=False)


def _is_dtensor(t: Tensor) -> bool:
    return type(t).__name__ == "DTensor"


def _full(t: Tensor) -> Tensor:
    return t.full_tensor() if _is_dtensor(t) else t


def _local(t: Tensor) -> Tensor:
    return t.to_local() if _is_dtensor(t) else t


def _local_rows(p: Tensor, full: Tensor) -> Tensor:
    """This rank's part of ``full`` when ``p`` is a DTensor sharded on dim 0 (FSDP2's ``torch.chunk`` layout)."""
    if not _is_dtensor(p):
        return full
    from torch.distributed.tensor import Shard

    for dim_mesh, placement in enumerate(p.placements):
        if isinstance(placement, Shard):
            if placement.dim != 0:
                raise NotImplementedError("Muon under FSDP supports parameters sharded on dim 0 only")
            mesh = p.device_mesh
            full = full.chunk(mesh.size(dim_mesh), dim=0)[mesh.get_local_rank(dim_mesh)]
    return full


def cosine_lr(step: int, decay_progress: float, *, lr: float, min_lr: float, warmup_iters: int) -> float:
    """Linear warm-up for ``warmup_iters`` steps, then cosine decay from ``lr`` to ``min_lr``.

    ``lr_t = min_lr + ½ (lr − min_lr)(1 + cos(π p))`` where ``p ∈ [0, 1]`` is ``decay_progress``, the
    fraction of the post-warm-up budget spent (in steps, or in seconds under a time budget).
    """
    if step < warmup_iters:
        return lr * (step + 1) / (warmup_iters + 1)
    progress = min(1.0, max(0.0, decay_progress))
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def wsd_lr(step: int, decay_progress: float, *, lr: float, min_lr: float, warmup_iters: int,
           decay_fraction: float = 0.3) -> float:
    """Warm-up–stable–decay (Hu et al. 2024, MiniCPM, https://arxiv.org/abs/2404.06395).

    Linear warm-up for ``warmup_iters`` steps; then ``lr`` held constant until ``p = 1 − decay_fraction``;
    then a linear ramp to ``min_lr`` at ``p = 1``. Holding the peak rate longer than a cosine does makes
    faster progress; the short final decay collects it (modded-nanogpt's schedule).
    """
    if not 0 < decay_fraction <= 1:
        raise ConfigError(f"decay_fraction must be in (0, 1], got {decay_fraction}")
    if step < warmup_iters:
        return lr * (step + 1) / (warmup_iters + 1)
    progress = min(1.0, max(0.0, decay_progress))
    start = 1.0 - decay_fraction
    if progress <= start:
        return lr
    return lr - (lr - min_lr) * (progress - start) / decay_fraction


def schedule_lr(kind: str, step: int, decay_progress: float, *, lr: float, min_lr: float, warmup_iters: int,
                decay_fraction: float = 0.3) -> float:
    """The learning rate of schedule ``kind`` (``"cosine"`` or ``"wsd"``) at ``step``."""
    if kind == "cosine":
        return cosine_lr(step, decay_progress, lr=lr, min_lr=min_lr, warmup_iters=warmup_iters)
    if kind == "wsd":
        return wsd_lr(step, decay_progress, lr=lr, min_lr=min_lr, warmup_iters=warmup_iters,
                      decay_fraction=decay_fraction)
    raise ConfigError(f"schedule must be one of {SCHEDULES}, got {kind!r}")
