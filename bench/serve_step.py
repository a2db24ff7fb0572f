"""The serving engine at one stream against ``sampling.stream``, in one process, without HTTP.

``tokennet serve`` decodes one stream with its engine's batched step (:class:`~tokennet.serve.engine.RowsStep`:
rows at their own lengths, a key mask, a symbolic cache); ``tokennet generate`` with ``sampling.stream``'s
static step. Both on the same decoding copy (``--quantize``, default int8, serve's ``auto`` on the CPU), greedy,
``--new-tokens`` each, rounds alternating (a ratio measured this way holds under a machine's load):

- ``stream``: ``sampling.stream`` as ``run.generate`` calls it;
- ``engine``: one :class:`~tokennet.serve.engine.Sequence` through a started engine (its thread, the emit
  callback a server uses), tokens/s from the first event to the last;
- ``engine + loop``: the started engine handing its events to an asyncio loop in this thread, which encodes each
  and writes it to a socket, as a server does (the two threads share the GIL; ``--switch-interval`` also runs it
  with another ``sys.setswitchinterval``);
- ``engine sync``: an engine driven in this thread (``_admit``, then ``_decode`` until done), with the
  compiled forward's own time (``forward``) apart from the rest of a step (sampling, detokenizing, bookkeeping).

Decode tokens/s = (tokens − 1) / (time of the last token − time of the first): the prefill is not counted.
Also checked (not timed): the engine's greedy tokens equal ``stream``'s.

    python bench/serve_step.py [--run DIR] [--threads 2] [--new-tokens 64] [--rounds 5] [--quantize int8]
                               [--out bench/results/serve-step.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import commit, machine  # noqa: E402

PROMPT = "The history of the printing press"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", type=Path, help="a language-model run (default: SmolLM2-135M Q4_1 imported on the fly)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quantize", default="int8")
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--switch-interval", type=float, default=0.0,
                    help="also the engine + loop with this sys.setswitchinterval (seconds; 0: not)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    import torch

    import tokennet
    from tokennet.sampling import stream
    from tokennet.serve.engine import Engine, SamplingParams, Sequence

    torch.set_num_threads(args.threads)
    tmp = None
    if args.run is None:
        from serve import find_gguf  # bench/serve.py

        tmp = tempfile.TemporaryDirectory()
        args.run = Path(tmp.name) / "model"
        subprocess.run([sys.executable, "-m", "tokennet.cli", "-q", "import", str(find_gguf(None)), "--out",
                        str(args.run)], check=True)
    run = tokennet.load(args.run)
    prompt = run.tokenizer.encode(PROMPT)
    n = args.new_tokens
    def make_engine() -> Engine:  # both engines share the copy's RowsStep, so its compiled graphs
        return Engine(run.model, run.tokenizer, max_batch=args.max_batch, quantize=args.quantize, compile=True)

    engine, sync = make_engine(), make_engine()  # started (a thread, as a server's); driven here

    def by_stream() -> tuple[list[int], list[float]]:
        toks, stamps = [], []
        for t in stream(run.model, torch.tensor([prompt]), n, temperature=0, quantize=args.quantize):
            toks.append(int(t[0]))
            stamps.append(time.perf_counter())
        return toks, stamps

    def params() -> SamplingParams:
        return SamplingParams(max_tokens=n, temperature=0)

    def by_engine() -> tuple[list[int], list[float]]:
        stamps, done = [], threading.Event()

        def emit(ev):
            stamps.append(time.perf_counter())
            if ev.finish_reason is not None:
                done.set()

        seq = Sequence(prompt, params(), emit)
        engine.submit(seq)
        assert done.wait(600)
        return seq.generated, stamps[:-1] if len(stamps) > len(seq.generated) else stamps

    def by_engine_loop() -> tuple[list[int], list[float]]:
        """As a server: the engine's thread hands each event to an asyncio loop here (``call_soon_threadsafe``),
        which encodes it and writes it to a socket (the server's per-token work, its GIL hand-offs included)."""
        import asyncio
        import socket

        async def go() -> tuple[list[int], list[float]]:
            loop, q, stamps = asyncio.get_running_loop(), asyncio.Queue(), []
            a, b = socket.socketpair()
            a.setblocking(False)
            seq = Sequence(prompt, params(), lambda ev: loop.call_soon_threadsafe(q.put_nowait, ev))
            engine.submit(seq)
            try:
                while True:
                    ev = await q.get()
                    chunk = {"id": "cmpl", "object": "text_completion", "choices": [
                        {"index": 0, "text": ev.text, "finish_reason": ev.finish_reason}]}
                    await loop.sock_sendall(a, f"data: {json.dumps(chunk)}\n\n".encode())
                    b.recv(65536)
                    if ev.finish_reason is not None:
                        break
                    stamps.append(time.perf_counter())
            finally:
                a.close()
                b.close()
            return seq.generated, stamps

        return asyncio.run(go())

    forward_s: list[float] = []

    def by_engine_sync() -> tuple[list[int], list[float]]:
        stamps = []
        seq = Sequence(prompt, params(), lambda ev: stamps.append(time.perf_counter()))
        step = sync.step

        def timed(*a):
            t = time.perf_counter()
            out = step(*a)
            forward_s.append(time.perf_counter() - t)
            return out

        sync.step = timed
        try:
            sync.submit(seq)
            with torch.inference_mode():
                sync._admit()
                while sync.running:
                    sync._decode()
        finally:
            sync.step = step
        return seq.generated, stamps[: len(seq.generated)]

    def rate(stamps: list[float]) -> float:
        return (len(stamps) - 1) / (stamps[-1] - stamps[0])

    kinds = {"stream": by_stream, "engine sync": by_engine_sync}
    tokens: dict[str, list[int]] = {}
    t0 = time.perf_counter()
    for k, f in kinds.items():  # warm: each graph compiled (or loaded from Inductor's cache), the copy built
        tokens[k] = f()[0]
    print(f"first pass (compiling or loading the one-row graphs): {time.perf_counter() - t0:.1f} s", flush=True)
    engine.start()
    kinds["engine"] = by_engine
    tokens["engine"] = by_engine()[0]
    kinds["engine + loop"] = by_engine_loop
    tokens["engine + loop"] = by_engine_loop()[0]
    if args.switch_interval:
        default = sys.getswitchinterval()

        def with_interval() -> tuple[list[int], list[float]]:
            sys.setswitchinterval(args.switch_interval)
            try:
                return by_engine_loop()
            finally:
                sys.setswitchinterval(default)

        kinds[f"engine + loop, switch {args.switch_interval * 1e3:g} ms"] = with_interval
    forward_s.clear()
    rates: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        for k, f in kinds.items():
            rates[k].append(rate(f()[1]))
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in rates.items()) + " tokens/s", flush=True)
    engine.stop()
    med = {k: statistics.median(v) for k, v in rates.items()}
    fwd = statistics.median(forward_s)
    print("\n| path | decode tokens/s (median) | ms per token | / stream |")
    print("| --- | ---: | ---: | ---: |")
    for k, v in med.items():
        print(f"| {k} | {v:.1f} | {1e3 / v:.2f} | {v / med['stream']:.2f} |")
    print(f"\nengine sync: the compiled forward {fwd * 1e3:.2f} ms of a step's {1e3 / med['engine sync']:.2f} ms")
    same = {k: tokens[k] == tokens["stream"] for k in tokens}
    print(f"greedy tokens equal to stream's: {same}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "benchmark": "serve-step", "command": " ".join(["python", "bench/serve_step.py", *sys.argv[1:]]),
            "commit": commit(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": machine(torch=torch.__version__, threads=args.threads), "run": str(args.run),
            "quantize": args.quantize, "new_tokens": n, "rounds": rates, "median_tokens_per_s": med,
            "engine_forward_ms_median": fwd * 1e3, "tokens_equal_to_stream": same}, indent=2) + "\n")
        print(f"wrote {args.out}")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
