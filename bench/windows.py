"""Swin's complexity claim, measured: global ViT attention vs window attention as the token grid grows.

Forward + backward of one attention layer (Q/K/V and output projections included) over an ``s × s`` grid of
tokens, N = s² from 64 to 4,096: the global layer is :class:`~tokennet.attention.multihead.MultiHeadAttention`
over all N tokens, the window layer :class:`~tokennet.attention.windows.WindowAttention` with M × M windows
(M = 8: at N = 64 both are one window). Width D = 96, 3 heads, batch 1, float32 — Swin-T's first stage.
Per cell, in a fresh subprocess:

- **time**: the median of ``--repeats`` forward+backward calls after a warm-up;
- **saved activations**: the bytes autograd keeps for the backward pass (``saved_tensors_hooks``), an
  exact, load-independent count of what the forward leaves in memory;
- **peak RSS**: the process's peak resident memory over its resident memory after a call on a tiny input
  (what the allocator really took for this size; noisy for small N).

Both kinds run with the ``math`` backend (the formula: it materializes the ``N × N`` or ``N × M²`` weights)
and ``sdpa`` (PyTorch's fused kernel, which on CPU never materializes them: its memory is linear in N even
for global attention, its time is not). For each column the bench fits ``cost ∝ N^α`` by least squares on
log–log axes, over all sizes and over the largest three (where the N² term of global attention dominates
the projections' N·D²); Swin's paper predicts α ≈ 2 (global) and α = 1 (windows), see
:func:`~tokennet.attention.windows.msa_macs` and :func:`~tokennet.attention.windows.window_msa_macs`, whose
multiply-adds the table also lists.

Usage::

    python bench/windows.py --quick          # 64 → 1,024 tokens, 2 repeats: checks that it works
    python bench/windows.py                  # 64 → 4,096 tokens (the full sweep), table + plot

Writes ``bench/results/windows.json`` and ``bench/results/windows.png`` (``--out`` for another stem).
CPU PyTorch on few cores slows down many times when anything else runs: time on an idle machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/_record.py, also when a test loads this file
from _record import write  # noqa: E402

DIM, HEADS, WINDOW = 96, 3, 8
KINDS = ("global", "window")
MiB = 2**20


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_cell(kind: str, backend: str, side: int, repeats: int, threads: int | None) -> dict:
    """Time one (kind, backend, grid side) cell in this process."""
    import torch

    from tokennet.attention.multihead import MultiHeadAttention
    from tokennet.attention.windows import WindowAttention, msa_macs, window_msa_macs

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    n = side * side
    if kind == "global":
        layer = MultiHeadAttention(DIM, HEADS, backend=backend)
        x = torch.randn(1, n, DIM, requires_grad=True)
        macs = msa_macs(n, DIM)
    else:
        layer = WindowAttention(DIM, HEADS, WINDOW, backend=backend)
        x = torch.randn(1, side, side, DIM, requires_grad=True)
        macs = window_msa_macs(n, min(WINDOW, side) ** 2, DIM)

    def call():
        layer(x).sum().backward()
        x.grad = None
        layer.zero_grad(set_to_none=True)

    # A tiny call first: kernels, the autograd engine and the windows' layout code are loaded before the
    # baseline of the memory figure, which then counts what this size costs.
    tiny = torch.randn(1, 4, DIM) if kind == "global" else torch.randn(1, 2, 2, DIM)
    layer(tiny).sum().backward()
    layer.zero_grad(set_to_none=True)
    saved = [0]

    def pack(t):
        saved[0] += t.numel() * t.element_size()
        return t

    before = _rss()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = layer(x)
    saved_bytes = saved[0]
    out.sum().backward()
    x.grad = None
    del out
    call()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"kind": kind, "backend": backend, "n": n, "side": side, "median_ms": 1e3 * statistics.median(times),
            "times_ms": [1e3 * t for t in times], "saved_mib": saved_bytes / MiB,
            "peak_rss_mib": max(0, peak - before) / MiB, "macs": macs, "threads": torch.get_num_threads()}


def fit_exponent(ns: list[int], values: list[float]) -> float | None:
    """Least-squares slope of ``log value`` on ``log N`` (None below two usable points)."""
    pts = [(math.log(n), math.log(v)) for n, v in zip(ns, values, strict=True) if v and v > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / den


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for (kind, backend), style in {("global", "math"): "o-", ("global", "sdpa"): "o--",
                                   ("window", "math"): "s-", ("window", "sdpa"): "s--"}.items():
        rs = sorted((r for r in rows if r["kind"] == kind and r["backend"] == backend), key=lambda r: r["n"])
        if not rs:
            continue
        ns = [r["n"] for r in rs]
        colour = "tab:red" if kind == "global" else "tab:blue"
        for ax, key in zip(axes, ("median_ms", "saved_mib", "peak_rss_mib"), strict=True):
            vals = [r[key] for r in rs]
            a = fit_exponent(ns[-3:], vals[-3:])
            ax.loglog(ns, [max(v, 1e-3) for v in vals], style, color=colour,
                      label=f"{kind} ({backend}), α = {a:.2f}" if a is not None else f"{kind} ({backend})")
    for ax, what in zip(axes, ("time of forward+backward (ms)", "saved activations (MiB)", "peak RSS (MiB)"),
                        strict=True):
        ax.set_xlabel("tokens N")
        ax.set_title(what, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"global vs window attention, D = {DIM}, {HEADS} heads, M = {WINDOW}: cost ∝ N^α "
                 "(α fitted on the largest three sizes)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sides", type=int, nargs="+", default=[8, 16, 32, 64], help="grid sides s (N = s²)")
    ap.add_argument("--backends", nargs="+", default=["math", "sdpa"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="sides 8 16 32, 2 repeats")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "windows"))
    ap.add_argument("--cell", nargs=3, metavar=("KIND", "BACKEND", "SIDE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cell:
        kind, backend, side = args.cell
        print(json.dumps(run_cell(kind, backend, int(side), args.repeats, args.threads)))
        return
    if args.quick:
        args.sides, args.repeats = [8, 16, 32], 2
    rows = []
    for backend in args.backends:
        for side in args.sides:
            for kind in KINDS:
                cmd = [sys.executable, __file__, "--cell", kind, backend, str(side), "--repeats", str(args.repeats)]
                if args.threads:
                    cmd += ["--threads", str(args.threads)]
                p = subprocess.run(cmd, capture_output=True, text=True)
                if p.returncode != 0:
                    sys.exit(f"cell {kind}/{backend}/{side} failed:\n{p.stderr}")
                rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
                r = rows[-1]
                print(f"  {kind:6s} {backend:4s} N={r['n']:5d}  {r['median_ms']:9.2f} ms  saved {r['saved_mib']:8.2f} "
                      f"MiB  peak RSS +{r['peak_rss_mib']:7.1f} MiB", file=sys.stderr, flush=True)

    print("\n| backend | N | global ms | window ms | global / window | global saved MiB | window saved MiB | "
          "global peak RSS MiB | window peak RSS MiB | MACs global / window |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    fits = {}
    for backend in args.backends:
        by = {(r["kind"], r["n"]): r for r in rows if r["backend"] == backend}
        ns = sorted({r["n"] for r in rows if r["backend"] == backend})
        for n in ns:
            g, w = by[("global", n)], by[("window", n)]
            print(f"| {backend} | {n} | {g['median_ms']:.2f} | {w['median_ms']:.2f} | "
                  f"{g['median_ms'] / w['median_ms']:.1f}× | {g['saved_mib']:.2f} | {w['saved_mib']:.2f} | "
                  f"{g['peak_rss_mib']:.1f} | {w['peak_rss_mib']:.1f} | {g['macs'] / w['macs']:.1f}× |")
        for kind in KINDS:
            for key in ("median_ms", "saved_mib", "peak_rss_mib", "macs"):
                vals = [by[(kind, n)][key] for n in ns]
                fits[f"{kind}/{backend}/{key}"] = {"all": fit_exponent(ns, vals),
                                                   "largest_3": fit_exponent(ns[-3:], vals[-3:])}
    print("\nfitted exponent α (cost ∝ N^α): all sizes / the largest three\n")
    print("| layer | time | saved activations | peak RSS | MACs (analytic) |")
    print("|---|---|---|---|---|")

    def fmt(f):
        return " / ".join("—" if v is None else f"{v:.2f}" for v in (f["all"], f["largest_3"]))

    for backend in args.backends:
        for kind in KINDS:
            k = f"{kind}/{backend}"
            print(f"| {kind} ({backend}) | {fmt(fits[k + '/median_ms'])} | {fmt(fits[k + '/saved_mib'])} | "
                  f"{fmt(fits[k + '/peak_rss_mib'])} | {fmt(fits[k + '/macs'])} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "dim": DIM, "heads": HEADS,
            "window": WINDOW, "repeats": args.repeats, "load_average": load, "cpus": os.cpu_count()}
    write(out.with_suffix(".json"), {"meta": meta, "rows": rows, "fits": fits}, settings=vars(args), indent=1)
    _plot(rows, out.with_suffix(".png"))
    print(f"\nload average {load[0]:.2f} on {os.cpu_count()} CPUs; wrote {out.with_suffix('.json')} and "
          f"{out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
