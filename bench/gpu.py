"""One GPU run in under 5 minutes: GPT-2-small training throughput and MFU, tokennet's Triton attention against
PyTorch's SDPA, and decoding tokens/s; every section has a time bound and the JSON is rewritten after each.

Sections, in this order (the riskiest last, so that a stop keeps the others):

1. ``train``: a GPT of GPT-2-small shape (12 layers, 12 heads, width 768, context 1024, vocabulary 50304, GELU-tanh,
   random data) built with ``tokennet.models.create_model("gpt", ...)`` and stepped by ``tokennet.train.Trainer``
   (``precision="bf16"``: autocast, fused AdamW, clipping) as a user's run is: tokens/s over the timed steps and
   MFU = tokens/s × FLOPs per token / the GPU's peak dense bf16 FLOP/s. FLOPs per token = 6·N + 12·L·H·E·T (PaLM,
   Chowdhery et al. 2022, appendix B; nanoGPT's ``estimate_mfu``), N = the parameters without the position
   table (nanoGPT's ``get_num_params``). Peaks: :data:`PEAK_BF16` (H100 SXM and H200 989 TFLOP/s, A100 312); on
   another GPU the MFU is not reported, and the JSON says why.
2. ``attention``: at GPT-2-small shapes (batch 8, 12 heads, 1024 tokens, head width 64, bf16) the forward and the
   forward + backward of ``triton_flash_attention`` (:mod:`tokennet.attention.triton_flash`), PyTorch's
   ``F.scaled_dot_product_attention`` and tokennet's PyTorch tiled ``flash`` backend, causal and not: median ms
   and TFLOP/s (4·B·H·N²·E for the forward, half of it causal; the backward 2.5× the forward). Before timing,
   the bf16 kernels' output and gradients against the float32 formula (``backend="math"``) beside SDPA's error,
   and the Triton forward under a few other block configurations.
3. ``decode``: greedy ``tokennet.sampling.generate`` (KV cache, eager, the model in bf16) of the same GPT at batch 1
   and batch 8: new tokens/s.
4. ``train_compiled``: section 1 again under ``torch.compile`` (``TrainConfig.compile``); the compilation's time
   is reported apart. ``--no-compile`` leaves it out.

    python bench/gpu.py                          # a CUDA machine: bench/results/gpu.json
    python bench/gpu.py --smoke --device cpu     # a tiny GPT and tiny attention shapes: checks the script

Without a CUDA device (and without ``--device cpu``) it says so in one line and exits 2. Options: ``--out``,
``--batch``, ``--budget`` (seconds for the whole run, default 285), ``--no-compile``, ``--sections``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/_record.py, also when a test loads this file
from _record import commit, machine  # noqa: E402

from tokennet.attention.functional import attention  # noqa: E402
from tokennet.errors import TokennetError  # noqa: E402
from tokennet.models import create_model  # noqa: E402
from tokennet.sampling import generate  # noqa: E402
from tokennet.train.trainer import TrainConfig, Trainer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# Peak dense bf16 tensor-core FLOP/s (NVIDIA's data sheets, without sparsity). H100 PCIe / NVL differ: not listed.
PEAK_BF16 = {"H200": 989e12, "H100 SXM": 989e12, "A100": 312e12}
GPT2_SMALL = dict(vocab_size=50304, block_size=1024, dim=768, num_layers=12, num_heads=12, dropout=0.0,
                  activation="gelu_tanh")
SMOKE_GPT = dict(vocab_size=256, block_size=32, dim=32, num_layers=2, num_heads=2, dropout=0.0,
                 activation="gelu_tanh")
# Seconds each section may take (measurement and warm-up; a compilation counts in its own section).
BOUNDS = {"train": 40.0, "attention": 70.0, "decode": 40.0, "train_compiled": 150.0}
SECTIONS = tuple(BOUNDS)


class NoGPU(TokennetError):
    """The run needs a CUDA device and there is none."""


def peak_bf16(gpu_name: str) -> tuple[float | None, str]:
    """The peak dense bf16 FLOP/s of the GPU named ``gpu_name`` (``torch.cuda.get_device_name``), and which row."""
    name = gpu_name.upper()
    if "H200" in name:
        return PEAK_BF16["H200"], "H200"
    if "H100" in name and ("SXM" in name or "HBM3" in name):  # the SXM part reports "NVIDIA H100 80GB HBM3"
        return PEAK_BF16["H100 SXM"], "H100 SXM"
    if "A100" in name:
        return PEAK_BF16["A100"], "A100"
    return None, f"no peak bf16 figure for {gpu_name!r} (known: {', '.join(PEAK_BF16)}): MFU not reported"


def flops_per_token(model: torch.nn.Module) -> float:
    """6·N + 12·L·H·E·T (PaLM appendix B, nanoGPT's estimate_mfu); N without the position table (counted once when
    the head is tied)."""
    c = model.config
    n = sum(p.numel() for p in model.parameters())
    if getattr(model, "pos_emb", None) is not None:
        n -= sum(p.numel() for p in model.pos_emb.parameters())
    return 6 * n + 12 * c.num_layers * c.num_heads * c.head_width * c.block_size


class RandomTokens:
    """``batch(i) -> (x, y)``: uniform random token ids ``(B, T)`` made on ``device`` (no copy per step), seed i."""

    def __init__(self, vocab_size: int, batch_size: int, block_size: int, device: torch.device):
        self.shape, self.vocab, self.device = (batch_size, block_size + 1), vocab_size, device

    def batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator(device=self.device).manual_seed(index)
        ids = torch.randint(self.vocab, self.shape, generator=g, device=self.device)
        return ids[:, :-1], ids[:, 1:]


def setup_training(config: dict, device: str, batch_size: int, *, compile: bool = False,
                   out_dir: str | None = None) -> Trainer:
    """The GPT and a bf16 :class:`Trainer` stepping it on random tokens, as a user's run is (nothing written)."""
    torch.manual_seed(0)
    model = create_model("gpt", **config)
    dev = torch.device(device)
    source = RandomTokens(model.config.vocab_size, batch_size, model.config.block_size, dev)
    tc = TrainConfig(max_iters=10**9, batch_size=batch_size, lr=6e-4, warmup_iters=0, eval_interval=0,
                     precision="bf16", compile=compile, progress=False, report=False, log_interval=10**9)
    return Trainer(model, tc, source, out_dir=out_dir or tempfile.mkdtemp(prefix="gpu-bench-"), device=dev,
                   tokens_per_batch=batch_size * model.config.block_size)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device, seconds: float, *, warmup: int = 2, min_reps: int = 3,
          max_reps: int = 10**6) -> tuple[list[float], float]:
    """Run ``fn`` ``warmup`` times, then until ``seconds`` have passed (at least ``min_reps`` times): each call's
    seconds, and the warm-up's seconds."""
    t0 = time.perf_counter()
    for _ in range(warmup):
        fn()
    _sync(device)
    warm = time.perf_counter() - t0
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_reps and (len(times) < min_reps or time.perf_counter() - start < seconds):
        t = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t)
    return times, warm


