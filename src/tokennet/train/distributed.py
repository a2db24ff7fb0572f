"""Scale-out with PyTorch's own engine: ``torchrun --nproc_per_node N -m tokennet train RECIPE``.

torchrun starts N processes and sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``; each process then
joins one process group (``gloo`` on CPU, ``nccl`` on GPUs). Two strategies:

- ``ddp`` (DistributedDataParallel): every rank holds the whole model; gradients are averaged with
  an all-reduce during backward.
- ``fsdp`` (FSDP2, ``fully_shard``): parameters, gradients and optimizer states are sharded across
  ranks; each block's parameters are all-gathered just in time for its forward and backward.

Each rank draws its own micro-batches (index ``i · world + rank``), so N ranks with batch B compute
exactly the step of one process with ``grad_accum = N`` micro-batches of B. Rank 0 alone logs, prints
and writes checkpoints; checkpoints hold full (unsharded) tensors, so a run can resume on a
different number of ranks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ..errors import ConfigError

__all__ = ["DistInfo", "init_distributed", "wrap_model", "STRATEGIES", "all_reduce_mean", "barrier",
           "full_state", "load_full_state", "gather_objects"]

STRATEGIES = ("ddp", "fsdp")


@dataclass
class DistInfo:
    """Where this process stands: rank, world size, and the device it trains on."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device: torch.device) -> tuple[DistInfo, torch.device]:
    """Join the process group torchrun prepared (if any); return the info and this rank's device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo(), device
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return DistInfo(rank, world, local), device


def wrap_model(model: nn.Module, strategy: str, info: DistInfo, device: torch.device) -> nn.Module:
    """Wrap for data parallelism (DDP) or sharding (FSDP2: each block, then the root)."""
    if strategy not in STRATEGIES:
        raise ConfigError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if not info.enabled:
        return model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    from torch.distributed.fsdp import fully_shard

    for m in model.modules():
        if type(m).__name__ == "Block":  # one all-gather per block keeps peak memory to one block
            fully_shard(m)
    fully_shard(model)
    return model


def all_reduce_mean(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        t = t.detach().clone()
        dist.all_reduce(t)
        t /= info.world_size
    return t


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def gather_objects(obj, info: DistInfo) -> list:
    """Every rank's ``obj``, in rank order (on every rank)."""
    if not info.enabled:
        return [obj]
    out = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> tuple[dict, dict | None]:
    """Full (unsharded) model and optimizer state dicts keyed by parameter name, on the CPU.

    A collective under FSDP: every rank must call it; with cpu_offload only rank 0 gets the tensors.
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    msd = get_model_state_dict(model, options=opts)
    osd = get_optimizer_state_dict(model, optimizer, options=opts) if optimizer is not None else None
    return msd, osd


def load_full_state(model: nn.Module, optimizer: torch.optim.Optimizer | None, msd: dict, osd: dict | None,
                    info: DistInfo) -> None:
    """Load full state dicts into a (possibly sharded) model and optimizer, on every rank."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    set_model_state_dict(model, msd, options=StateDictOptions(full_state_dict=True, strict=True))
    if optimizer is None or osd is None:
        return
    names = _names_of_parameters(model)
    saved = set(osd.get("state", {}))
    unknown = sorted(saved - set().union(*names.values()))
    if unknown:
        raise KeyError(f"optimizer state for {unknown[0]!r}, which the model has no parameter of")
    # A parameter that had no gradient yet had no optimizer state when the checkpoint was written (a multimodal
    # task not yet drawn, a frozen part). torch creates state for every parameter on load (a zero step: its
    # ``step`` count becomes 1); removing it again makes the resumed run take the first real step exactly as
    # the uninterrupted one does.
    set_optimizer_state_dict(model, optimizer, osd, options=StateDictOptions(full_state_dict=True, strict=False))
    for param, its_names in names.items():
        if not its_names & saved:
            optimizer.state.pop(param, None)


def _names_of_parameters(model: nn.Module) -> dict[nn.Parameter, set[str]]:
    """Each parameter with every name it has (a module shared by several parents has several), spelled as the
    optimizer's state dict spells them (torch's own ``_get_fqns``: no DDP ``module.``, no ``_orig_mod.``)."""
    from torch.distributed.checkpoint.state_dict import _get_fqns

    names: dict[nn.Parameter, set[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(param, set()).update(_get_fqns(model, name))
    return names
