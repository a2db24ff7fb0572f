"""Crash-safe training checkpoints: safetensors for tensors, JSON for the rest, atomic renames.

A checkpoint is a directory ``checkpoints/step-000123/`` holding

- ``model.safetensors``: the full (unsharded) weights;
- ``state.safetensors``: optimizer moments and every rank's torch RNG state;
- ``trainer.json``: step, optimizer hyper-parameters, Python/NumPy RNG states, data position, config.

It is written under a temporary name, every file is fsynced, and the directory is renamed into place;
only then is the ``latest`` pointer replaced (also by rename). A crash at any moment therefore leaves
either the previous checkpoint or the new one, never half of one. The last ``keep`` are kept.
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
from ..fileio import safetensors_write, sha256_file

__all__ = ["save_checkpoint", "read_checkpoint", "latest_checkpoint", "capture_rng", "restore_rng", "Checkpoint"]

LATEST = "latest"


def _fsync(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems cannot fsync a directory; the rename is still atomic
        pass
    finally:
        os.close(fd)


def capture_rng() -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """This process's RNG states: Python and NumPy as JSON, torch (and CUDA) as tensors."""
    py = random.getstate()
    st = np.random.get_state()
    js = {"python": [py[0], list(py[1]), py[2]],
          "numpy": [st[0], st[1].tolist(), int(st[2]), int(st[3]), float(st[4])]}
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda/{i}"] = s
    return js, tensors


def restore_rng(js: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    py = js["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = js["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))
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
    from safetensors.torch import save_file

    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        weights, aliases = _dedup(model_state)
        with safetensors_write(tmp / "model.safetensors"):
            save_file(weights, str(tmp / "model.safetensors"))
        tensors, scalars = {}, {}
        for pname, st in optim_state["state"].items():
            for k, v in st.items():
                if torch.is_tensor(v):
                    tensors[f"optim/{pname}/{k}"] = v.detach().cpu().contiguous()
                else:
                    scalars.setdefault(pname, {})[k] = v
        for r, (_, rt) in enumerate(rng):
            for k, v in rt.items():
                tensors[f"rng/{r}/{k}"] = v
        with safetensors_write(tmp / "state.safetensors"):
            save_file(tensors, str(tmp / "state.safetensors"))
        meta = {"step": step, "aliases": aliases,
                "sha256": {f: sha256_file(tmp / f) for f in ("model.safetensors", "state.safetensors")},
                "optimizer": {"param_groups": optim_state["param_groups"], "scalars": scalars},
                "rng": [js for js, _ in rng], **trainer_state}
        (tmp / "trainer.json").write_text(json.dumps(meta))
        for f in tmp.iterdir():
            _fsync(f)
        _fsync(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed write (full disk, kill) leaves no partial checkpoint
        raise
    if final.exists():
        _remove(final)
    tmp.rename(final)
    _fsync(root)
    ptr = root / f".{LATEST}.tmp"
    ptr.write_text(final.name + "\n")
    _fsync(ptr)
    ptr.replace(root / LATEST)
    _fsync(root)
    steps = sorted(p for p in root.glob("step-*") if p.is_dir())
    for old in steps[:-keep] if keep > 0 else []:
        if old != final:
            _remove(old)
    for stale in [*root.glob(".tmp-step-*"), *root.glob(".del-step-*")]:  # left by a crash mid-write/-delete
        shutil.rmtree(stale, ignore_errors=True)
    return final


def _remove(path: Path) -> None:
    """Delete a checkpoint directory without ever leaving half of it under its own name.

    ``rmtree`` unlinks file by file, so a kill in the middle would leave ``step-N`` without some of its
    files; renaming it out of the way first (atomic) means ``step-N`` is either whole or gone. A kill
    after the rename leaves a ``.del-step-*`` directory, removed by the next save.
    """
    trash = path.with_name(f".del-{path.name}-{os.getpid()}")
    try:
        path.rename(trash)
    except OSError:
        return
    shutil.rmtree(trash, ignore_errors=True)


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
        for f, digest in meta.get("sha256", {}).items():
            if sha256_file(path / f) != digest:
                raise RunError(f"checkpoint {path}: {f} does not match its recorded checksum (modified or truncated)")
        weights = load_file(str(path / "model.safetensors"))
        tensors = load_file(str(path / "state.safetensors"))
    except (OSError, SafetensorError, RuntimeError, json.JSONDecodeError, UnicodeDecodeError,
            jsonio.JSONTooDeep) as e:
        raise RunError(f"checkpoint {path} is unreadable: {str(e).splitlines()[0]}") from None
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
                r, k = rest.split("/", 1)
                rng_t.setdefault(int(r), {})[k] = t
        for pname, sc in meta["optimizer"]["scalars"].items():
            state.setdefault(pname, {}).update(sc)
        rng = [(js, rng_t.get(r, {})) for r, js in enumerate(meta["rng"])]
        optim = {"state": state, "param_groups": meta["optimizer"]["param_groups"]}
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise RunError(f"checkpoint {path} is damaged: trainer.json and state.safetensors do not have the "
                       f"expected form ({type(e).__name__}: {e})") from None
    return Checkpoint(path, weights, optim, meta, rng)
