"""Compiled decoding steps kept on disk, per machine and per run: a later process loads its step instead of compiling.

``torch.compile`` keeps what it generates across processes (Inductor's code, AOTAutograd's graphs), but a new
process still traces the step with Dynamo before it can look those up: 13–17 s for SmolLM2's 30 layers with the
caches warm. PyTorch's ahead-of-time precompile (``torch.compile(...).aot_compile``) captures the whole step once —
its bytecode, guards and compiled graph — into one file that ``torch.compiler.load_compiled_function`` loads
without tracing anything. This module keeps those files::

    $TOKENNET_CACHE/steps/<key>.step    the serialized step (a pickle: loading one runs code)
    $TOKENNET_CACHE/steps/<key>.json    what it was built for, and the step file's sha256

``<key>`` names the step's kind and variant (its batch size), the model's structure (configuration, layer kinds,
tensor shapes and dtypes) and the CPU threads its kernels were generated for (Inductor writes the thread count
into its loops). A file is loaded only when its record says it was built here, for this model:

- the same torch, Python and tokennet source, and the same CPU instruction set (``torch``'s CPU capability and
  the processor's flags) — otherwise it is rebuilt, and one line on stderr says why;
- the same weights (a digest of a sample of every tensor's values: a changed run, or another run of the same
  architecture, rebuilds it; the graph itself reads the weights at every call);
- the step file's bytes hash to the recorded sha256, and both files belong to this user and are writable by no
  one else: a truncated, damaged or foreign file is never unpickled, it is rebuilt.

The weights are not in the file: a loaded step reads them from the decoding copy it is called with. Dynamo's guards
do not survive serialization whole (a dynamic dimension's marking is lost), so a loaded step checks its inputs'
dtypes and static sizes itself (:func:`input_spec`) and is rebuilt if they differ (:class:`StepMismatch`).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .fileio import atomic_write_text

__all__ = ["store_dir", "Artifact", "machine_record", "model_digests", "serializable_guards", "input_spec",
           "StepMismatch", "FORMAT"]

logger = logging.getLogger(__name__)

FORMAT = 1  # the record's layout; a record of another format is rebuilt


def store_dir() -> Path:
    """``$TOKENNET_CACHE/steps``, or ``~/.cache/tokennet/steps``."""
    root = os.environ.get("TOKENNET_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tokennet")
    return Path(root) / "steps"


_SOURCE_DIGEST: str | None = None


def _source_digest() -> str:
    """A digest of tokennet's own Python source: a changed tokennet traces another step."""
    global _SOURCE_DIGEST
    if _SOURCE_DIGEST is None:
        digest = hashlib.sha256()
        package = Path(__file__).resolve().parent
        for path in sorted(package.rglob("*.py")):
            digest.update(str(path.relative_to(package)).encode())
            digest.update(path.read_bytes())
        _SOURCE_DIGEST = digest.hexdigest()[:16]
    return _SOURCE_DIGEST


def _cpu_flags() -> str:
    """The processor's instruction-set flags (Linux's /proc/cpuinfo), hashed; the platform's name elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    flags = " ".join(sorted(line.split(":", 1)[1].split()))
                    return hashlib.sha256(flags.encode()).hexdigest()[:16]
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_record() -> dict[str, Any]:
    """What a step's generated code depends on besides the model: versions, the instruction set, the threads."""
    return {"torch": torch.__version__, "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
            "tokennet": _source_digest(), "cpu": torch.backends.cpu.get_cpu_capability(), "cpu_flags": _cpu_flags(),
            "machine": platform.machine(), "threads": torch.get_num_threads()}


