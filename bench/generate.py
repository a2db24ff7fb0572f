"""Decoding speed against the memory-bandwidth limit: tokennet's modes, HF transformers and llama.cpp, batch 1 and 8.

A GPT-2-shaped model (6 layers, width 384, 6 heads, vocabulary 50304, tanh GELU) with random weights, a
16-token prompt, 256 new tokens, greedy; context 512, so that prompt + new tokens fit without a sliding
window in every system. HF ``GPT2LMHeadModel`` is built with random weights (seed 0) and tokennet's model
converted from it (``tokennet.interop.gpt2``), so all hold the same weights; llama.cpp reads them from GGUF
files tokennet writes (``tokennet.interop.gguf_out``): float32, Q8_0, and the very blocks of tokennet's
``int4`` copy (Q4_1, the head in Q8_0). Every system runs in a fresh process, the order rotated from
round to round; medians over rounds:

- tokennet ``generate`` (what ``run.generate`` and ``tokennet generate`` decode with, and their default: the
  compiled decoding step; ``--no-compile`` for eager): ``fp32`` (the packed float32 copy), ``bf16``, ``int8``,
  ``int4``, and fp32 without the KV cache (batch 1, eager);
- HF ``GPT2LMHeadModel.generate`` (its own KV cache), fp32, if installed;
- llama.cpp (``llama_cpp``, if installed) on the f32, q8_0 and q4_1 files, batch 1.

The ceiling: a decoding step reads every weight once (the LM head, 384 × 50304, is most of them), so a
decoder cannot exceed ``B × bandwidth ÷ bytes of weights read per step`` tokens/s. The bandwidth is measured
here with a large tensor copy (bytes read + bytes written per second). Each decoder's tokens/s is reported
as a fraction of its own ceiling (KV-cache reads are not counted: they are small next to the weights at these
lengths). Quality: the share of greedy tokens each system shares with tokennet fp32 (free-running), and the
share of next-token argmaxes that agree when all read one fixed random sequence (teacher-forced: no
divergence cascades; with random weights the logits are nearly flat, so this is a harsh test).

    python bench/generate.py [--rounds 3] [--new-tokens 256] [--batches 1 8] [--threads 2]
                             [--systems "tokennet int8" "llama.cpp q8_0" ...]
"""

from __future__ import annotations

