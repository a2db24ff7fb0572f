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

Every process runs as on a user's machine, where Python keeps the bytecode of tokennet's modules: an environment
that sets ``PYTHONDONTWRITEBYTECODE`` (some sandboxes do) would time compiling ~170 modules' source in every process
(~0.3 s), so it is unset for the processes this bench starts.

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


REWRITE = ("Repeat this passage exactly, word for word.\n\nPassage: The old lighthouse stood at the edge of the cliff, "
           "its white paint peeling in long strips after a century of salt wind. Every evening the keeper climbed the "
           "one hundred and twelve steps, trimmed the wick, polished the great lens and watched the beam sweep across "
           "the water. Ships passing in the night saw the light and knew where the rocks lay. When the keeper grew too "
           "old to climb, the village children took turns, two at a time, and the light never once failed.\n\n"
           "Repeated passage: The old lighthouse")


def _fresh_process_decode(run: str, gguf: str | None, new: int) -> dict[str, float]:
    """Tokens a second of greedy decoding of ``new`` tokens after PROMPT, each system in a fresh process, timed from
    the call (the model loaded, nothing decoded yet): tokennet's ``tokennet.sampling.generate`` (the path of
    ``run.generate``: it takes a kept compiled step at once) and llama.cpp's Python binding, 2 threads."""
    ours = ("import sys, time, torch, tokennet; from tokennet.sampling import generate;"
            " run = tokennet.load(sys.argv[1]); idx = torch.tensor([run.tokenizer.encode(sys.argv[2])]);"
            " t = time.perf_counter();"
            f" out = generate(run.model, idx, {new}, temperature=0); took = time.perf_counter() - t;"
            " print((out.shape[1] - idx.shape[1]) / took)")
    theirs = ("import sys, time; sys.path.insert(0, sys.argv[3]); from _llamacpp import greedy; from llama_cpp import"
              " Llama; llm = Llama(model_path=sys.argv[1], n_threads=2, n_ctx=512, verbose=False);"
              f" ids = llm.tokenize(sys.argv[2].encode()); t = time.perf_counter(); out, _ = greedy(llm, ids, {new});"
              " print(len(out) / (time.perf_counter() - t))")
    row = {"tokennet": float(subprocess.run([sys.executable, "-c", ours, run, PROMPT], capture_output=True, text=True,
                                             check=True, env=os.environ).stdout.split()[-1])}
    if gguf:
        row["llama_cpp"] = float(subprocess.run([sys.executable, "-c", theirs, gguf, PROMPT, str(ROOT / "bench")],
                                                capture_output=True, text=True, check=True).stdout.split()[-1])
    return {k: round(v, 1) for k, v in row.items()}


def second_process(run: str, gguf: str | None, prebuilt: bool, new: int = 64) -> dict:
    """On new caches: the first ``generate`` of ``new`` tokens (it decodes eagerly and starts the builder), the
    builder's own time, then a second ``generate`` (its step loaded from the store: the seconds it took, from the
    log) and the fresh-process decoding speed against llama.cpp's."""
    cmd = [sys.executable, "-m", "tokennet", "generate", run, "--prompt", PROMPT, "--max-new-tokens", str(new),
           "--temperature", "0"]
    with tempfile.TemporaryDirectory() as d:
        env = _fresh_env(Path(d), prebuilt)
        first, _ = _timed(cmd, env)
        started = time.perf_counter()
        while list((Path(d) / "steps").glob("*.building")) and time.perf_counter() - started < 1800:
            time.sleep(1.0)
        built = time.perf_counter() - started
        t0 = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
        second = time.perf_counter() - t0
        loaded = [float(line.split(" in ")[1].split(" s")[0]) for line in out.stderr.splitlines()
                  if line.startswith("loaded the compiled decoding step")]
        old_env = dict(os.environ)
        os.environ.update(env)
        try:
            speed = _fresh_process_decode(run, gguf, new)
        finally:
            os.environ.clear()
            os.environ.update(old_env)
    return {"first_s": round(first, 2), "builder_s": round(built, 1), "second_s": round(second, 2),
            "step_loaded_s": loaded[0] if loaded else None, "tokens_per_s": speed}


def speculative_cli(run: str, new: int = 128) -> dict:
    """Whole ``tokennet generate`` processes on the rewrite prompt, greedy: plain against ``--speculative ngram``
    (same caches, warm); seconds each and whether the texts are the same."""
    cmd = [sys.executable, "-m", "tokennet", "generate", run, "--prompt", REWRITE, "--max-new-tokens", str(new),
           "--temperature", "0"]
    times, texts = {}, {}
    for name, extra in (("plain", []), ("ngram", ["--speculative", "ngram"])):
        t0 = time.perf_counter()
        out = subprocess.run([*cmd, *extra], capture_output=True, text=True, timeout=1800, check=True)
        times[name], texts[name] = round(time.perf_counter() - t0, 2), out.stdout
    same = texts["plain"] == texts["ngram"]
    return {**times, "speedup": round(times["plain"] / times["ngram"], 3), "same_text": same}


