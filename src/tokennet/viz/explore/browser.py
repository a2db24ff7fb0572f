"""Drive Debian's Chromium through its DevTools protocol: load the explore page, click it as a person would, read
what it drew, take screenshots. Used by the browser test, the bench (``bench/explore.py``) and the tutorial's
screenshots (``python -m tokennet.viz.explore.browser RUN OUT_DIR``).

Chromium is the system's (:func:`~tokennet.viz.report.browser.find_chromium`; nothing downloads a browser); the
protocol goes over a WebSocket with the ``websockets`` package (a development dependency). Every console message
and uncaught exception of the page is kept in :attr:`Browser.console`.
"""

from __future__ import annotations

import argparse
import base64
import json
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from ..report.browser import docs_image, find_chromium, new_profile, remove_profile

__all__ = ["Browser", "PageServer", "screenshots"]


class Browser:
    """A headless Chromium with one page, driven over the DevTools protocol (one command at a time)."""

    def __init__(self, *, width: int = 1400, height: int = 1000, timeout: float = 30.0):
        from websockets.sync.client import connect

        exe = find_chromium()
        if exe is None:
            raise FileNotFoundError("chromium is not installed (Debian: apt-get install chromium)")
        self.profile = new_profile()
        self.process = subprocess.Popen(
            [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
             "--disable-extensions", "--disable-background-networking", "--remote-debugging-port=0",
             f"--user-data-dir={self.profile}", f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        port = self._devtools_port(timeout)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout) as answer:
            page = next(target for target in json.load(answer) if target["type"] == "page")
        self.socket = connect(page["webSocketDebuggerUrl"], max_size=64 * 2**20).__enter__()  # closed in close()
        self.timeout, self.ids, self.console = timeout, 0, []
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def _devtools_port(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.process.stderr.readline()
            if "DevTools listening on ws://" in line:
                threading.Thread(target=self.process.stderr.read, daemon=True).start()  # keep the pipe drained
                return int(line.split("ws://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
            if not line and self.process.poll() is not None:
                break
        self.close()
        raise RuntimeError("chromium did not open its DevTools port")

    def call(self, method: str, **params) -> dict[str, Any]:
        """Send one protocol command and wait for its answer (events that arrive meanwhile are read on the way)."""
        self.ids += 1
        self.socket.send(json.dumps({"id": self.ids, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=self.timeout))
            if message.get("id") == self.ids:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self._event(message)

    def _event(self, message: dict) -> None:
        method, params = message.get("method"), message.get("params", {})
        if method == "Runtime.consoleAPICalled":
            self.console.append(f"console.{params['type']}: " + " ".join(
                str(arg.get("value", arg.get("description", ""))) for arg in params.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.console.append(f"exception: {details.get('exception', {}).get('description', details.get('text'))}")
        elif method == "Log.entryAdded":
            entry = params["entry"]
            self.console.append(f"log.{entry['level']}: {entry['text']} {entry.get('url', '')}".strip())

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float | None = None) -> Any:
        """Poll ``expression`` until it is truthy; its value."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.02)
        raise TimeoutError(f"the page never made true: {expression}")

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def click(self, x: float, y: float) -> None:
        """A left click at page coordinates ``(x, y)`` (CSS pixels), as a mouse makes it."""
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def click_element(self, selector: str, fx: float = 0.5, fy: float = 0.5) -> None:
        """Click the element ``selector`` at the fraction ``(fx, fy)`` of its box."""
        box = self.evaluate(f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
                            ".getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; })()")
        self.click(box[0] + fx * box[2], box[1] + fy * box[3])

    def choose(self, select_id: str, value: str) -> None:
        """Pick ``value`` in the ``<select id=select_id>``, as a person choosing it does (a change event)."""
        self.evaluate(f"(() => {{ const s = document.getElementById({json.dumps(select_id)}); "
                      f"s.value = {json.dumps(value)}; s.dispatchEvent(new Event('change')); }})()")

    def upload(self, selector: str, path: str | Path) -> None:
        """Choose the file ``path`` in the ``<input type=file>`` at ``selector``, as a person picking it does."""
        root = self.call("DOM.getDocument")["root"]["nodeId"]
        node = self.call("DOM.querySelector", nodeId=root, selector=selector)["nodeId"]
        self.call("DOM.setFileInputFiles", files=[str(Path(path).resolve())], nodeId=node)

    def screenshot(self, path: str | Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)

    def close(self) -> None:
        if getattr(self, "socket", None) is not None:
            self.socket.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        remove_profile(self.profile)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class PageServer:
    """The explore page of one run served on a free loopback port, in a thread of this process."""

    def __init__(self, explore):
        import socket

        import uvicorn

        from .app import create_app

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(create_app(explore), host="127.0.0.1", port=self.port,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def __enter__(self) -> PageServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the explore server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


READY = "window.explore && window.explore.ready && window.explore.draws > 0 && window.explore.rows"


def screenshots(run_dir: str | Path, out_dir: str | Path, *, name: str | None = None) -> list[Path]:
    """The tutorial's picture of one run's page (``explore-<name>.png``, a small 256-colour PNG): its first held-out
    example, a token clicked (a written token's cross-attention where the run has one, else a patch or a node of
    the picture or the graph, else a token of the text), head 1 picked and ablated."""
    from .app import open_run  # starlette and uvicorn: the serve extra

    explore = open_run(run_dir)
    out = Path(out_dir) / f"explore-{name or Path(run_dir).name}.png"
    with PageServer(explore) as server, Browser(width=1400, height=900) as browser:
        browser.goto(server.url)
        browser.wait_for(READY)
        kinds = browser.evaluate("window.explore.input.kinds")
        if "cross" in kinds:
            cross = kinds["cross"]
            browser.click_element(f'.chip[data-index="{cross["query_offset"] + min(3, cross["queries"] - 1)}"]')
            browser.wait_for(READY)
            browser.choose("kind", "cross")
        elif browser.evaluate("!!document.querySelector('#views canvas')"):
            browser.click_element("#views canvas", 0.35, 0.55)
        else:
            count = browser.evaluate("document.querySelectorAll('#views .chip').length")
            browser.click_element(f"#views .chip:nth-child({max(1, count * 2 // 3)})")
        browser.wait_for(READY)
        browser.choose("head", "1")
        browser.click_element("#ablate")
        browser.wait_for("document.getElementById('ablated').textContent.includes('ablated')")
        browser.screenshot(out)
        if browser.console:
            raise RuntimeError(f"the page logged: {browser.console}")
    docs_image(out, top=900, width=1000)
    return [out]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tokennet.viz.explore.browser",
                                     description="Screenshots of the explore page of runs, for the docs.")
    parser.add_argument("runs", nargs="+", help="run directories")
    parser.add_argument("--out", default="docs/explore", help="where the PNGs go (default docs/explore)")
    args = parser.parse_args(argv)
    for run_dir in args.runs:
        for path in screenshots(run_dir, args.out):
            print(f"{path}: {path.stat().st_size // 1024} KB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
