"""A new user's first commands, timed from a cold start: does the fast path pay for itself from the first command?

Every command runs as a fresh process with new, empty caches (``TOKENNET_CACHE`` and ``TORCHINDUCTOR_CACHE_DIR``
in a temporary directory: nothing compiled before, no native kernel built at first use), as on a machine where
tokennet was just installed (``scripts/install.sh`` builds the int8 kernel at install; ``--no-prebuilt`` ignores
it, as a first use did before). Rows:

- ``generate``: ``tokennet generate RUN --prompt ... --max-new-tokens 16`` — the first, then the same again
  (caches now warm), then with ``--no-compile``; wall seconds of each process, start to exit;
- ``serve``: ``tokennet serve RUN`` on new caches: seconds from the process's start to the end of its first
  request (16 tokens, greedy), and to the moment ``/health`` says the compiled step is ready (the requests before
  it are decoded eagerly while it compiles in the background);
- ``train-to-sample``: ``tokennet train gpt-char`` for a few steps: seconds from the training's final record
  (``log.jsonl`` written) to the 400-character sample printed, and to the process's end (the report page is
  drawn after the summary).

Goals (issue 47): the first ``generate`` of 16 tokens on SmolLM2 <= 15 s; ``tokennet serve``'s first answer
<= 15 s after its start; a repeated short ``generate`` no slower
than ``--no-compile``; the end of training to the printed sample <= 5 s. Writes ``bench/results/first-use.json``.

    python bench/first_use.py --run runs/smollm2          # a run imported from SmolLM2's GGUF file
    python bench/first_use.py --run runs/smollm2 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import ROOT, commit, machine  # noqa: E402

PROMPT = "The capital of France is"


def _timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Wall seconds of one process (start to exit) and its stderr's last line; a failure stops the bench."""
    t0 = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
    took = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"first_use: {' '.join(argv)} failed: {out.stderr.strip().splitlines()[-1:]}")
    return took, (out.stderr.strip().splitlines() or [""])[-1]


def _fresh_env(cache: Path, prebuilt: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TOKENNET_COMPILE", "TORCHINDUCTOR_CACHE_DIR")}
    env.update(TOKENNET_CACHE=str(cache), TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"))
    if not prebuilt:
        env["TOKENNET_INT8DOT_PREBUILT"] = "0"
    return env


def generate_rows(run: str, prebuilt: bool) -> dict[str, float]:
    """The first generate on new caches, the same again, and --no-compile: wall seconds each."""
    cmd = [sys.executable, "-m", "tokennet", "-q", "generate", run, "--prompt", PROMPT, "--max-new-tokens", "16",
           "--temperature", "0"]
    with tempfile.TemporaryDirectory() as d:
        env = _fresh_env(Path(d), prebuilt)
        first, _ = _timed(cmd, env)
        again, _ = _timed(cmd, env)
        eager, _ = _timed([*cmd, "--no-compile"], env)
    return {"first": round(first, 2), "again": round(again, 2), "no_compile": round(eager, 2)}


def _post(port: int, path: str, body: dict | None = None, timeout: float = 600) -> dict:
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return json.loads(answer.read())


def serve_first_request(run: str, prebuilt: bool) -> dict[str, float]:
    """Seconds from ``tokennet serve``'s start to its first answer (16 tokens), and to its compiled step ready."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        env = _fresh_env(Path(d), prebuilt)
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "tokennet", "-q", "serve", run, "--port", str(port)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            answered = ready = None
            while ready is None and time.perf_counter() - started < 1800:
                if proc.poll() is not None:
                    raise SystemExit(f"first_use: tokennet serve {run} exited {proc.returncode}")
                try:
                    if answered is None:
                        _post(port, "/v1/completions", {"prompt": PROMPT, "max_tokens": 16, "temperature": 0})
                        answered = time.perf_counter() - started
                    if (_post(port, "/health").get("compile") or {}).get("ready", True):
                        ready = time.perf_counter() - started
                except OSError:
                    time.sleep(0.1)
                else:
                    time.sleep(0.2)
        finally:
            proc.terminate()
            proc.wait(60)
    if answered is None or ready is None:
        raise SystemExit(f"first_use: tokennet serve {run} did not answer within 1800 s")
    return {"first_answer": round(answered, 2), "compiled_ready": round(ready, 2)}


def train_to_sample(steps: int) -> dict[str, float]:
    """Seconds from gpt-char's final training record (``log.jsonl`` written) to the sample printed, and to the end
    of the process (the report page is drawn after the summary is printed)."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "run"
        env = _fresh_env(Path(d) / "cache", True)
        cmd = [sys.executable, "-m", "tokennet", "train", "gpt-char", "--out", str(out), "--max-iters", str(steps),
               "--set", "eval_interval=0", "progress=false"]
        printed = None
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env) as proc:
            for line in proc.stdout:
                if line.startswith("--- end of sample ---") and printed is None:
                    printed = time.time()
        end = time.time()
        if proc.returncode != 0 or printed is None:
            raise SystemExit(f"first_use: {' '.join(cmd)} failed (exit {proc.returncode})")
        trained = (out / "log.jsonl").stat().st_mtime
        return {"to_sample": round(printed - trained, 2), "to_exit": round(end - trained, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", help="a language-model run (e.g. SmolLM2 imported from its GGUF file)")
    p.add_argument("--rounds", type=int, default=1, help="repeat each row; the medians are reported")
    p.add_argument("--steps", type=int, default=30, help="gpt-char's training steps before the sample")
    p.add_argument("--no-prebuilt", action="store_true", help="ignore the int8 kernel built at install")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "first-use.json"))
    args = p.parse_args()
    rounds = []
    for r in range(args.rounds):
        row = {"train_to_sample_s": train_to_sample(args.steps)}
        if args.run:
            row["generate_s"] = generate_rows(args.run, not args.no_prebuilt)
            row["serve_s"] = serve_first_request(args.run, not args.no_prebuilt)
        print(f"round {r + 1}: {json.dumps(row)}", flush=True)
        rounds.append(row)
    medians = {f"train_{k}_s": statistics.median(r["train_to_sample_s"][k] for r in rounds)
               for k in ("to_sample", "to_exit")}
    if args.run:
        for k in ("first", "again", "no_compile"):
            medians[f"generate_{k}_s"] = statistics.median(r["generate_s"][k] for r in rounds)
        for k in ("first_answer", "compiled_ready"):
            medians[f"serve_{k}_s"] = statistics.median(r["serve_s"][k] for r in rounds)
    print("\n| figure | seconds (median) |\n| --- | ---: |")
    for k, v in medians.items():
        print(f"| {k} | {v:.2f} |")
    result = {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "commit": commit(),
              "machine": machine(load_avg_1min=os.getloadavg()[0]), "run": args.run, "rounds": rounds,
              "medians": medians, "prebuilt_kernel": not args.no_prebuilt}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
