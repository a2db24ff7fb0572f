"""Milliseconds a decoding step takes, eager and compiled, for imported runs — and the same for other source trees of
tokennet, measured back to back.

For each run (e.g. SmolLM2 and Gemma 3 imported from their GGUF files) and each source tree (``--src``: this
checkout by default; a ``git worktree`` of an older commit to compare against), a fresh process loads the run,
builds its decoding copy (``--quantize``, default ``auto``: int4 blocks where the block kernel runs), prefills a
short prompt and times ``--steps`` greedy steps eagerly (``forward_features`` + ``forward_head``, what ``generate``
runs without a compiled step) and through the compiled step (``sampling.CompiledStep``: built or loaded from the
step store first, not timed), ``--repeats`` times each, alternating; the median is the process's figure. Trees and
runs alternate within each round; the medians over rounds are reported, with each tree's ratio to the first's.

    python bench/decode_step.py --run /tmp/smol /tmp/gem [--src . /tmp/old] [--rounds 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _record  # noqa: E402

PROMPT = "Repeat this passage exactly: The quick brown fox jumps over the lazy dog near the river bank."

# One process's measurement: argv = run, quantize, steps, repeats, prompt; prints {"eager_ms", "compiled_ms"}.
WORKER = r"""
import json, statistics, sys, time, torch, tokennet
from tokennet import sampling
from tokennet.layers.quantize import decoding_copy, resolve_mode
run_dir, mode, steps, repeats, prompt = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
run = tokennet.load(run_dir)
model = run.model.eval()
net = decoding_copy(model, resolve_mode(model, mode))
step = sampling.CompiledStep(net)
ids = torch.tensor([run.tokenizer.encode(prompt)])

def eager(tok, caches):
    return net.forward_head(net.forward_features(tok, caches=caches))[:, -1]

def ms_per_step(fn, n):
    caches = net.make_caches(ids.shape[1] + n + 1)
    with torch.inference_mode():
        logits = net.forward_head(net.forward_features(ids, caches=caches))[:, -1]
        started = time.perf_counter()
        for _ in range(n):
            logits = fn(logits.argmax(-1, keepdim=True), caches)
    return (time.perf_counter() - started) / n * 1e3

ms_per_step(step, 2)  # built or loaded: not timed
times = {"eager_ms": [], "compiled_ms": []}
for _ in range(repeats):
    times["eager_ms"].append(ms_per_step(eager, steps))
    times["compiled_ms"].append(ms_per_step(step, steps))
print(json.dumps({k: statistics.median(v) for k, v in times.items()} | {"compiled": bool(step.compiled)}))
"""


def measure(src: Path, run: str, args) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src / "src")}
    out = subprocess.run([sys.executable, "-c", WORKER, run, args.quantize, str(args.steps), str(args.repeats),
                          PROMPT], capture_output=True, text=True, env=env, timeout=3600)
    if out.returncode:
        raise SystemExit(f"decode_step: {run} with {src} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--run", nargs="+", required=True, help="imported language-model runs")
    ap.add_argument("--src", nargs="+", type=Path, default=[_record.ROOT],
                    help="tokennet source trees (a checkout's root), the first the baseline of the ratios")
    ap.add_argument("--quantize", default="auto", help="the decoding copy's mode (generate's --quantize)")
    ap.add_argument("--steps", type=int, default=64, help="greedy steps per timing")
    ap.add_argument("--repeats", type=int, default=5, help="timings per process (median)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    for src in args.src:
        if not (src / "src" / "tokennet").is_dir():
            ap.error(f"--src {src}: not a tokennet checkout (no src/tokennet in it)")
    trees = [str(src.resolve()) for src in args.src]
    rounds = []
    for r in range(args.rounds):
        row = {}
        for run in args.run:
            order = trees if r % 2 == 0 else trees[::-1]  # the order alternates from round to round
            row[run] = {src: measure(Path(src), run, args) for src in order}
            print(f"round {r + 1} {run}: " + ", ".join(f"{src}: eager {m['eager_ms']:.2f} ms, compiled "
                                                        f"{m['compiled_ms']:.2f} ms" for src, m in row[run].items()),
                  flush=True)
        rounds.append(row)
    medians = {run: {src: {k: round(statistics.median(rd[run][src][k] for rd in rounds), 2)
                           for k in ("eager_ms", "compiled_ms")} for src in trees} for run in args.run}
    for run in args.run:
        base = medians[run][trees[0]]
        for src in trees:
            m = medians[run][src]
            m["eager_ratio"] = round(m["eager_ms"] / base["eager_ms"], 3)
            m["compiled_ratio"] = round(m["compiled_ms"] / base["compiled_ms"], 3)
            print(f"{run} {src} ({_record.commit(Path(src))}): eager {m['eager_ms']} ms ({m['eager_ratio']}x), "
                  f"compiled {m['compiled_ms']} ms ({m['compiled_ratio']}x)")
    result = {"trees": {src: _record.commit(Path(src)) for src in trees}, "rounds": rounds, "medians": medians}
    if args.out:
        import torch

        _record.write(args.out, result, settings=vars(args) | {"src": trees}, argv=argv, script="decode_step.py",
                      torch=torch.__version__, threads=torch.get_num_threads())
    return result


if __name__ == "__main__":
    main()
