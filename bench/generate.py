"""Decoding speed against the memory-bandwidth limit: tokennet fp32 / bf16 / int8 and HF transformers, batch 1 and 8.

A GPT-2-shaped model (6 layers, width 384, 6 heads, vocabulary 50304, tanh GELU) with random weights, a
16-token prompt, 256 new tokens, greedy. The context is 512 so that prompt + 256 new tokens fit without a
sliding window in every system. HF ``GPT2LMHeadModel`` is built first with random weights and tokennet's
model is converted from it (``tokennet.interop.gpt2``), so both hold the same weights. Systems run
interleaved in rounds, in one process, on the same input; medians are reported:

- tokennet ``generate(..., use_cache=True)`` on its decoding copies ``decoding_copy(model, mode)``: fp32
  with packed linear layers, bf16, int8 (built once, outside the timing; the time to build one is reported
  apart: ``generate`` packs fp32 once per model and reuses it, and builds bf16/int8 at every call);
- tokennet ``generate(..., use_cache=False)`` (the whole prefix recomputed every step; batch 1 only);
- HF ``GPT2LMHeadModel.generate`` (its own KV cache), fp32, if installed.

The ceiling: a decoding step reads every weight once (the LM head, 384 × 50304, is most of them), so
a decoder cannot exceed ``B × bandwidth ÷ bytes of weights read per step`` tokens/s. The bandwidth is
measured here with a large tensor copy (bytes read + bytes written per second). Each decoder's
tokens/s is reported as a fraction of its own ceiling (KV-cache reads are not counted: they are small
next to the weights at these lengths). Quality: the share of greedy tokens a quantized mode shares with
fp32, free-running, and the share of next-token argmaxes that agree when both read fp32's sequence
(teacher-forced: no divergence cascades; with random weights the logits are nearly flat, so this is a
harsh test).

    python bench/generate.py [--rounds 5] [--new-tokens 256] [--batches 1 8] [--modes none bf16 int8]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
SHAPE = {"num_layers": 6, "dim": 384, "num_heads": 6, "vocab_size": 50304, "block_size": 512}
MODE_NAMES = {"none": "fp32", "bf16": "bf16", "int8": "int8"}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def copy_bandwidth(mib: int = 256, repeats: int = 15) -> float:
    """GB/s of a large tensor copy, counting the bytes read and the bytes written (median of repeats)."""
    src = torch.ones(mib * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch every page first
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        dst.copy_(src)
        ts.append(time.perf_counter() - t)
    return 2 * src.nbytes / statistics.median(ts) / 1e9


def weight_bytes_per_step(model: nn.Module, batch: int) -> int:
    """Bytes of weights one decoding step reads: every distinct floating-point or int8 parameter/buffer, except
    that a lookup table (token or position embedding) gives one row per sequence, unless it is also a linear
    layer's weight (an LM head tied to the embedding reads it all)."""
    sizes = {id(t): t.nbytes for t in list(model.parameters()) + list(model.buffers())
             if t.is_floating_point() or t.dtype == torch.int8}
    linear_w = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    for m in model.modules():
        w = getattr(m, "weight", None)
        table = isinstance(m, nn.Embedding) or type(m).__name__.endswith("Position")
        if table and isinstance(w, torch.Tensor) and w.dim() == 2 and id(w) in sizes and id(w) not in linear_w:
            sizes[id(w)] = batch * w.shape[-1] * w.element_size()
    return sum(sizes.values())