def section_train(config: dict, device: str, batch_size: int, seconds: float, *, compile: bool = False,
                  gpu_name: str | None = None) -> dict:
    """Tokens/s and MFU of bf16 training steps (``Trainer.train_step``: forward, backward, clipping, AdamW)."""
    trainer = setup_training(config, device, batch_size, compile=compile)
    dev, model = trainer.device, trainer.module
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    losses: list[float] = []
    times, warm = timed(lambda: losses.append(trainer.train_step()[0]), dev, seconds, warmup=3 if compile else 2)
    tokens = batch_size * model.config.block_size
    step_s = statistics.median(times)
    tok_s = tokens / step_s
    fpt = flops_per_token(model)
    out = {"batch_size": batch_size, "block_size": model.config.block_size, "compile": compile,
           "params": sum(p.numel() for p in model.parameters()), "flops_per_token": fpt, "steps_timed": len(times),
           "warmup_s": round(warm, 2), "step_ms_median": step_s * 1e3, "tokens_per_s": tok_s,
           "achieved_tflops": tok_s * fpt / 1e12, "loss_first": losses[0], "loss_last": losses[-1],
           "param_dtype": str(next(model.parameters()).dtype), "device": str(next(model.parameters()).device)}
    if not all(math.isfinite(x) for x in losses):
        raise RuntimeError(f"training produced a non-finite loss: {losses}")
    if gpu_name is not None:
        peak, row = peak_bf16(gpu_name)
        out.update(peak_bf16_flops=peak, peak_row=row, mfu=None if peak is None else tok_s * fpt / peak)
    if dev.type == "cuda":
        out["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated(dev) / 2**30
    return out


def attention_impls(device: str) -> tuple[dict, str | None]:
    """``name -> fn(q, k, v, is_causal)``: SDPA, tokennet's PyTorch tiled backend and (where it can run) the Triton
    kernels; and why the Triton kernels are left out (None when they are in)."""
    from tokennet.attention.triton_flash import triton_flash_attention, unavailable_reason

    impls = {"sdpa": lambda q, k, v, c: F.scaled_dot_product_attention(q, k, v, is_causal=c),
             "tokennet_flash_pytorch": lambda q, k, v, c: attention(q, k, v, is_causal=c, backend="flash")}
    reason = unavailable_reason(device)
    if reason is None:
        impls["triton"] = lambda q, k, v, c: triton_flash_attention(q, k, v, is_causal=c)
    return impls, reason


def _qkv(shape, dtype, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v, d_out = (torch.randn(shape, generator=g, device=device, dtype=dtype) for _ in range(4))
    return [t.requires_grad_() for t in (q, k, v)], d_out


def attention_errors(impls: dict, shape: tuple, device: str, dtype: torch.dtype) -> dict:
    """Max |difference| of each implementation's output and q, k, v gradients (in ``dtype``) from the float32
    formula (``backend="math"``) on the same values, causal and not."""
    out = {}
    for causal in (False, True):
        (q, k, v), d_out = _qkv(shape, dtype, device, seed=1)
        leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
        ref = attention(*leaves, is_causal=causal, backend="math")
        expected = [ref, *torch.autograd.grad(ref, leaves, d_out.float())]
        rows = {}
        for name, fn in impls.items():
            o = fn(q, k, v, causal)
            got = [o, *torch.autograd.grad(o, (q, k, v), d_out)]
            rows[name] = {w: float((g.detach().float() - r.detach()).abs().max())
                          for w, g, r in zip(("out", "dq", "dk", "dv"), got, expected)}
        out["causal" if causal else "full"] = rows
    return out


def attention_flops(shape: tuple, causal: bool, backward: bool) -> float:
    """4·B·H·N²·E for the forward (QKᵀ and PV), half of it causal; forward + backward 3.5× the forward."""
    B, H, N, E = shape
    fwd = 4 * B * H * N * N * E * (0.5 if causal else 1.0)
    return fwd * (3.5 if backward else 1.0)


def time_attention(fn, shape, dtype, device: str, causal: bool, backward: bool, seconds: float) -> dict:
    """Median ms of ``fn``'s forward (or forward + backward) and its TFLOP/s."""
    (q, k, v), d_out = _qkv(shape, dtype, device)
    dev = torch.device(device)
    grad = torch.enable_grad() if backward else torch.no_grad()

    def step():
        with grad:
            o = fn(q, k, v, causal)
            if backward:
                torch.autograd.grad(o, (q, k, v), d_out)

    times, _ = timed(step, dev, seconds, warmup=2, min_reps=3)
    ms = statistics.median(times) * 1e3
    return {"ms": ms, "tflops": attention_flops(shape, causal, backward) / (ms * 1e-3) / 1e12, "reps": len(times)}


def section_attention(device: str, shape: tuple, dtype: torch.dtype, cell_seconds: float) -> dict:
    """Accuracy first, then every implementation × causal or not × forward or forward + backward, timed."""
    impls, reason = attention_impls(device)
    out = {"shape_bhne": list(shape), "dtype": str(dtype), "triton_left_out": reason,
           "errors_vs_float32_math": attention_errors(impls, (1, *shape[1:]), device, dtype), "timings": {}}
    for causal in (False, True):
        for backward in (False, True):
            cell = f"{'causal' if causal else 'full'}_{'fwd_bwd' if backward else 'fwd'}"
            out["timings"][cell] = {name: time_attention(fn, shape, dtype, device, causal, backward, cell_seconds)
                                    for name, fn in impls.items()}
    if "triton" in impls and torch.device(device).type == "cuda":
        out["triton_fwd_configs"] = triton_configs(shape, dtype, device, cell_seconds)
    return out


def triton_configs(shape, dtype, device: str, cell_seconds: float) -> dict:
    """The Triton forward (causal) under a few other ``(block_m, block_n, num_warps, num_stages)``: median ms."""
    from tokennet.attention.triton_flash import FWD_CONFIG, triton_flash_attention

    out = {}
    for cfg in (FWD_CONFIG, (64, 64, 4, 3), (128, 128, 8, 3), (128, 32, 4, 4), (64, 32, 4, 4)):
        def fn(q, k, v, c, cfg=cfg):
            return triton_flash_attention(q, k, v, is_causal=c, fwd_config=cfg)
        try:
            out[str(cfg)] = time_attention(fn, shape, dtype, device, True, False, cell_seconds / 2)["ms"]
        except Exception as e:  # a configuration the GPU cannot hold (shared memory) is a row, not a failed run
            out[str(cfg)] = f"failed: {type(e).__name__}: {str(e)[:200]}"
    return out


def section_decode(config: dict, device: str, seconds: float, *, batches=(1, 8), prompt_len: int = 64,
                   new_tokens: int = 256) -> dict:
    """Greedy ``generate`` (KV cache, eager) of the GPT in bf16: new tokens/s at each batch size."""
    torch.manual_seed(0)
    dev = torch.device(device)
    model = create_model("gpt", **config).to(device=dev, dtype=torch.bfloat16).eval()
    new = min(new_tokens, model.config.block_size - prompt_len)
    out = {"prompt_len": prompt_len, "new_tokens": new, "param_dtype": str(next(model.parameters()).dtype),
           "device": str(next(model.parameters()).device), "batches": {}}
    for B in batches:
        prompt = torch.randint(model.config.vocab_size, (B, prompt_len), device=dev)
        result = {}

        def fn(prompt=prompt, result=result):
            result["ids"] = generate(model, prompt, new, temperature=0.0, quantize="none", compile=False)

        times, warm = timed(fn, dev, seconds / len(batches), warmup=1, min_reps=2)
        if tuple(result["ids"].shape) != (B, prompt_len + new) or result["ids"].device != dev:
            raise RuntimeError(f"generate returned {tuple(result['ids'].shape)} on {result['ids'].device}")
        s = statistics.median(times)
        out["batches"][str(B)] = {"tokens_per_s": B * new / s, "ms_per_step": s / new * 1e3, "calls": len(times),
                                  "warmup_s": round(warm, 2)}
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --smoke: checks the script)")
    p.add_argument("--smoke", action="store_true", help="a tiny GPT and tiny attention shapes, bounds of seconds")
    p.add_argument("--out", type=Path, default=None, help="JSON file (default bench/results/gpu.json; "
                   "with --smoke a temporary file)")
    p.add_argument("--batch", type=int, default=None, help="training sequences per step (default 16; smoke 2)")
    p.add_argument("--budget", type=float, default=285.0, help="seconds for the whole run (default 285)")
    p.add_argument("--no-compile", action="store_true", help="leave out the torch.compile training section")
    p.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    args = p.parse_args(argv)
    if args.batch is not None and args.batch < 1:
        p.error(f"--batch must be >= 1, got {args.batch}")
    return args


def gpu_name(device: str) -> str | None:
    """The CUDA device's name; :class:`NoGPU` when ``device`` is CUDA and there is none; None for the CPU."""
    kind = torch.device(device).type
    if kind == "cpu":
        return None
    if kind != "cuda":
        raise NoGPU(f"--device must be cuda or cpu, got {device!r}")
    if not torch.cuda.is_available():
        raise NoGPU(f"no CUDA GPU here (torch {torch.__version__}, built with CUDA {torch.version.cuda}): "
                    "bench/gpu.py measures a GPU; `--smoke --device cpu` checks the script on the CPU")
    return torch.cuda.get_device_name(torch.device(device))


def plan(args: argparse.Namespace, name: str | None) -> list[tuple[str, float, object]]:
    """``(section, bound in seconds, thunk)`` in running order, at the full or the smoke size."""
    smoke, dev = args.smoke, args.device
    cfg = SMOKE_GPT if smoke else GPT2_SMALL
    batch = args.batch or (2 if smoke else 16)
    scale = 0.05 if smoke else 1.0  # smoke bounds: a few seconds in all
    shape = (1, 2, 33, 16) if smoke else (8, 12, 1024, 64)
    bounds = {k: v * scale for k, v in BOUNDS.items()}
    timed = {"train": 0.5 * bounds["train"], "train_compiled": 0.15 * bounds["train_compiled"]}  # the rest: build,
    # warm-up steps and (train_compiled) the compilation
    thunks = {
        "train": lambda: section_train(cfg, dev, batch, timed["train"], gpu_name=name),
        # float16 in the smoke run: Triton 3.8's CPU interpreter multiplies bfloat16 blocks wrongly.
        "attention": lambda: section_attention(dev, shape, torch.float16 if smoke else torch.bfloat16,
                                               bounds["attention"] / 24),
        "decode": lambda: section_decode(cfg, dev, bounds["decode"] * 0.6, batches=(1, 4) if smoke else (1, 8),
                                         prompt_len=8 if smoke else 64, new_tokens=8 if smoke else 256),
        "train_compiled": lambda: section_train(cfg, dev, batch, timed["train_compiled"], compile=True, gpu_name=name),
    }
    wanted = [s for s in SECTIONS if s in args.sections and not (s == "train_compiled" and (args.no_compile or smoke))]
    return [(s, bounds[s], thunks[s]) for s in wanted]


def record(args: argparse.Namespace, name: str | None, argv: list[str]) -> dict:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"command": " ".join(["python", "bench/gpu.py", *argv]), "commit": commit(),
            "machine": machine(gpu=name, torch=torch.__version__, cuda=torch.version.cuda, triton=triton_version),
            "device": args.device, "smoke": args.smoke, "model": SMOKE_GPT if args.smoke else GPT2_SMALL,
            "budget_s": args.budget, "sections": {}}


