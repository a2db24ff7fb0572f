"""What a bench's JSON records about where it ran: the machine and the commit (shared by the bench scripts;
a script run as ``python bench/NAME.py`` imports it from beside itself)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def machine(**extra) -> dict:
    """The CPU's model name, its count, the platform and Python (and ``extra``: e.g. torch's version, threads)."""
    cpu = platform.processor() or "unknown"
    if Path("/proc/cpuinfo").exists():
        cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), cpu)
    return {"cpu": cpu, "cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            **extra}


def commit(root: Path = ROOT) -> str | None:
    """``git rev-parse HEAD`` of this repository (or of the checkout at ``root``), ``+dirty`` when tracked files have
    uncommitted changes."""
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        return None
    return (out.stdout.strip() + ("+dirty" if dirty else "")) or None


def command(argv: list[str] | None = None, script: str | None = None) -> str:
    """How the bench was run: ``python bench/NAME.py ARGS`` (``argv`` when ``main`` was called with one)."""
    name = script or Path(sys.argv[0]).name
    return " ".join(["python", f"bench/{name}", *(sys.argv[1:] if argv is None else [str(a) for a in argv])])


def write(path: str | Path, results: dict, *, settings: dict | None = None, argv: list[str] | None = None,
          script: str | None = None, indent: int = 2, **machine_extra) -> dict:
    """Write a bench's JSON to ``path`` and return it: the command, the commit, the date, the machine (with
    ``machine_extra``, and any ``machine`` dict of ``results`` merged in), the settings, then ``results``' own
    keys. Values JSON cannot hold (paths) are written as strings."""
    results = dict(results)
    record = {"command": results.pop("command", None) or command(argv, script), "commit": commit(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": {**machine(**machine_extra), **(results.pop("machine", None) or {})}}
    if settings is not None:
        record["settings"] = settings
    record.update(results)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")  # written aside, then swapped in: a crash mid-write
    tmp.write_text(json.dumps(record, indent=indent, default=str) + "\n")  # never leaves a half file (records.json
    os.replace(tmp, path)  # holds every attempt's history)
    return record


def between_markers(text: str, begin: str, end: str, body: str) -> str:
    """``text`` (a README) with what stands between its ``begin`` and ``end`` marker lines replaced by ``body``: a
    table rendered from a results file, never edited by hand."""
    head, found_begin, rest = text.partition(begin)
    _, found_end, tail = rest.partition(end)
    if not (found_begin and found_end):
        raise SystemExit(f"no {begin} ... {end} block to render into")
    return f"{head}{begin}\n{body}\n{end}{tail}"
