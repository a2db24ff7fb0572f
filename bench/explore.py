"""``tokennet explore``'s two numbers (issue 63): from the command to an interactive page, and from a click on a
token to the redrawn attention. Writes ``bench/results/explore.json``.

Rows:

- ``startup``: the default ``vit``, ``vqa`` and ``gpt-char`` runs (each recipe's default settings, trained
  ``--max-iters 2``: what the page loads — the model, the held-out data, the first example — does not depend on how
  long it trained). ``python -m tokennet explore RUN --port P`` starts as a fresh process; seconds from its start
  until the server answers ``/api/run``, and until the page, opened in a Chromium started beforehand, is interactive
  (the first held-out example's attention drawn, ``window.explore.ready``); and the CPU seconds the server process
  used until then (``/proc/PID/stat``: what the start costs whatever else shares the cores). Goal: <= 4 s.
- ``click``: a character GPT of 4 layers × 4 heads with a context of 256, on a 240-character text (+ 16 generated:
  256 tokens): clicks on tokens as mouse events through the DevTools protocol; the page's own measure (from the
  click's handler to the end of the redraw, the request for the token's rows included) and the time seen from
  outside (from dispatching the click to the page's draw counter moving; it adds the protocol's polling). Goal:
  <= 200 ms.
- ``click-smollm2`` (``--smollm2 FILE.gguf``): the same on SmolLM2-135M (30 layers × 9 heads) and a 512-token
  prompt. Goal: <= 1 s.

    python bench/explore.py [--work DIR] [--clicks 20] [--smollm2 PATH.gguf] [--note TEXT]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import write  # noqa: E402

from tokennet.run import load  # noqa: E402
from tokennet.viz.explore.app import open_run  # noqa: E402
from tokennet.viz.explore.browser import READY, Browser, PageServer  # noqa: E402

DEFAULT_RUNS = ("vit", "vqa", "gpt-char")
CLICK_RUN = {"num_layers": 4, "num_heads": 4, "block_size": 256, "dim": 128}
VERSE = ("To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings and "
         "arrows of outrageous fortune, or to take arms against a sea of troubles, and by opposing end them. ")
TEXT = (VERSE * 2)[:240]  # 240 characters: with the 16 the page generates, 256 tokens


def _train(recipe: str, out: Path, sets: dict | None = None) -> Path:
    if not (out / "model.safetensors").is_file():
        argv = [sys.executable, "-m", "tokennet", "-q", "train", recipe, "--out", str(out), "--overwrite",
                "--max-iters", "2", "--set", "report=false", "eval_interval=0", "progress=false",
                *(f"{key}={value}" for key, value in (sets or {}).items())]
        subprocess.run(argv, check=True, capture_output=True, timeout=1800)
    return out


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux's ``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def startup(run_dir: Path, browser: Browser) -> dict:
    """Seconds from ``tokennet explore RUN`` to the server's first answer and to an interactive page."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}/"
    t0 = time.perf_counter()
    server = subprocess.Popen([sys.executable, "-m", "tokennet", "-q", "explore", str(run_dir), "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while True:
            try:
                with urllib.request.urlopen(url + "api/run", timeout=5):
                    break
            except OSError:
                if server.poll() is not None:
                    raise SystemExit(f"explore: tokennet explore {run_dir} failed: {server.stderr.read()[-500:]}") \
                        from None
                time.sleep(0.02)
        answered = time.perf_counter() - t0
        browser.goto(url)
        browser.wait_for(READY, timeout=120)
        ready = time.perf_counter() - t0
        cpu = _cpu_seconds(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=30)
    return {"server_answers_s": round(answered, 3), "interactive_s": round(ready, 3),
            "server_cpu_s": round(cpu, 2)}


def clicks(run_dir: Path, text: str, count: int, browser: Browser) -> dict:
    """Click ``count`` tokens of ``text``'s page; the page's own and the outside measure of each redraw."""
    explore = open_run(run_dir)
    with PageServer(explore) as server:
        browser.goto(server.url)
        browser.wait_for("window.explore && window.explore.ready")
        browser.evaluate(f"document.getElementById('text').value = {text!r}")
        browser.click_element("#send-text")
        browser.wait_for("window.explore.input && window.explore.input.title === 'your text' && window.explore.rows",
                         timeout=300)
        tokens = browser.evaluate("window.explore.input.tokens.length")
        shape = browser.evaluate("window.explore.input.kinds.self")
        inside, outside = [], []
        for k in range(count):
            index = (k * 37 + 5) % tokens
            draws = browser.evaluate("window.explore.draws")
            t0 = time.perf_counter()
            browser.click_element(f'.chip[data-index="{index}"]')
            browser.wait_for(f"window.explore.draws > {draws} && window.explore.query === {index}", timeout=60)
            outside.append(1000 * (time.perf_counter() - t0))
            inside.append(browser.evaluate("window.explore.lastRedrawMs"))
        if browser.console:
            raise SystemExit(f"explore: the page logged {browser.console}")
    return {"tokens": tokens, "layers": shape["layers"], "heads": shape["heads"], "clicks": count,
            "page_ms_median": round(statistics.median(inside), 1), "page_ms_max": round(max(inside), 1),
            "outside_ms_median": round(statistics.median(outside), 1), "outside_ms_max": round(max(outside), 1)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None, help="where the runs go (default: a temporary directory)")
    parser.add_argument("--clicks", type=int, default=20)
    parser.add_argument("--smollm2", type=Path, default=None, help="SmolLM2-135M's GGUF file (the click row on it)")
    parser.add_argument("--note", default="", help="a note stored with the results (e.g. what else ran)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "explore.json")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="explore-bench-"))
    load_before = os.getloadavg()  # how busy the machine was: the wall seconds are only as good as it was idle
    rows = []
    with Browser(width=1400, height=1000, timeout=120) as browser:
        for recipe in DEFAULT_RUNS:
            row = {"row": "startup", "run": recipe, **startup(_train(recipe, work / recipe), browser)}
            rows.append(row)
            print(f"{row['row']:>14} {recipe:>10}: server answers {row['server_answers_s']:.2f} s, "
                  f"interactive {row['interactive_s']:.2f} s (the server's CPU: {row['server_cpu_s']:.2f} s)",
                  flush=True)
        click_run = _train("gpt-char", work / "gpt-char-256", CLICK_RUN)
        row = {"row": "click", "run": "gpt-char 4x4, context 256", **clicks(click_run, TEXT, args.clicks, browser)}
        rows.append(row)
        print(f"{'click':>14}: {row['tokens']} tokens × {row['layers']} layers × {row['heads']} heads: page "
              f"{row['page_ms_median']:.0f} ms median ({row['page_ms_max']:.0f} max), outside "
              f"{row['outside_ms_median']:.0f} ms median", flush=True)
        if args.smollm2 is not None:
            smol = work / "smollm2"
            if not (smol / "model.safetensors").is_file():
                subprocess.run([sys.executable, "-m", "tokennet", "-q", "import", str(args.smollm2), "--out",
                                str(smol)], check=True, timeout=1800)
            words = ("the quick brown fox jumps over the lazy dog while attention looks back at every token "
                     "before it ") * 40
            tok = load(smol).tokenizer
            text = tok.decode(tok.encode(words)[:512])
            row = {"row": "click-smollm2", "run": "SmolLM2-135M, 512-token prompt",
                   **clicks(smol, text, min(args.clicks, 10), browser)}
            rows.append(row)
            print(f"{'click-smollm2':>14}: {row['tokens']} tokens × {row['layers']} × {row['heads']}: page "
                  f"{row['page_ms_median']:.0f} ms median ({row['page_ms_max']:.0f} max)", flush=True)
    busy = {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]}
    record = write(args.out, {"rows": rows, "note": args.note}, settings={"clicks": args.clicks,
                                                                        "click_run": CLICK_RUN, "text": TEXT},
                   argv=argv, load_average_1_5_15_min=busy)
    print(f"wrote {args.out}")
    return record


if __name__ == "__main__":
    main()
