"""Helpers of the OpenAI API tests (tests/serve/test_logprobs.py, ...): a tiny model and a server on a free port."""

import contextlib
import socket
import threading
import time

import torch

from tokennet.models import create_model
from tokennet.tokens.text import CharTokenizer

TOK = CharTokenizer.train("abcdefghijklmnopqrstuvwxyz .,:?!<|>_\n{}[]\"0123456789-")


def tiny_model(vocab_size: int = TOK.vocab_size, block_size: int = 128, std: float = 0.3, seed: int = 0):
    """A random ``gpt-micro`` with spread-out logits (so sampling and log probabilities vary)."""
    torch.manual_seed(seed)
    m = create_model("gpt-micro", vocab_size=vocab_size, block_size=block_size).eval()
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() > 1:
                p.normal_(0.0, std)
    return m


@contextlib.contextmanager
def running(app):
    """Serve the ASGI ``app`` with uvicorn on a free local port; yields the port."""
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    deadline = time.time() + 20
    while not srv.started:
        assert time.time() < deadline and t.is_alive(), "the server did not start"
        time.sleep(0.02)
    try:
        yield port
    finally:
        srv.should_exit = True
        t.join(10)


def client(port: int, **kw):
    import openai

    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=kw.pop("api_key", "none"), max_retries=0,
                         timeout=30, **kw)


def post(port: int, path: str, body) -> tuple[int, dict]:
    """POST ``body`` (a dict, or a str sent as is) as JSON; the status and the decoded answer."""
    import http.client
    import json

    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", path, body=body if isinstance(body, str) else json.dumps(body),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, json.loads(data) if data else None
