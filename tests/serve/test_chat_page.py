"""GET / on tokennet serve: the chat page. Served and pointing at the right endpoint (fast); in headless Chromium,
a message sent from the page comes back as a streamed reply equal to the API's (skipped without chromium)."""

import http.client
import json
import shutil
import subprocess
import time
import urllib.request

import pytest
from api_support import running, tiny_model

from tokennet.tokens.text import CharTokenizer

uvicorn = pytest.importorskip("uvicorn")
from tokennet.serve.app import create_app  # noqa: E402 - needs starlette, checked above
from tokennet.serve.chat_page import CHAT_ENDPOINT, chat_page  # noqa: E402
from tokennet.serve.engine import Engine  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
TOK = CharTokenizer.train("abcdefghijklmnopqrstuvwxyz .,:?!<|>_\n")


@pytest.fixture(scope="module")
def server():
    with running(create_app(Engine(tiny_model(TOK.vocab_size), TOK, max_batch=4), model_name="tiny-chat")) as port:
        yield port


def _get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", path)
    r = c.getresponse()
    out = r.status, r.getheader("content-type"), r.read().decode()
    c.close()
    return out


def test_page_is_served_with_the_model_and_the_endpoint(server):
    status, ctype, page = _get(server, "/")
    assert status == 200 and ctype.startswith("text/html")
    assert '<h1 id="model">tiny-chat</h1>' in page and "context <span id=\"context\">128</span>" in page
    config = json.loads(page.split("const CONFIG = ", 1)[1].split(";\n", 1)[0])
    assert config == {"model": "tiny-chat", "endpoint": CHAT_ENDPOINT, "context": 128}
    assert CHAT_ENDPOINT == "/v1/chat/completions" and "stream: true" in page
    for setting in ("temperature", "top_p", "top_k", "max_tokens", "seed", "system", "api_key"):
        assert f'id="{setting}"' in page
    assert "http://" not in page and "https://" not in page and "<link" not in page  # self-contained
    # the route the page posts to answers a streamed chat in the format the page parses
    c = http.client.HTTPConnection("127.0.0.1", server, timeout=30)
    c.request("POST", CHAT_ENDPOINT, json.dumps({"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}],
                                                 "stream": True, "max_tokens": 4, "temperature": 0}),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200 and r.getheader("content-type").startswith("text/event-stream")
    events = [ln for ln in r.read().decode().split("\n\n") if ln]
    c.close()
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)
    assert any(json.loads(e[6:])["choices"][0]["delta"].get("content") for e in events[:-1]
               if json.loads(e[6:]).get("choices"))


def test_page_escapes_the_model_name():
    page = chat_page('<b>x</b></script>"', 64)
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page
    config = page.split("const CONFIG = ", 1)[1].split(";\n", 1)[0]
    assert "</script>" not in config and json.loads(config)["model"] == '<b>x</b></script>"'


# -- headless Chromium over the DevTools protocol ---------------------------------------------------------------


def _chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


class _CDP:
    """The least of the Chrome DevTools protocol: one page target, commands by id, ``evaluate``."""

    def __init__(self, ws_url: str):
        from websockets.sync.client import connect

        self.ws = connect(ws_url, max_size=None, open_timeout=30).__enter__()
        self.n = 0

    def call(self, method: str, **params):
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=30))
            if msg.get("id") == self.n:
                assert "error" not in msg, msg
                return msg["result"]

    def evaluate(self, js: str):
        r = self.call("Runtime.evaluate", expression=js, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in r, r
        return r["result"].get("value")


@pytest.fixture
def browser(tmp_path):
    exe = _chromium()
    if exe is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    pytest.importorskip("websockets")
    profile = tmp_path / "profile"
    proc = subprocess.Popen([exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             "--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        port_file = profile / "DevToolsActivePort"
        while not (port_file.exists() and port_file.read_text().strip()):
            assert time.time() < deadline and proc.poll() is None, "chromium did not start"
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30).read())
        page = next(t for t in targets if t["type"] == "page")
        cdp = _CDP(page["webSocketDebuggerUrl"])
        yield cdp
        cdp.ws.__exit__(None, None, None)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _wait(cdp, js, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cdp.evaluate(js)
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {js}")


def test_chat_in_headless_chromium(server, browser):
    """Type a message, press Send: the reply streams in (several chunks) and equals the API's greedy reply."""
    cdp = browser
    cdp.call("Page.enable")
    cdp.call("Page.navigate", url=f"http://127.0.0.1:{server}/")
    _wait(cdp, "document.readyState === 'complete' && !!document.getElementById('send')")
    assert cdp.evaluate("document.getElementById('model').textContent") == "tiny-chat"
    cdp.evaluate("""(() => {
        document.getElementById('temperature').value = '0';
        document.getElementById('max_tokens').value = '24';
        document.getElementById('input').value = 'hello there';
        document.getElementById('send').click();
    })()""")
    state = _wait(cdp, "(() => { const m = document.querySelector('.msg.assistant');"
                       " return m && m.dataset.state !== 'streaming' ? m.dataset.state : null; })()")
    assert state == "done"
    text = cdp.evaluate("document.querySelector('.msg.assistant').textContent")
    chunks = int(cdp.evaluate("document.querySelector('.msg.assistant').dataset.chunks"))
    user = cdp.evaluate("document.querySelector('.msg.user').textContent")
    status = cdp.evaluate("document.getElementById('status').textContent")
    # the same request without streaming, from Python
    c = http.client.HTTPConnection("127.0.0.1", server, timeout=30)
    c.request("POST", CHAT_ENDPOINT, json.dumps({"model": "tiny-chat", "max_tokens": 24, "temperature": 0,
                                                 "messages": [{"role": "user", "content": "hello there"}]}),
              {"Content-Type": "application/json"})
    want = json.loads(c.getresponse().read())["choices"][0]["message"]["content"]
    c.close()
    assert user == "hello there" and text == want and len(text) > 0
    assert chunks > 1  # streamed: the reply arrived in pieces, each appended as it came
    assert "tokens in" in status  # the usage of the last chunk (stream_options.include_usage)
