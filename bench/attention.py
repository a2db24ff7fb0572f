"""Attention backends side by side: median time and extra peak memory, forward and forward+backward.

Shapes follow the reference figures in BASELINES.md: batch 1, 8 heads, head width 64, float32, for
each sequence length N, causal and not. Every cell (backend, N, causal, pass) runs in a fresh
subprocess, so its peak memory is its own:

- CPU: peak RSS (``getrusage(RUSAGE_SELF).ru_maxrss``) minus the RSS just before the first call;
- CUDA: ``torch.cuda.max_memory_allocated()`` minus the memory allocated before the first call.

The first call is a warm-up (it counts for memory, not for time); the time is the median over
``--repeats`` further calls. Backends:

- ``math``: ``attention(..., backend="math")``, the materialized ``softmax(Q Kᵀ/√E) V``;
- ``sdpa``: ``attention(..., backend="sdpa")``, PyTorch's fused kernel;
- ``flash``: ``flash_attention(..., is_causal=causal)``, tokennet's tiled online softmax, called directly
  so the causal case skips the tiles above the diagonal.

Usage::

    python bench/attention.py --quick                        # small sizes: checks that it works
    python bench/attention.py --sizes 256 1024 4096 8192     # the full sweep, on an idle machine

CPU PyTorch on few cores slows down many times when anything else runs: benchmark on an idle machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/_record.py, also when a test loads this file
from _record import write  # noqa: E402

BATCH, HEADS, HEAD_DIM = 1, 8, 64
PASSES = ("fwd", "fwd+bwd")
MiB = 2**20


# ----------------------------------------------------------------------------------------- one cell


def _rss_bytes() -> int:
    """Current resident set size of this process."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # no /proc: fall back to the peak so far, which is an upper bound
        return _peak_rss_bytes()


def _peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def run_cell(
    backend: str,
    n: int,
    causal: bool,
    pass_: str,
    repeats: int,
    device: str,
    max_seconds: float,
    threads=None,
):
    """Time one cell in this process and return its record (a dict)."""
    import torch

    if threads:
        torch.set_num_threads(threads)

    from tokennet.attention.flash import flash_attention
    from tokennet.attention.functional import attention

    dev = torch.device(device)
    cuda = dev.type == "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    shape = (BATCH, HEADS, n, HEAD_DIM)
    backward = pass_ == "fwd+bwd"
    q, k, v = (torch.randn(shape, generator=g, device=dev).requires_grad_(backward) for _ in range(3))
    grad_out = torch.randn(shape, generator=g, device=dev) if backward else None

    if backend == "flash":

        def forward():
            return flash_attention(q, k, v, is_causal=causal)
    else:

        def forward():
            return attention(q, k, v, is_causal=causal, backend=backend)

    def call():
        if not backward:
            with torch.no_grad():
                forward()
            return
        forward().backward(grad_out)
        q.grad = k.grad = v.grad = None

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
        before = torch.cuda.memory_allocated(dev)
    else:
        before = _rss_bytes()

    t0 = time.perf_counter()
    call()  # warm-up
    sync()
    first = time.perf_counter() - t0
    # Fit the repeats into the time limit; at least one timed call after the warm-up.
    repeats_run = max(1, min(repeats, int((max_seconds - first) / max(first, 1e-9))))
    times = []
    for _ in range(repeats_run):
        sync()
        t0 = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - t0)

    peak = torch.cuda.max_memory_allocated(dev) if cuda else _peak_rss_bytes()
    return {
        "backend": backend,
        "n": n,
        "causal": causal,
        "pass": pass_,
        "status": "ok",
        "median_ms": 1e3 * statistics.median(times),
        "times_ms": [1e3 * t for t in times],
        "first_call_ms": 1e3 * first,
        "repeats": repeats_run,
        "extra_peak_mib": max(0, peak - before) / MiB,
        "threads": torch.get_num_threads(),
    }


# ----------------------------------------------------------------------------------------- the sweep


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _estimated_bytes(backend: str, n: int, pass_: str) -> int:
    """Rough peak of the materializing backend: a few (B, H, N, N) float32 matrices."""
    if backend != "math":
        return 0  # tiled or fused: O(N) extra memory
    matrices = 2 if pass_ == "fwd" else 4
    return matrices * BATCH * HEADS * n * n * 4


def _skip_reason(cell, done, args, available) -> str | None:
    backend, n, causal, pass_ = cell
    need = _estimated_bytes(backend, n, pass_)
    if args.device == "cpu" and available is not None and need > 0.8 * available:
        return f"needs about {need / MiB:,.0f} MiB, {available / MiB:,.0f} MiB available"
    # Attention costs O(N²): extrapolate from the largest smaller N already measured in this row.
    smaller = [r for r in done if (r["backend"], r["causal"], r["pass"]) == (backend, causal, pass_)]
    smaller = [r for r in smaller if r["status"] == "ok" and r["n"] < n]
    if smaller:
        prev = max(smaller, key=lambda r: r["n"])
        per_call = prev["median_ms"] / 1e3 * (n / prev["n"]) ** 2
        if 2 * per_call > args.max_seconds_per_cell:  # a warm-up and one timed call must fit
            return f"estimated {per_call:,.0f} s per call (limit {args.max_seconds_per_cell:g} s per cell)"
    return None