def serve_window(run: str, streams: int, compile: bool, prebuilt: bool, seconds: float = 120.0) -> dict:
    """Tokens a second ``tokennet serve`` gives ``streams`` clients sending greedy 64-token completions back to back
    over the first ``seconds`` after it answers ``/v1/models``, on new caches; ``--no-compile`` when not
    ``compile``. Also whether the compiled step became ready within the window."""
    import socket
    import threading

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        env = _fresh_env(Path(d), prebuilt)
        argv = [sys.executable, "-m", "tokennet", "-q", "serve", run, "--port", str(port)]
        proc = subprocess.Popen([*argv, *([] if compile else ["--no-compile"])], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while True:
                if proc.poll() is not None:
                    raise SystemExit(f"first_use: tokennet serve {run} exited {proc.returncode}")
                try:
                    _post(port, "/v1/models")
                    break
                except OSError:
                    time.sleep(0.2)
            end = time.perf_counter() + seconds
            counts = [0] * streams

            def client(i: int) -> None:
                while time.perf_counter() < end:
                    answer = _post(port, "/v1/completions", {"prompt": f"{PROMPT} ({i})", "max_tokens": 64,
                                                             "temperature": 0})
                    if time.perf_counter() <= end:
                        counts[i] += answer["usage"]["completion_tokens"]

            threads = [threading.Thread(target=client, args=(i,)) for i in range(streams)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            ready = (_post(port, "/health").get("compile") or {}).get("ready", False)
        finally:
            proc.terminate()
            proc.wait(60)
    return {"tokens_per_s": round(sum(counts) / seconds, 2), "compiled_ready": bool(ready)}


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


ROWS = ("train", "generate", "serve", "second-process", "serve-window", "speculative-cli")


def _round(args) -> dict:
    """One round of the rows asked for."""
    row, prebuilt = {}, not args.no_prebuilt
    if "train" in args.rows:
        row["train_to_sample_s"] = train_to_sample(args.steps)
    if args.run and "generate" in args.rows:
        row["generate_s"] = generate_rows(args.run, prebuilt)
    if args.run and "serve" in args.rows:
        row["serve_s"] = serve_first_request(args.run, prebuilt)
    if args.run and "second-process" in args.rows:
        row["second_process"] = second_process(args.run, args.gguf, prebuilt)
    if args.run and "serve-window" in args.rows:
        row["serve_window"] = {f"{mode} {n}": serve_window(args.run, n, mode == "compile", prebuilt, args.window)
                               for n in args.streams for mode in ("compile", "no-compile")}
    if args.run and "speculative-cli" in args.rows:
        row["speculative_cli"] = speculative_cli(args.run)
    return row


def _medians(rounds: list[dict]) -> dict[str, float]:
    """The median of every number of the rounds, by its path (``second_process.tokens_per_s.tokennet``)."""
    def leaves(d: dict, prefix: str = ""):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from leaves(v, f"{prefix}{k}.")
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                yield f"{prefix}{k}", v

    values: dict[str, list[float]] = {}
    for r in rounds:
        for k, v in leaves(r):
            values.setdefault(k, []).append(v)
    return {k: round(statistics.median(v), 3) for k, v in values.items()}


def main() -> None:
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # a user's Python keeps the bytecode (the module docstring)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", help="a language-model run (e.g. SmolLM2 imported from its GGUF file)")
    p.add_argument("--gguf", help="the GGUF file the run was imported from: llama.cpp's side of second-process")
    p.add_argument("--rounds", type=int, default=1, help="repeat each row; the medians are reported")
    p.add_argument("--rows", nargs="+", choices=ROWS, default=["train", "generate", "serve"],
                   help="which figures to measure (default: train generate serve)")
    p.add_argument("--streams", type=int, nargs="+", default=[1, 4], help="serve-window's concurrent clients")
    p.add_argument("--window", type=float, default=120.0, help="serve-window's seconds after the server answers")
    p.add_argument("--steps", type=int, default=30, help="gpt-char's training steps before the sample")
    p.add_argument("--no-prebuilt", action="store_true", help="ignore the int8 kernel built at install")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "first-use.json"))
    args = p.parse_args()
    rounds = []
    for r in range(args.rounds):
        rounds.append(_round(args))
        print(f"round {r + 1}: {json.dumps(rounds[-1])}", flush=True)
    medians = _medians(rounds)
    print("\n| figure | median |\n| --- | ---: |")
    for k, v in medians.items():
        print(f"| {k} | {v} |")
    result = {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "commit": commit(),
              "machine": machine(load_avg_1min=os.getloadavg()[0]), "run": args.run, "rounds": rounds,
              "medians": medians, "prebuilt_kernel": not args.no_prebuilt}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