import argparse
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

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/_record.py, also when a test loads this file
from _record import write  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHAPE = {"num_layers": 6, "dim": 384, "num_heads": 6, "vocab_size": 50304, "block_size": 512}
SYSTEMS = ("tokennet fp32", "tokennet bf16", "tokennet int8", "tokennet int4", "tokennet fp32 (no cache)",
           "HF transformers fp32", "llama.cpp f32", "llama.cpp q8_0", "llama.cpp q4_1")


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
    import torch

    src = torch.ones(mib * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch every page first
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        dst.copy_(src)
        ts.append(time.perf_counter() - t)
    return 2 * src.nbytes / statistics.median(ts) / 1e9


def weight_bytes_per_step(model, batch: int) -> int:
    """Bytes of weights one decoding step reads: every distinct floating-point or integer parameter/buffer, except
    that a lookup table (token or position embedding) gives one row per sequence, unless it is also a linear
    layer's weight (an LM head tied to the embedding reads it all)."""
    import torch
    from torch import nn

    from tokennet.layers.blockquant import BlockEmbedding, BlockLinear

    sizes = {id(t): t.nbytes for t in list(model.parameters()) + list(model.buffers())
             if t.is_floating_point() or t.dtype in (torch.int8, torch.uint8)}
    linear = {id(t) for m in model.modules() if isinstance(m, (nn.Linear, BlockLinear))
              for t in [*m.parameters(recurse=False), *m.buffers(recurse=False)] if t is not None}
    for m in model.modules():
        table = isinstance(m, (nn.Embedding, BlockEmbedding)) or type(m).__name__.endswith("Position")
        if not table:
            continue
        for t in [*m.parameters(recurse=False), *m.buffers(recurse=False)]:
            if t is not None and id(t) in sizes and id(t) not in linear and t.dim() == 2:
                sizes[id(t)] = batch * t[0].nbytes
    return sum(sizes.values())


def build(work: Path) -> dict[str, str]:
    """The model in every form the systems read: a tokennet run, an HF directory, three GGUF files."""
    import torch

    from tokennet.interop.gguf_out import write_gguf
    from tokennet.interop.gpt2 import convert_gpt2
    from tokennet.layers.quantize import quantize
    from tokennet.models.registry import save_pretrained
    from tokennet.run import save_tokenizer
    from tokennet.tokens.text import BPETokenizer

    # Only for the GGUF metadata llama.cpp needs: prompts are token ids, and rows past its 300 are fillers.
    tok = BPETokenizer.train(Path(__file__).read_text(), vocab_size=300)
    paths = {"run": str(work / "run"), "hf": str(work / "hf")}
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        print("transformers is not installed: `pip install transformers` to compare against it", file=sys.stderr)
        from tokennet.models import create_model

        torch.manual_seed(0)
        ours = create_model("gpt", activation="gelu_tanh", **SHAPE).eval()
        paths.pop("hf")
    else:
        cfg = GPT2Config(n_layer=SHAPE["num_layers"], n_embd=SHAPE["dim"], n_head=SHAPE["num_heads"],
                         vocab_size=SHAPE["vocab_size"], n_positions=SHAPE["block_size"], attn_pdrop=0.0,
                         resid_pdrop=0.0, embd_pdrop=0.0)
        torch.manual_seed(0)
        hf = GPT2LMHeadModel(cfg).eval()
        hf.save_pretrained(paths["hf"], safe_serialization=True)
        ours = convert_gpt2(Path(paths["hf"]), json.loads((Path(paths["hf"]) / "config.json").read_text())).model
    save_pretrained(ours, paths["run"])
    save_tokenizer(paths["run"], tok)
    if importlib.util.find_spec("gguf") is not None:
        files = (("f32", ours, "f32"), ("q8_0", ours, "q8_0"), ("q4_1", quantize(ours, "int4"), "q8_0"))
        for kind, model, ftype in files:
            paths[kind] = str(write_gguf(model, tok, work / f"m-{kind}.gguf", file_type=ftype).path)
    return paths


def worker(system: str, args) -> dict:
    """One system in this process: greedy decoding at batch ``args.batch``; JSON on stdout."""
    import torch

    torch.set_num_threads(args.threads)
    paths = json.loads(args.paths)
    B, P, n = args.batch, args.prompt_len, args.new_tokens
    prompt = torch.randint(SHAPE["vocab_size"], (B, P), generator=torch.Generator().manual_seed(B))
    forced_in = torch.randint(SHAPE["vocab_size"], (1, 128), generator=torch.Generator().manual_seed(7))
    build_s = None
    if system.startswith("tokennet"):
        import tokennet
        from tokennet.layers.quantize import decoding_copy
        from tokennet.sampling import generate

        model = tokennet.load(paths["run"]).model
        mode = {"fp32": "none"}.get(system.split()[1], system.split()[1])
        t = time.perf_counter()
        net = decoding_copy(model, mode)  # kept with the model: generate() below reuses it
        build_s = time.perf_counter() - t
        cache = "no cache" not in system
        compile_ = False if args.no_compile else None  # None: the default users get (compiled where it compiles)

        def decode():
            return generate(model, prompt, n, temperature=0, quantize=mode, use_cache=cache, compile=compile_)

        def forced():
            with torch.inference_mode():
                return net(forced_in).logits[0].float().argmax(-1).tolist()
        wbytes = weight_bytes_per_step(net, B)
    elif system.startswith("HF"):
        from transformers import GPT2LMHeadModel

        hf = GPT2LMHeadModel.from_pretrained(paths["hf"]).eval()

        def decode():
            with torch.inference_mode():
                return hf.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0,
                                   attention_mask=torch.ones_like(prompt))

        def forced():
            with torch.inference_mode():
                return hf(forced_in).logits[0].argmax(-1).tolist()
        wbytes = weight_bytes_per_step(hf, B)
    else:
        import numpy as np
        from gguf import GGUFReader
        from llama_cpp import Llama

        path = paths[system.split()[1]]
        llm = Llama(model_path=path, n_threads=args.threads, n_threads_batch=args.threads,
                    n_ctx=SHAPE["block_size"], n_batch=512, verbose=False)
        vocab = llm.n_vocab()

        def decode():
            llm.reset()
            llm.eval(prompt[0].tolist())
            out = []
            for _ in range(n):
                out.append(int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,)))))
                if len(out) < n:
                    llm.eval([out[-1]])
            return torch.cat([prompt[:1], torch.tensor([out])], 1)

        def forced():
            full = Llama(model_path=path, n_threads=args.threads, n_ctx=SHAPE["block_size"], logits_all=True,
                         verbose=False)
            full.eval(forced_in[0].tolist())
            return np.asarray(full.scores[: forced_in.shape[1]]).argmax(-1).tolist()
        reader = GGUFReader(path)
        wbytes = sum(int(t.n_bytes) for t in reader.tensors if t.name != "position_embd.weight")
    t = time.perf_counter()
    out = decode()  # warm-up (compilation, allocations); keeps the tokens
    first_s = time.perf_counter() - t
    ts = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        decode()
        ts.append(time.perf_counter() - t)
    return {"system": system, "batch": B, "median_s": statistics.median(ts), "first_call_s": first_s,
            "build_s": build_s, "weight_bytes_per_step": wbytes, "ids": out[:, P:].tolist(), "forced": forced()}