def build_models(shape):
    """HF GPT2LMHeadModel with random weights and tokennet's GPT converted from it (same weights), or only ours."""
    from tokennet.models import create_model

    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        print("transformers is not installed: `pip install transformers` to compare against it", file=sys.stderr)
        torch.manual_seed(0)
        return create_model("gpt", activation="gelu_tanh", **shape).eval(), None
    from tokennet.interop.gpt2 import convert_gpt2

    cfg = GPT2Config(n_layer=shape["num_layers"], n_embd=shape["dim"], n_head=shape["num_heads"],
                     vocab_size=shape["vocab_size"], n_positions=shape["block_size"], attn_pdrop=0.0,
                     resid_pdrop=0.0, embd_pdrop=0.0)
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(cfg).eval()
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d, safe_serialization=True)
        ours = convert_gpt2(Path(d), json.loads((Path(d) / "config.json").read_text()))[0]
    return ours.eval(), hf


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--modes", nargs="+", default=["none", "bf16", "int8"], choices=list(MODE_NAMES))
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: PyTorch's choice)")
    p.add_argument("--no-uncached", action="store_true", help="skip the slow no-cache system")
    p.add_argument("--no-hf", action="store_true", help="skip HF transformers")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "generate.json"))
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]

    from tokennet.layers import quantize as quantization
    from tokennet.sampling import generate

    bandwidth = copy_bandwidth()
    ours, hf = build_models(SHAPE)
    if args.no_hf:
        hf = None
    n, P = args.new_tokens, args.prompt_len
    convert_s = {}
    nets = {}
    for mode in args.modes:
        ts = []
        for _ in range(3):
            quantization._COPIES.pop(ours, None)  # time a fresh build, not the cached fp32 copy
            t = time.perf_counter()
            nets[mode] = quantization.decoding_copy(ours, mode)
            ts.append(time.perf_counter() - t)
        convert_s[mode] = statistics.median(ts)

    systems = {}  # (batch, name) → (fn, model whose weights it reads, mode)
    prompts = {}
    for B in args.batches:
        prompt = torch.randint(SHAPE["vocab_size"], (B, P), generator=torch.Generator().manual_seed(B))
        prompts[B] = prompt
        for mode in args.modes:
            net = nets[mode]
            systems[(B, f"tokennet {MODE_NAMES[mode]}")] = (
                lambda net=net, prompt=prompt: generate(net, prompt, n, temperature=0), net, mode)
        if B == 1 and not args.no_uncached and "none" in nets:
            systems[(B, "tokennet fp32 (no cache)")] = (
                lambda prompt=prompt: generate(ours, prompt, n, temperature=0, use_cache=False), ours, "none")
        if hf is not None:
            def run_hf(prompt=prompt):
                with torch.inference_mode():
                    return hf.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0,
                                       attention_mask=torch.ones_like(prompt))

            systems[(B, "HF transformers fp32")] = (run_hf, hf, "none")

    outputs = {}
    for key, (f, _, _) in systems.items():  # warm-up (allocations, lazy init); keeps each system's tokens
        outputs[key] = f()
    times = {k: [] for k in systems}
    for _ in range(args.rounds):
        for key, (f, _, _) in systems.items():
            t = time.perf_counter()
            f()
            times[key].append(time.perf_counter() - t)

    # Quality: greedy tokens shared with fp32 (free-running), and teacher-forced argmax agreement.
    agree = {}
    for B in args.batches:
        ref_key = (B, "tokennet fp32")
        if ref_key not in outputs:
            continue
        ref = outputs[ref_key]
        with torch.inference_mode():
            ref_next = ours(ref[:, :-1]).logits[:, P - 1:].argmax(-1)  # (B, n)
            for key in systems:
                if key[0] != B or key == ref_key:
                    continue
                out = outputs[key]
                same = (out[:, P:P + n] == ref[:, P:P + n]).float().mean().item()
                forced = None
                if key[1].startswith("tokennet") and "no cache" not in key[1]:
                    net = systems[key][1]
                    forced = (net(ref[:, :-1]).logits[:, P - 1:].argmax(-1) == ref_next).float().mean().item()
                agree[key] = (same, forced)

    rows = []
    print(f"greedy, {n} new tokens, prompt {P}, GPT-2-shaped {SHAPE}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, CPU {cpu_model()} ({os.cpu_count()} cores), "
          f"load average before: {load_before:.2f}, after: {os.getloadavg()[0]:.2f}")
    print(f"memory bandwidth (copy, read + write): {bandwidth:.1f} GB/s; time to build the decoding copy "
          f"(fp32: packed once per model and reused until a parameter changes; bf16/int8: at every call of "
          f"generate(quantize=...)): " + ", ".join(f"{MODE_NAMES[m]} {s * 1e3:.0f} ms" for m, s in convert_s.items()))
    print()
    print("| batch | system | median s | new tokens/s | × HF fp32 | weights MB/step | ceiling tokens/s | "
          "of ceiling | same greedy tokens as fp32 | same next token (teacher-forced) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (B, name), ts in times.items():
        med = statistics.median(ts)
        tps = B * n / med
        hf_key = (B, "HF transformers fp32")
        ratio = statistics.median(times[hf_key]) / med if hf_key in times else None
        model = systems[(B, name)][1]
        wbytes = weight_bytes_per_step(model, B)
        ceiling = B * bandwidth * 1e9 / wbytes
        same, forced = agree.get((B, name), (None, None))
        rows.append({"batch": B, "system": name, "median_s": round(med, 4), "new_tokens": B * n,
                     "tokens_per_s": round(tps, 1), "vs_hf_fp32": None if ratio is None else round(ratio, 2),
                     "weight_bytes_per_step": wbytes, "ceiling_tokens_per_s": round(ceiling, 1),
                     "fraction_of_ceiling": round(tps / ceiling, 3),
                     "same_greedy_tokens_as_fp32": None if same is None else round(same, 4),
                     "same_next_token_teacher_forced": None if forced is None else round(forced, 4),
                     "all_s": [round(t, 4) for t in ts]})
        fmt = lambda v, s="{:.1%}": "—" if v is None else s.format(v)  # noqa: E731
        print(f"| {B} | {name} | {med:.3f} | {tps:,.1f} | {fmt(ratio, '{:.2f}×')} | {wbytes / 1e6:.1f} | "
              f"{ceiling:,.0f} | {tps / ceiling:.1%} | {fmt(same)} | {fmt(forced)} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "shape": SHAPE, "new_tokens": n, "prompt_len": P, "rounds": args.rounds, "rows": rows,
        "bandwidth_gb_s": round(bandwidth, 2), "convert_s": {MODE_NAMES[m]: round(s, 4) for m, s in convert_s.items()},
        "torch": torch.__version__, "threads": torch.get_num_threads(), "cpu": cpu_model(),
        "cores": os.cpu_count(), "load_average_before": load_before, "load_average_after": os.getloadavg()[0],
    }, indent=2) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