def run(argv: list[str] | None = None) -> dict:
    """Every planned section that fits the budget, the JSON rewritten after each; returns the record."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse(argv)
    name = gpu_name(args.device)
    out_path = args.out or (Path(tempfile.mkdtemp(prefix="gpu-smoke-")) / "gpu.json" if args.smoke
                            else ROOT / "bench" / "results" / "gpu.json")
    rec = record(args, name, argv)
    print(f"gpu.py: {name or args.device}, torch {torch.__version__}, triton {rec['machine']['triton']}", flush=True)
    t_start = time.perf_counter()
    for section, bound, thunk in plan(args, name):
        left = args.budget - (time.perf_counter() - t_start)
        if left < bound:
            rec["sections"][section] = {"skipped": f"{left:.0f} s of the budget left, the section needs {bound:.0f} s"}
        else:
            t0 = time.perf_counter()
            try:
                rec["sections"][section] = thunk()
            except Exception as e:  # one failed section (out of memory, a kernel that does not build) keeps the others
                rec["sections"][section] = {"error": f"{type(e).__name__}: {e}"}
                import traceback

                traceback.print_exc()
            rec["sections"][section]["section_s"] = round(time.perf_counter() - t0, 2)
        rec["elapsed_s"] = round(time.perf_counter() - t_start, 2)
        print(summary(section, rec["sections"][section]), flush=True)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(rec, indent=1) + "\n")
    print(f"gpu.py: wrote {out_path} ({rec['elapsed_s']} s)")
    rec["out"] = str(out_path)
    return rec


def summary(section: str, r: dict) -> str:
    """A few markdown lines for one section's result."""
    if "skipped" in r or "error" in r:
        return f"\n## {section}: {r.get('skipped') or r.get('error')}"
    if section.startswith("train"):
        mfu = "n/a (CPU)" if "peak_row" not in r else f"not reported: {r['peak_row']}" if r["mfu"] is None \
            else f"{r['mfu']:.1%} of {r['peak_bf16_flops'] / 1e12:.0f} TFLOP/s"
        return (f"\n## {section}\n| tokens/s | step ms | achieved TFLOP/s | MFU | warm-up s |\n"
                "|---:|---:|---:|---|---:|\n"
                f"| {r['tokens_per_s']:,.0f} | {r['step_ms_median']:.1f} | {r['achieved_tflops']:.3g} | {mfu} | "
                f"{r['warmup_s']} |")
    if section == "attention":
        lines = [f"\n## attention {r['shape_bhne']} {r['dtype']} (ms, TFLOP/s)"
                 + (f"; triton left out: {r['triton_left_out']}" if r["triton_left_out"] else ""),
                 "| cell | " + " | ".join(next(iter(r["timings"].values()))) + " |"]
        for cell, row in r["timings"].items():
            lines.append(f"| {cell} | " + " | ".join(f"{t['ms']:.3f} ms, {t['tflops']:.3g}" for t in row.values())
                         + " |")
        for kind, rows in r["errors_vs_float32_math"].items():
            lines.append(f"max |error| vs float32 formula, {kind}: " + "; ".join(
                f"{n} " + "/".join(f"{v:.2g}" for v in e.values()) for n, e in rows.items()) + " (out/dq/dk/dv)")
        return "\n".join(lines)
    rows = " ".join(f"batch {b}: {x['tokens_per_s']:,.1f} tok/s;" for b, x in r["batches"].items())
    return f"\n## decode ({r['new_tokens']} new tokens, bf16, KV cache) {rows}"


def main(argv: list[str] | None = None) -> int:
    try:
        rec = run(argv)
    except TokennetError as e:
        print(f"bench/gpu.py: {e}", file=sys.stderr)
        return 2
    return 1 if any("error" in r for r in rec["sections"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
