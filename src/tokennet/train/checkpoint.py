"""Crash-safe training checkpoints: safetensors for tensors, JSON for the rest, atomic renames.

A checkpoint is a directory ``checkpoints/step-000123/`` holding

- ``model.safetensors``: the full (unsharded) weights;
- ``state.safetensors``: optimizer moments and every rank's torch RNG state;
- ``trainer.json``: step, optimizer hyper-parameters, Python/NumPy RNG states, data position, config.

It is written under a temporary name, every file is fsynced, and the directory is renamed into place
(:func:`~tokennet.fileio.atomic_directory`); only then is the ``latest`` pointer replaced (also by rename,
:func:`~tokennet.fileio.atomic_write_text`). A crash at any moment therefore leaves either the previous checkpoint
or the new one, never half of one. The last ``keep`` are kept; an older one is moved aside before it is deleted
(:func:`~tokennet.fileio.remove_aside`), so no ``step-N`` is ever missing some of its files.
Nothing here unpickles: a checkpoint cannot run code when loaded.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import jsonio
from ..errors import RunError
from ..fileio import (
    atomic_directory,
    atomic_write_text,
    fsync_path,
    remove_aside,
    safetensors_write,
    sha256_file,
    sweep_stale_temps,
)

__all__ = ["save_checkpoint", "read_checkpoint", "latest_checkpoint", "capture_rng", "restore_rng", "Checkpoint"]

LATEST = "latest"


def capture_rng() -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """This process's RNG states: Python and NumPy as JSON, torch (and CUDA) as tensors."""
    version, internal, gauss_next = random.getstate()
    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    json_state = {"python": [version, list(internal), gauss_next],
                  "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached_gaussian)]}
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, cuda_state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda/{i}"] = cuda_state
    return json_state, tensors


def restore_rng(js: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    python_state = js["python"]  # indexed, not unpacked: a damaged state fails as it always did
    random.setstate((python_state[0], tuple(python_state[1]), python_state[2]))
    numpy_state = js["numpy"]
    np.random.set_state((numpy_state[0], np.array(numpy_state[1], dtype=np.uint32), numpy_state[2],
                         numpy_state[3], numpy_state[4]))
    torch.set_rng_state(tensors["torch"])
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("cuda/")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


def _dedup(sd: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Drop names that alias an earlier tensor (tied weights); safetensors stores each tensor once."""
    seen: dict[tuple, str] = {}
    unique, aliases = {}, {}
    for name, t in sd.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype) if t.numel() else None
        if key is not None and key in seen:
            aliases[name] = seen[key]
        else:
            if key is not None:
                seen[key] = name
            unique[name] = t.detach().cpu().contiguous()
    return unique, aliases


def save_checkpoint(
    directory: str | Path,
    step: int,
    model_state: dict[str, torch.Tensor],
    optim_state: dict[str, Any],
    trainer_state: dict[str, Any],
    rng: list[tuple[dict[str, Any], dict[str, torch.Tensor]]],
    *,
    keep: int = 2,
) -> Path:
    """Write ``directory/step-{step:06d}`` atomically, point ``latest`` at it, keep the last ``keep``.

    Args:
        model_state: full model state dict (parameter name → tensor).
        optim_state: full optimizer state dict keyed by parameter name (``get_optimizer_state_dict``).
        trainer_state: JSON-serializable trainer state (elapsed time, data position, config...).
        rng: one ``capture_rng()`` per rank.
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    with atomic_directory(final) as tmp:  # a failed write (full disk, kill) leaves no partial checkpoint
        _write_checkpoint(tmp, step, model_state, optim_state, trainer_state, rng)
    atomic_write_text(root / LATEST, final.name + "\n")
    fsync_path(root)
    steps = sorted(path for path in root.glob("step-*") if path.is_dir())
    for old in steps[:-keep] if keep > 0 else []:
        if old != final:
            remove_aside(old, trash=old.with_name(f".del-{old.name}-{os.getpid()}"))
    for stale in [*root.glob(".tmp-step-*"), *root.glob(".del-step-*")]:  # left by a crash mid-write/-delete
        shutil.rmtree(stale, ignore_errors=True)
    for name in {stale.name[1:].split(".")[0] for stale in root.glob(".step-*.*")}:  # a killed writer's temporaries
        sweep_stale_temps(root / name)
    return final


def _write_checkpoint(directory: Path, step: int, model_state: dict[str, torch.Tensor], optim_state: dict[str, Any],
                      trainer_state: dict[str, Any], rng: list[tuple[dict[str, Any], dict[str, torch.Tensor]]]) -> None:
    """The checkpoint's three files in ``directory`` (:func:`save_checkpoint` puts it in place)."""
    from safetensors.torch import save_file

    weights, aliases = _dedup(model_state)
    with safetensors_write(directory / "model.safetensors"):
        save_file(weights, str(directory / "model.safetensors"))
    tensors, scalars = {}, {}
    for pname, param_state in optim_state["state"].items():
        for key, value in param_state.items():
            if torch.is_tensor(value):
                tensors[f"optim/{pname}/{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(pname, {})[key] = value
    for rank, (_, rank_tensors) in enumerate(rng):
        for key, value in rank_tensors.items():
            tensors[f"rng/{rank}/{key}"] = value
    with safetensors_write(directory / "state.safetensors"):
        save_file(tensors, str(directory / "state.safetensors"))
    meta = {"step": step, "aliases": aliases,
            "sha256": {name: sha256_file(directory / name) for name in ("model.safetensors", "state.safetensors")},
            "optimizer": {"param_groups": optim_state["param_groups"], "scalars": scalars},
            "rng": [rank_json for rank_json, _ in rng], **trainer_state}
    (directory / "trainer.json").write_text(json.dumps(meta))


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The checkpoint that ``latest`` points to, or None when there is none."""
    root = Path(directory)
    ptr = root / LATEST
    if not ptr.is_file():
        return None
    path = root / ptr.read_text().strip()
    if not (path / "trainer.json").is_file():
        raise RunError(f"{ptr} points to {path.name}, which is not a complete checkpoint")
    return path


@dataclass
class Checkpoint:
    """A checkpoint read back: full model/optimizer state dicts, trainer metadata, per-rank RNG."""

    path: Path
    model_state: dict[str, torch.Tensor]
    optim_state: dict[str, Any]
    meta: dict[str, Any]
    rng: list[tuple[dict[str, Any], dict[str, torch.Tensor]]]

    @property
    def step(self) -> int:
        return self.meta["step"]


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Read a checkpoint directory; a truncated or tampered file gives a one-line :class:`RunError`."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    try:
        meta = jsonio.load(path / "trainer.json")
        if not isinstance(meta, dict) or not {"step", "optimizer", "rng"} <= meta.keys():
            raise RunError(f"checkpoint {path} is damaged: its trainer.json is not a tokennet checkpoint record")
        for file_name, digest in meta.get("sha256", {}).items():
            if sha256_file(path / file_name) != digest:
                raise RunError(f"checkpoint {path}: {file_name} does not match its recorded checksum "
                               "(modified or truncated)")
        weights = load_file(str(path / "model.safetensors"))
        tensors = load_file(str(path / "state.safetensors"))
    except (OSError, SafetensorError, RuntimeError, json.JSONDecodeError, UnicodeDecodeError,
            jsonio.JSONTooDeep) as error:
        raise RunError(f"checkpoint {path} is unreadable: {str(error).splitlines()[0]}") from None
    try:
        for alias, name in meta.get("aliases", {}).items():
            weights[alias] = weights[name]
        state: dict[str, dict[str, Any]] = {}
        rng_t: dict[int, dict[str, torch.Tensor]] = {}
        for name, t in tensors.items():
            kind, rest = name.split("/", 1)
            if kind == "optim":
                pname, k = rest.rsplit("/", 1)
                state.setdefault(pname, {})[k] = t
            elif kind == "rng":
                rank, k = rest.split("/", 1)
                rng_t.setdefault(int(rank), {})[k] = t
        for pname, scalars in meta["optimizer"]["scalars"].items():
            state.setdefault(pname, {}).update(scalars)
        rng = [(rank_json, rng_t.get(rank, {})) for rank, rank_json in enumerate(meta["rng"])]
        optim = {"state": state, "param_groups": meta["optimizer"]["param_groups"]}
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise RunError(f"checkpoint {path} is damaged: trainer.json and state.safetensors do not have the "
                       f"expected form ({type(error).__name__}: {error})") from None
    return Checkpoint(path, weights, optim, meta, rng)