def model_digests(net: nn.Module) -> tuple[str, str]:
    """``(structure, weights)``: a digest of the model's class, configuration and tensors' names, shapes and dtypes,
    and one of a sample of every tensor's values (16 evenly spaced elements each: a changed run changes it)."""
    structure, weights = hashlib.sha256(), hashlib.sha256()
    config = getattr(net, "config", None)
    described = json.dumps(config.to_dict(), sort_keys=True, default=str) if hasattr(config, "to_dict") else ""
    kinds = sorted({type(m).__name__ for m in net.modules()})
    structure.update(f"{type(net).__name__}|{described}|{kinds}".encode())
    seen: set[int] = set()
    for name, tensor in [*net.named_parameters(remove_duplicate=False), *net.named_buffers(remove_duplicate=False)]:
        structure.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        if id(tensor) in seen or tensor.numel() == 0 or tensor.device.type == "meta":
            continue
        seen.add(id(tensor))
        flat = tensor.detach().reshape(-1)
        count = min(16, flat.numel())
        picks = torch.arange(count) * (flat.numel() - 1) // max(count - 1, 1)
        weights.update(flat[picks].cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return structure.hexdigest()[:20], weights.hexdigest()[:20]


def serializable_guards(entries) -> list[bool]:
    """Dynamo's guard filter for a step that is saved: no guard on the model's modules (its copy never changes
    under the step, :func:`torch.compiler.skip_guard_on_all_nn_modules_unsafe`), none on globals, and none of the
    kinds Dynamo cannot serialize."""
    from torch._dynamo.guards import CheckFunctionManager

    unsupported = set(CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES)
    return [not (entry.orig_guard.source.is_unspecialized_nn_module() or entry.is_global
                 or entry.guard_type in unsupported) for entry in entries]


class StepMismatch(ValueError):
    """A loaded step was called with inputs of another form than it was built for (it is then rebuilt)."""


def input_spec(args: tuple) -> list:
    """The form of a step's tensor inputs, in order: dtype and shape, ``None`` at the dimensions marked dynamic
    (``torch._dynamo.mark_dynamic``). Dynamo's own guards are not checked on a loaded step (they do not survive
    serialization whole in this torch), so this is what a loaded step checks at every call instead (~1 µs a tensor)."""
    spec = []
    for arg in _tensors(args):
        dynamic = getattr(arg, "_dynamo_dynamic_indices", set())
        shape = [None if dim in dynamic else size for dim, size in enumerate(arg.shape)]
        spec.append([str(arg.dtype).removeprefix("torch."), shape])
    return spec


def _tensors(args) -> list[torch.Tensor]:
    out = []
    for arg in args:
        if isinstance(arg, torch.Tensor):
            out.append(arg)
        elif isinstance(arg, (list, tuple)):
            out.extend(_tensors(arg))
    return out


class _Checked:
    """A loaded step that checks its inputs' form (:func:`input_spec`) before running."""

    def __init__(self, fn: Callable, spec: list):
        self.fn, self.spec = fn, [(getattr(torch, dtype), shape) for dtype, shape in spec]

    def __call__(self, step, *args):
        tensors = _tensors(args)
        if len(tensors) != len(self.spec):
            raise StepMismatch(f"{len(tensors)} input tensors, built for {len(self.spec)}")
        for tensor, (dtype, shape) in zip(tensors, self.spec):
            if tensor.dtype != dtype or tensor.dim() != len(shape) or any(
                    n is not None and n != m for n, m in zip(shape, tensor.shape)):
                raise StepMismatch(f"an input of {tensor.dtype} {tuple(tensor.shape)}, built for {dtype} {shape}")
        return self.fn(step, *args)


class Artifact:
    """One step's file and record: :meth:`load` it if it may be, :meth:`build` and save it otherwise.

    Args:
        kind: the step's class name (``CompiledStep``, the server's ``RowsStep``).
        variant: what else picks the graph (e.g. ``B1``: one row; ``Bn``: a symbolic number of rows).
        net: the decoding copy the step runs.
    """

    def __init__(self, kind: str, variant: str, net: nn.Module, root: Path | None = None):
        self.structure, self.weights = model_digests(net)
        self.machine = machine_record()
        key = hashlib.sha256(json.dumps([kind, variant, self.structure, self.machine["threads"]]).encode())
        self.name = f"{kind}-{variant}-{key.hexdigest()[:16]}"
        self.root = store_dir() if root is None else root
        self.path, self.record_path = self.root / f"{self.name}.step", self.root / f"{self.name}.json"
        self.why_not: str | None = None  # why the last load did not load (None: it did, or nothing was there)

    def _stale(self, record: dict) -> str | None:
        """Why a record does not fit this process (None: it fits)."""
        if record.get("format") != FORMAT:
            return "it was written by another version of tokennet's step store"
        built = record.get("machine", {})
        for field, what in (("torch", "torch"), ("python", "Python"), ("tokennet", "tokennet source"),
                            ("cpu", "instruction set"), ("cpu_flags", "processor"), ("machine", "machine")):
            if built.get(field) != self.machine[field]:
                return f"it was built for another {what} ({built.get(field)}; here {self.machine[field]})"
        if record.get("structure") != self.structure or built.get("threads") != self.machine["threads"]:
            return "it was built for another model or thread count"
        if record.get("weights") != self.weights:
            return "the run's weights changed since it was built (or another run of this architecture built it)"
        return None

    def _trusted(self, path: Path) -> str | None:
        """Why ``path`` may not be read as a step (None: it may): it must be ours and writable by no one else."""
        info = path.stat()
        if hasattr(os, "getuid") and info.st_uid != os.getuid():
            return f"{path} belongs to another user"
        if info.st_mode & 0o022:
            return f"{path} is writable by others"
        return None

    def present(self) -> bool:
        """Whether a record that fits this process is there (the step file is checked only by :meth:`load`)."""
        try:
            record = json.loads(self.record_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        return isinstance(record, dict) and self._stale(record) is None

    def load(self, f_globals: dict | None = None) -> Callable | None:
        """The saved step, or None (nothing saved; or stale or damaged: :attr:`why_not` says why, and one line on
        stderr)."""
        self.why_not = None
        if not self.record_path.exists() and not self.path.exists():
            return None
        try:
            why = self._trusted(self.record_path) or self._trusted(self.path)
            record = json.loads(self.record_path.read_text(encoding="utf-8"))
            why = why or (None if isinstance(record, dict) else "its record is not a JSON object")
            why = why or self._stale(record)
            data = None if why else self.path.read_bytes()
            if data is not None and hashlib.sha256(data).hexdigest() != record.get("sha256"):
                why = "the file is damaged (its bytes do not match its record)"
            if why is None and not isinstance(record.get("inputs"), list):
                why = "its record does not say what inputs it takes"
            if why is None:
                loaded = torch.compiler.load_compiled_function(io.BytesIO(data), f_globals=f_globals)
                loaded.disable_guard_check()
                return _Checked(loaded, record["inputs"])
        except (OSError, ValueError) as error:
            why = f"it could not be read ({error})"
        except Exception as error:  # noqa: BLE001 - a file that passed every check but does not load: rebuilt
            why = f"it did not load ({type(error).__name__}: {str(error)[:120]})"
        self.why_not = why
        print(f"tokennet: rebuilding the compiled decoding step {self.path.name}: {why}", file=sys.stderr, flush=True)
        return None

    def build(self, method: Callable, args: tuple, options: dict) -> tuple[Callable, float]:
        """Compile ``method`` (a step's bound ``_step``) ahead of time for ``args``, save it, and return it with the
        seconds the compilation took. Raises what the compilation raises."""
        started = time.perf_counter()
        compiled = torch.compile(method, fullgraph=True, dynamic=False,
                                 options={**options, "guard_filter_fn": serializable_guards})
        with torch._dynamo.config.patch(enable_aot_compile=True):
            built = compiled.aot_compile((args, {}))
        took = time.perf_counter() - started
        try:
            self._save(built, took, input_spec(args))
        except Exception as error:  # noqa: BLE001 - a read-only cache, or a step that does not serialize: kept
            # for this process only
            logger.info("the compiled decoding step was not kept for later processes (%s: %s)", type(error).__name__,
                        str(error)[:200])
        return built, took

    def _save(self, built, took: float, inputs: list) -> None:
        data = type(built).serialize(built).serialized_data
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as stream:
            stream.write(data)
        os.replace(tmp, self.path)
        record = {"format": FORMAT, "machine": self.machine, "structure": self.structure, "weights": self.weights,
                  "sha256": hashlib.sha256(data).hexdigest(), "compile_s": round(took, 2), "bytes": len(data),
                  "inputs": inputs}
        atomic_write_text(self.record_path, json.dumps(record, indent=1) + "\n")
        os.chmod(self.record_path, 0o600)
