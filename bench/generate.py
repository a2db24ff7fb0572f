"""Decoding speed at batch 1: tokennet's KV-cached greedy decoding against HF transformers and no cache.

A GPT-2-shaped model (6 layers, width 384, 6 heads, vocabulary 50304) with random weights, a 16-token
prompt, 256 new tokens, greedy. The context is 512 so that prompt + 256 new tokens fit without a
sliding window in every system. Systems run interleaved in rounds, in one process, on the same input:

- tokennet ``generate(..., use_cache=True)`` (the KV cache: one new query per step);
- tokennet ``generate(..., use_cache=False)`` (the whole prefix recomputed every step);
- HF ``GPT2LMHeadModel.generate`` (its own KV cache), same shapes, random weights, if installed.

    python bench/generate.py [--rounds 5] [--new-tokens 256]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SHAPE = {"num_layers": 6, "dim": 384, "num_heads": 6, "vocab_size": 50304, "block_size": 512}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--no-uncached", action="store_true", help="skip the slow no-cache system")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "generate.json"))
    args = p.parse_args()

    from tokennet.models import create_model
    from tokennet.sampling import generate

    torch.manual_seed(0)
    ours = create_model("gpt", **SHAPE).eval()
    prompt = torch.randint(SHAPE["vocab_size"], (1, args.prompt_len), generator=torch.Generator().manual_seed(0))
    n = args.new_tokens
    systems = {"tokennet (KV cache)": lambda: generate(ours, prompt, n, temperature=0)}
    if not args.no_uncached:
        systems["tokennet (no cache)"] = lambda: generate(ours, prompt, n, temperature=0, use_cache=False)
    try:
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(n_layer=SHAPE["num_layers"], n_embd=SHAPE["dim"], n_head=SHAPE["num_heads"],
                         vocab_size=SHAPE["vocab_size"], n_positions=SHAPE["block_size"], attn_pdrop=0.0,
                         resid_pdrop=0.0, embd_pdrop=0.0)
        hf = GPT2LMHeadModel(cfg).eval()

        def run_hf():
            with torch.inference_mode():
                return hf.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0,
                                   attention_mask=torch.ones_like(prompt))

        systems["HF transformers GPT2LMHeadModel.generate"] = run_hf
    except ImportError:
        print("transformers is not installed: `pip install transformers` to compare against it", file=sys.stderr)

    for f in systems.values():  # warm-up (allocations, lazy init)
        f()
    times = {k: [] for k in systems}
    lengths = {}
    for _ in range(args.rounds):
        for name, f in systems.items():
            t = time.perf_counter()
            out = f()
            times[name].append(time.perf_counter() - t)
            lengths[name] = out.shape[1] - args.prompt_len
    ref = statistics.median(times["tokennet (KV cache)"])
    rows = []
    print(f"batch 1, greedy, {n} new tokens, prompt {args.prompt_len}, GPT-2-shaped {SHAPE}, "
          f"{torch.get_num_threads()} threads\n")
    print("| system | median s | new tokens/s | tokennet (cache) is × faster |\n| --- | --- | --- | --- |")
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append({"system": name, "median_s": round(med, 4), "new_tokens": lengths[name],
                     "tokens_per_s": round(lengths[name] / med, 1), "tokennet_speedup": round(med / ref, 2),
                     "all_s": [round(t, 4) for t in ts]})
        print(f"| {name} | {med:.3f} | {lengths[name] / med:,.1f} | {med / ref:.2f}× |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"shape": SHAPE, "new_tokens": n, "prompt_len": args.prompt_len, "rows": rows,
                               "torch": torch.__version__, "threads": torch.get_num_threads()}, indent=2) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
