"""What a bench's JSON records about where it ran: the machine and the commit (shared by the bench scripts;
a script run as ``python bench/NAME.py`` imports it from beside itself)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def machine(**extra) -> dict:
    """The CPU's model name, its count, the platform and Python (and ``extra``: e.g. torch's version, threads)."""
    cpu = platform.processor() or "unknown"
    if Path("/proc/cpuinfo").exists():
        cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), cpu)
    return {"cpu": cpu, "cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            **extra}


def commit() -> str | None:
    """``git rev-parse HEAD`` of this repository, ``+dirty`` when tracked files have uncommitted changes."""
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        return None
    return (out.stdout.strip() + ("+dirty" if dirty else "")) or None
