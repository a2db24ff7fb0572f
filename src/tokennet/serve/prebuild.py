"""Build a run's compiled decoding steps in a process of their own, at the lowest CPU priority.

Compiling a decoding step is minutes of Python tracing and C++ compiling. Done in the process that is decoding —
the server's background thread until now — it takes the interpreter's lock and both cores from the steps it
should speed up: the eager steps served meanwhile ran at a sixth of their own speed. Here the compilation runs in
a separate process under ``nice 19`` with one compiler worker, so the process that decodes keeps its cores (the
kernel gives a nice-19 process a share of ~1/70 against a normal one) and its interpreter, and loads the finished
steps from the step store (:mod:`tokennet.step_store`).

- ``tokennet serve`` starts one for the batched step (:class:`~tokennet.serve.engine.RowsStep`) when the store has
  none, answers requests eagerly meanwhile, and switches to the compiled step once it is built
  (:meth:`~tokennet.serve.engine.Engine.warm_up_in_background`).
- ``tokennet generate`` starts one for the one-row step when its own call did not repay a compilation
  (:class:`~tokennet.sampling.CompilePlan`), so the next ``generate`` of the run decodes compiled from its first
  token.

One builder at a time per step: a lock file beside the step, holding the builder's process id (a stale one, whose
process is gone, is taken over). The builder's output goes to ``<step>.log`` in the store.

    python -m tokennet.serve.prebuild RUN --kind rows|one --quantize MODE --threads N
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from .. import step_store

__all__ = ["spawn", "main", "KINDS"]

log = logging.getLogger(__name__)

KINDS = ("one", "rows")  # one: generate's one-row step (CompiledStep, B1); rows: the server's (RowsStep, B1 and Bn)


def _lock_path(artifact: step_store.Artifact) -> Path:
    return artifact.path.with_suffix(".building")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _take_lock(lock: Path) -> bool:
    """Create ``lock`` for a new builder; False while another builder's process holds it."""
    lock.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    for _ in range(2):
        try:
            descriptor = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            try:
                pid = int(lock.read_text().strip() or 0)
                fresh = time.time() - lock.stat().st_mtime < 60
            except (OSError, ValueError):
                pid, fresh = 0, False
            if (pid and _alive(pid)) or (not pid and fresh):  # a live builder, or one being started
                return False
            lock.unlink(missing_ok=True)  # its builder is gone: take it over
            continue
        with os.fdopen(descriptor, "w") as stream:
            stream.write(f"{os.getpid()}\n")  # the starter's until the builder's own is written
        return True
    return False


def spawn(run_dir: str | Path, kind: str, quantize: str, artifact: step_store.Artifact) -> subprocess.Popen | None:
    """Start a builder of ``artifact`` (the step of ``kind`` of the run in ``run_dir``, with the decoding copy of
    ``quantize`` and this process's CPU threads) at nice 19; None when one is already building it. The builder
    outlives this process (a new session): a ``generate`` that started it may exit first."""
    lock = _lock_path(artifact)
    if not _take_lock(lock):
        return None
    env = dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS="1", TOKENNET_COMPILE="1")
    argv = [sys.executable, "-m", "tokennet.serve.prebuild", str(Path(run_dir).resolve()), "--kind", kind,
            "--quantize", quantize, "--threads", str(torch.get_num_threads()), "--lock", str(lock)]
    out = open(artifact.path.with_suffix(".log"), "w")  # noqa: SIM115 - the child keeps it
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                 start_new_session=True)
    except OSError:
        lock.unlink(missing_ok=True)
        raise
    finally:
        out.close()
    lock.write_text(f"{child.pid}\n")
    return child


def _build_one(run, quantize: str) -> None:
    from ..layers import quantize as quantization
    from ..sampling import VerifyStep, compiled_step, measure_speedup

    net = quantization.decoding_copy(run.model, quantization.resolve_mode(run.model, quantize))
    step = compiled_step(net)
    caches = net.make_caches(min(16, net.config.block_size))
    with torch.inference_mode():
        net.forward_features(torch.zeros(1, 1, dtype=torch.long, device=run.device), caches=caches)
        if step(torch.zeros(1, 1, dtype=torch.long, device=run.device), caches) is None or not step.compiled:
            raise SystemExit("the decoding step does not compile here")
        log.info("the compiled step decodes %.2fx as fast as the eager one here", measure_speedup(net, step))
        # speculative decoding's verification forward, kept beside it (generate --speculative loads it)
        if compiled_step(net, VerifyStep)(torch.zeros(1, 3, dtype=torch.long, device=run.device), caches) is None:
            log.warning("the verification forward does not compile here: speculative decoding verifies eagerly")


def _build_rows(run, quantize: str) -> None:
    from .engine import Engine

    engine = Engine(run.model, run.tokenizer, max_batch=2, context=min(32, run.model.config.block_size),
                    quantize=quantize, prefix_cache_mb=0, compile=True)
    if engine.warm_up() is None:
        raise SystemExit("the batched decoding step does not compile here")


def _lower_priority(niceness: int) -> None:
    """Run at ``niceness``. Linux schedules a session's processes as one group first (autogroups: each session
    shares the CPU equally with every other), so the builder — a session of its own — lowers its group's
    niceness too; without that, nice 19 would only rank it within its own session."""
    os.nice(niceness)
    try:
        with open("/proc/self/autogroup", "w") as autogroup:
            autogroup.write(str(niceness))
    except OSError:  # no autogroups here: the process's niceness is what counts
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tokennet.serve.prebuild", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--kind", choices=KINDS, required=True)
    parser.add_argument("--quantize", default="auto")
    parser.add_argument("--threads", type=int, required=True, help="the CPU threads the kernels are generated for")
    parser.add_argument("--lock", help="the lock file to remove when done")
    parser.add_argument("--nice", type=int, default=19, help="the niceness to run at (default 19, the lowest priority)")
    args = parser.parse_args(argv)
    _lower_priority(args.nice)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        from ..run import load

        torch.set_num_threads(args.threads)  # Inductor writes the thread count into the kernels it generates
        run = load(args.run_dir)
        (_build_one if args.kind == "one" else _build_rows)(run, args.quantize)
        log.info("built the %s decoding step of %s", args.kind, args.run_dir)
        return 0
    finally:
        if args.lock:
            Path(args.lock).unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main())