def available(system: str) -> bool:
    need = {"HF": "transformers", "llama.cpp": "llama_cpp"}.get(system.split()[0])
    return need is None or importlib.util.find_spec(need) is not None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2, help="timed repeats inside each process (median)")
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-compile", action="store_true",
                   help="tokennet eagerly (generate --no-compile); default: the compiled step, as users get")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "generate.json"))
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--paths", help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args)))
        return
    import torch

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    bandwidth = copy_bandwidth()
    tmp = tempfile.TemporaryDirectory()
    paths = build(Path(tmp.name))
    systems = [s for s in args.systems
               if available(s) and not (s.startswith("llama.cpp") and s.split()[1] not in paths)]
    for s in sorted(set(args.systems) - set(systems)):
        print(f"{s}: not installed, skipped", file=sys.stderr)
    jobs = [(B, s) for B in args.batches for s in systems
            if B == 1 or not (s.startswith("llama.cpp") or "no cache" in s)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    runs: dict[tuple[int, str], list[dict]] = {}
    for k in range(args.rounds):
        for B, system in jobs[k % len(jobs):] + jobs[: k % len(jobs)]:
            cmd = [sys.executable, __file__, "--worker", system, "--paths", json.dumps(paths), "--batch", str(B),
                   "--new-tokens", str(args.new_tokens), "--prompt-len", str(args.prompt_len), "--repeats",
                   str(args.repeats), "--threads", str(args.threads)] + (["--no-compile"] if args.no_compile else [])
            r = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if r.returncode:
                sys.exit(f"{system} (batch {B}) failed:\n{r.stderr[-3000:]}")
            res = json.loads(r.stdout.strip().splitlines()[-1])
            runs.setdefault((B, system), []).append(res)
            print(f"round {k + 1} batch {B} {system}: {B * args.new_tokens / res['median_s']:.1f} tokens/s",
                  file=sys.stderr)
    n = args.new_tokens
    print(f"greedy, {n} new tokens, prompt {args.prompt_len}, GPT-2-shaped {SHAPE}, torch {torch.__version__}, "
          f"{args.threads} threads, CPU {cpu_model()} ({os.cpu_count()} cores), {args.rounds} rounds, load average "
          f"before: {load_before:.2f}, after: {os.getloadavg()[0]:.2f}")
    print(f"memory bandwidth (copy, read + write): {bandwidth:.1f} GB/s\n")
    print("| batch | system | median s | new tokens/s | × HF fp32 | × llama.cpp (same weights) | weights MB/step | "
          "ceiling tokens/s | of ceiling | first call s | same greedy tokens as fp32 | "
          "same next token (teacher-forced) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    twin = {"tokennet fp32": "llama.cpp f32", "tokennet int8": "llama.cpp q8_0", "tokennet int4": "llama.cpp q4_1"}
    rows = []
    for (B, name), rs in runs.items():
        med = statistics.median(r["median_s"] for r in rs)
        tps = B * n / med
        hf = runs.get((B, "HF transformers fp32"))
        vs_hf = statistics.median(r["median_s"] for r in hf) / med if hf else None
        lc = runs.get((B, twin.get(name, "")))
        vs_lc = statistics.median(r["median_s"] for r in lc) / med if lc else None
        wbytes = rs[0]["weight_bytes_per_step"]
        ceiling = B * bandwidth * 1e9 / wbytes
        ref = runs.get((B, "tokennet fp32"))
        same = forced = None
        if ref and name != "tokennet fp32":
            a, b = rs[0]["ids"], ref[0]["ids"]
            same = sum(x == y for ra, rb in zip(a, b) for x, y in zip(ra, rb)) / sum(len(r) for r in b)
            forced = sum(x == y for x, y in zip(rs[0]["forced"], ref[0]["forced"])) / len(ref[0]["forced"])
        fmt = lambda v, s="{:.1%}": "—" if v is None else s.format(v)  # noqa: E731
        print(f"| {B} | {name} | {med:.3f} | {tps:,.1f} | {fmt(vs_hf, '{:.2f}×')} | {fmt(vs_lc, '{:.2f}×')} | "
              f"{wbytes / 1e6:.1f} | {ceiling:,.0f} | {tps / ceiling:.1%} | {rs[0]['first_call_s']:.1f} | "
              f"{fmt(same)} | {fmt(forced)} |")
        rows.append({"batch": B, "system": name, "median_s": round(med, 4), "tokens_per_s": round(tps, 1),
                     "vs_hf_fp32": vs_hf, "vs_llama_cpp_same_weights": vs_lc, "weight_bytes_per_step": wbytes,
                     "ceiling_tokens_per_s": round(ceiling, 1), "fraction_of_ceiling": round(tps / ceiling, 3),
                     "first_call_s": rs[0]["first_call_s"], "build_s": rs[0]["build_s"],
                     "same_greedy_tokens_as_fp32": same, "same_next_token_teacher_forced": forced,
                     "all_s": [round(r["median_s"], 4) for r in rs]})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write(out, {
        "shape": SHAPE, "new_tokens": n, "prompt_len": args.prompt_len, "rounds": args.rounds, "rows": rows,
        "bandwidth_gb_s": round(bandwidth, 2), "torch": torch.__version__, "threads": args.threads,
        "cpu": cpu_model(), "cores": os.cpu_count(), "load_average_before": load_before,
        "load_average_after": os.getloadavg()[0],
    }, settings=vars(args))
    print(f"\nwrote {out}")
    tmp.cleanup()


if __name__ == "__main__":
    main()
