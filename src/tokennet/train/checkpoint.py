"""Crash-safe training checkpoints: safetensors for tensors, JSON for the rest, atomic renames.

A checkpoint is a directory ``checkpoints/step-000123/`` holding

- ``model.safetensors``: the weights;
- ``state.safetensors``: optimizer moments and the torch RNG state;
- ``trainer.json``: step, optimizer hyper-parameters, Python/NumPy RNG states, data position, config.

It is written under a temporary name, every file is fsynced, and the directory is renamed into place;
only then is the ``latest`` pointer replaced (also by rename). A crash at any moment therefore leaves
either the previous checkpoint or the new one, never half of one. The last ``keep`` are kept.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = ["save_checkpoint", "load_checkpoint", "latest_checkpoint", "capture_rng", "restore_rng"]

LATEST = "latest"


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        _fsync_file(path)
    except OSError:  # some filesystems cannot fsync a directory; the rename is still atomic
        pass


def capture_rng() -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """RNG states: Python and NumPy as JSON, torch (and CUDA) as tensors."""
    py = random.getstate()
    np_state = np.random.get_state()
    js = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
    }
    tensors = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = s
    return js, tensors


def restore_rng(js: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    py = js["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = js["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    torch.set_rng_state(tensors["rng.torch"])
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("rng.cuda.")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


def _optimizer_tensors(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    sd = opt.state_dict()
    tensors, scalars = {}, {}
    for pid, st in sd["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"optim.{pid}.{k}"] = v.detach().cpu().contiguous()
            else:
                scalars[f"{pid}.{k}"] = v
    groups = [{k: v for k, v in g.items()} for g in sd["param_groups"]]
    return tensors, {"param_groups": groups, "scalars": scalars}


def _optimizer_state_dict(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for name, t in tensors.items():
        if name.startswith("optim."):
            _, pid, k = name.split(".", 2)
            state.setdefault(int(pid), {})[k] = t
    for name, v in meta["scalars"].items():
        pid, k = name.split(".", 1)
        state.setdefault(int(pid), {})[k] = v
    return {"state": state, "param_groups": meta["param_groups"]}


def save_checkpoint(
    directory: str | Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    trainer_state: dict[str, Any],
    *,
    keep: int = 2,
) -> Path:
    """Write ``directory/step-{step:06d}`` atomically, point ``latest`` at it, prune to ``keep``."""
    from safetensors.torch import save_file, save_model

    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_model(model, str(tmp / "model.safetensors"))
    opt_tensors, opt_meta = _optimizer_tensors(optimizer)
    rng_js, rng_tensors = capture_rng()
    save_file({**opt_tensors, **rng_tensors}, str(tmp / "state.safetensors"))
    meta = {"step": step, "optimizer": opt_meta, "rng": rng_js, **trainer_state}
    (tmp / "trainer.json").write_text(json.dumps(meta))
    for f in tmp.iterdir():
        _fsync_file(f)
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    _fsync_dir(root)
    ptr = root / f".{LATEST}.tmp"
    ptr.write_text(final.name + "\n")
    _fsync_file(ptr)
    ptr.replace(root / LATEST)
    _fsync_dir(root)
    steps = sorted(p for p in root.glob("step-*") if p.is_dir())
    for old in steps[:-keep] if keep > 0 else []:
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp-step-*"):  # left by a crash mid-write
        shutil.rmtree(stale, ignore_errors=True)
    return final


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The checkpoint that ``latest`` points to, or None when there is none."""
    root = Path(directory)
    ptr = root / LATEST
    if not ptr.is_file():
        return None
    path = root / ptr.read_text().strip()
    if not (path / "trainer.json").is_file():
        raise ValueError(f"{ptr} points to {path.name}, which is not a complete checkpoint")
    return path


def load_checkpoint(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    *, restore_rng_state: bool = True) -> dict[str, Any]:
    """Load a checkpoint into ``model`` (and ``optimizer``); restore RNGs; return its trainer state."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file, load_model

    path = Path(path)
    try:
        meta = json.loads((path / "trainer.json").read_text())
        missing, unexpected = load_model(model, str(path / "model.safetensors"), strict=False)
        tensors = load_file(str(path / "state.safetensors"))
    except (OSError, SafetensorError, RuntimeError, json.JSONDecodeError) as e:
        raise ValueError(f"checkpoint {path} is unreadable: {str(e).splitlines()[0]}") from None
    if missing or unexpected:
        what = f"missing {sorted(missing)[0]!r}" if missing else f"unexpected {sorted(unexpected)[0]!r}"
        raise ValueError(f"checkpoint {path} does not match the model: {what}")
    if optimizer is not None:
        optimizer.load_state_dict(_optimizer_state_dict(tensors, meta["optimizer"]))
    if restore_rng_state:
        restore_rng(meta["rng"], tensors)
    return meta
