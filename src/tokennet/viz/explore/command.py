"""``tokennet explore RUN [--port P] [--host H]``: its flags and what it does (the CLI registers both)."""

from __future__ import annotations

import argparse

from ...device import resolve_device
from ...errors import ConfigError

__all__ = ["add_explore_parser", "explore_command"]

DESCRIPTION = (
    "Start a local page to look inside a run: pick a held-out example (or give your own text, picture, clip, "
    "graph or question), see its tokens drawn where they came from (characters or BPE pieces; patches over the "
    "picture or the spectrogram; nodes of the graph), click a token to see where it attends in every layer and "
    "head, drawn on the input itself (one head, the mean of the heads, the rollout, and all heads side by side), "
    "see the prediction (class probabilities, the answer, the continuation and each position's next-token "
    "distribution) and the prediction with one head ablated. The numbers are the model's own attention maps, "
    "the data `tokennet viz` draws. Everything the page uses is shipped in the package; nothing is fetched from "
    "the network. Runs whose model has no attention (a CNN) are refused in one line. Stop it with Ctrl-C.")


def add_explore_parser(sub) -> None:
    """Add ``explore`` to the CLI's subcommands."""
    cmd = sub.add_parser("explore", help="a local page to look inside a run: tokens, every head's attention drawn "
                         "on the input, the prediction, one head ablated", description=DESCRIPTION)
    cmd.add_argument("run_dir", help="a run directory (from `tokennet train` or `tokennet import`)")
    cmd.add_argument("--port", type=int, default=8000, help="the port (default 8000)")
    cmd.add_argument("--host", default="127.0.0.1",
                     help="the address to listen on (default 127.0.0.1: this machine only; another address exposes "
                     "the page, and the start line says so)")
    cmd.add_argument("--device", default="cpu", help="cpu (default), cuda, ...")


def explore_command(args: argparse.Namespace) -> int:
    """Load the run, say where the page is, serve it until Ctrl-C."""
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port must be in 1..65535, got {args.port}")
    try:
        from .app import exposure, open_run, run_server
    except ImportError as error:
        raise ConfigError(f"tokennet explore needs starlette and uvicorn ({error.name} is missing): "
                          "pip install 'tokennet[serve]'") from None
    explore = open_run(args.run_dir, device=str(resolve_device(args.device)))
    shown = f"[{args.host}]" if ":" in args.host else args.host
    line = f"tokennet explore: http://{shown}:{args.port}/ — {explore.run.path.name}, {explore.run.task.a_name} run"
    warning = exposure(args.host)
    print(line + (f"; {warning}" if warning else " (this machine only)") + "; Ctrl-C stops", flush=True)
    run_server(explore, host=args.host, port=args.port, log_level="warning" if args.quiet else "info")
    return 0
