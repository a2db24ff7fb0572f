"""A one-seed screen before a records attempt: one ``tokennet train`` process, timed as a whole, whose final metric
and evaluations are added to a screen's results file (every probe kept, with its command, commit and load).

    python bench/screen.py --out bench/results/characters-screen.json --name "dropout 0.1" --metric val_loss \\
        -- train gpt-char --data shakespeare --time-budget 820 --set dropout=0.1 --seed 0

The arguments after ``--`` are ``tokennet``'s; the run goes to a temporary directory. The file keeps one entry per
``--name`` (a probe measured again replaces its entry). Prints the probes as a table.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import commit, write  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def evaluations(log: Path, metric: str) -> list[dict]:
    """The run's evaluations from its ``log.jsonl``: the step, the metric, and the training loss logged nearest."""
    out, train_loss = [], None
    for line in log.read_text().splitlines():
        record = json.loads(line)
        if "loss" in record and "step" in record:
            train_loss = record["loss"]
        if metric in record and "step" in record:
            out.append({"step": record["step"], metric: record[metric], "train_loss": train_loss})
    return out


def probe(name: str, metric: str, args: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="tokennet-screen-") as scratch:
        out = Path(scratch) / "run"
        cmd = [sys.executable, "-m", "tokennet.cli", "-q", *args, "--out", str(out), "--no-progress"]
        load = list(os.getloadavg())
        started = time.perf_counter()
        done = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"error: tokennet {' '.join(args)} failed (exit {done.returncode}):\n"
                             f"{done.stderr[-2000:]}")
        metrics = json.loads((out / "metrics.json").read_text())
        return {"name": name, "command": "tokennet " + " ".join(args), metric: metrics.get(metric),
                "steps": metrics.get("step"), "wall_s": round(wall, 1), "load_before": load,
                "commit": commit(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "evaluations": evaluations(out / "log.jsonl", metric)}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the screen's results file (created, or a probe added to it)")
    ap.add_argument("--name", required=True, help="what this probe changes, in a few words")
    ap.add_argument("--metric", required=True, help="the metric of metrics.json the screen compares, e.g. val_loss")
    ap.add_argument("--note", default=None, help="what the screen is for (kept in the file)")
    opts = ap.parse_args(ours)
    if not args or args[0] != "train":
        print("error: give the tokennet command after --, starting with train", file=sys.stderr)
        return 2
    path = Path(opts.out)
    before = json.loads(path.read_text()) if path.is_file() else {"metric": opts.metric, "runs": []}
    if before.get("metric") != opts.metric:
        print(f"error: {path} screens {before.get('metric')}, not {opts.metric}", file=sys.stderr)
        return 2
    run = probe(opts.name, opts.metric, args)
    runs = [r for r in before["runs"] if r["name"] != opts.name] + [run]
    note = opts.note or before.get("note")
    write(path, {"benchmark": "screen", "metric": opts.metric, **({"note": note} if note else {}), "runs": runs},
          argv=argv, script="screen.py", indent=1, cpus_used=os.cpu_count())
    print(f"| probe | {opts.metric} | steps | wall s |\n| --- | ---: | ---: | ---: |")
    for r in runs:
        print(f"| {r['name']} | {r[opts.metric]} | {r['steps']} | {r['wall_s']} |")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