def _run_subprocess(cell, args) -> dict:
    backend, n, causal, pass_ = cell
    cmd = [sys.executable, __file__, "--cell", backend, str(n), str(int(causal)), pass_]
    cmd += ["--repeats", str(args.repeats), "--device", args.device]
    cmd += ["--max-seconds-per-cell", str(args.max_seconds_per_cell)]
    cmd += ["--threads", str(args.threads)] if args.threads else []
    record = {"backend": backend, "n": n, "causal": causal, "pass": pass_}
    try:
        # Imports and the warm-up come on top of the timed calls.
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=2 * args.max_seconds_per_cell + 60)
    except subprocess.TimeoutExpired:
        return {**record, "status": "timeout"}
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {**record, "status": f"failed (exit {proc.returncode}): {tail}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}" if x >= 1 else f"{x:.2f}"


def markdown_table(results: list[dict], backends: list[str]) -> str:
    """One row per (N, causal, pass): times, ratios to sdpa, and extra peak memory per backend."""
    rows = {}
    for r in results:
        rows.setdefault((r["n"], r["causal"], r["pass"]), {})[r["backend"]] = r
    others = [b for b in backends if b != "sdpa"] if "sdpa" in backends else []
    head = ["N", "causal", "pass"] + [f"{b} ms" for b in backends] + [f"{b}/sdpa" for b in others]
    head += [f"{b} +MiB" for b in backends]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for (n, causal, pass_), cells in rows.items():
        ok = {b: c for b, c in cells.items() if c["status"] == "ok"}
        line = [str(n), "yes" if causal else "no", pass_]
        line += [_fmt(ok[b]["median_ms"]) if b in ok else "skip" for b in backends]
        for b in others:
            both = b in ok and "sdpa" in ok
            line.append(f"{ok[b]['median_ms'] / ok['sdpa']['median_ms']:.2f}×" if both else "–")
        line += [_fmt(ok[b]["extra_peak_mib"]) if b in ok else "–" for b in backends]
        lines.append("| " + " | ".join(line) + " |")
    return "\n".join(lines)


def sweep(args) -> dict:
    import torch

    available = _available_bytes()
    cells = [
        (backend, n, causal, pass_)
        for n in args.sizes
        for causal in (False, True)
        for pass_ in PASSES
        for backend in args.backends
    ]
    results = []
    for cell in cells:
        reason = _skip_reason(cell, results, args, available)
        if reason:
            record = dict(zip(("backend", "n", "causal", "pass"), cell, strict=True))
            record["status"] = f"skipped: {reason}"
        else:
            record = _run_subprocess(cell, args)
        results.append(record)
        shown = f"{record['median_ms']:.2f} ms" if record["status"] == "ok" else record["status"]
        print(f"  {cell[0]:>5} N={cell[1]:<5} causal={cell[2]!s:<5} {cell[3]:<7} {shown}", flush=True)
    return {
        "benchmark": "attention",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else _cpu_model(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "threads": args.threads or torch.get_num_threads(),
        "shape": {"batch": BATCH, "heads": HEADS, "head_dim": HEAD_DIM, "dtype": "float32"},
        "memory": "CUDA max_memory_allocated" if args.device.startswith("cuda") else "peak RSS - RSS before",
        "repeats": args.repeats,
        "max_seconds_per_cell": args.max_seconds_per_cell,
        "results": results,
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=None, help="sequence lengths N")
    p.add_argument(
        "--backends", nargs="+", default=["math", "sdpa", "flash"], choices=["math", "sdpa", "flash"]
    )
    p.add_argument(
        "--repeats", type=int, default=None, help="timed calls per cell (default 5; 3 with --quick)"
    )
    p.add_argument("--out", type=Path, default=Path("bench/results/attention.json"))
    p.add_argument(
        "--quick", action="store_true", help="small sizes and few repeats: checks the script works"
    )
    p.add_argument("--device", default="auto", help="auto (cuda when available), cpu, cuda, cuda:1, ...")
    p.add_argument("--max-seconds-per-cell", type=float, default=120.0)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: PyTorch's choice)")
    p.add_argument("--cell", nargs=4, metavar=("BACKEND", "N", "CAUSAL", "PASS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.sizes = args.sizes or ([128, 256] if args.quick else [256, 1024, 4096, 8192])
    args.repeats = args.repeats or (3 if args.quick else 5)
    if args.device == "auto":
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"

    if args.cell:  # inside the subprocess of one cell: print its record as one JSON line
        backend, n, causal, pass_ = args.cell
        record = run_cell(
            backend, int(n), causal == "1", pass_, args.repeats, args.device, args.max_seconds_per_cell
        )
        print(json.dumps(record))
        return

    print(f"attention bench: sizes {args.sizes}, backends {args.backends}, device {args.device}", flush=True)
    report = sweep(args)
    print()
    print(
        f"{report['device_name']}, torch {report['torch']}, {report['threads']} threads; "
        f"B={BATCH}, H={HEADS}, E={HEAD_DIM}, float32; median ms, extra peak MiB"
    )
    print()
    print(markdown_table(report["results"], args.backends))
    write(args.out, report, settings=vars(args), argv=argv)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
