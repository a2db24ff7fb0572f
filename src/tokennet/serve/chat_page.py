"""``GET /``: a small self-contained chat page for ``tokennet serve``, as llama.cpp's server has.

One HTML file with its style and script inline (nothing is fetched from elsewhere). It shows the served
model's name and context, the sampling settings (temperature, top-p, top-k, max tokens, seed, a system
prompt, an API key when the server wants one), and streams each reply from the server's own
``POST /v1/chat/completions`` with ``stream: true`` (server-sent events ``data: {chunk}`` … ``data: [DONE]``),
appending every ``delta.content`` as it arrives; the conversation so far is sent with each message.
The page itself needs no key (like ``/health``); the requests it sends carry the key typed in.
"""

from __future__ import annotations

import html
import json
import re

from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

__all__ = ["chat_page", "chat_page_route", "CHAT_ENDPOINT"]

CHAT_ENDPOINT = "/v1/chat/completions"

_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>tokennet · __TITLE__</title>
<style>
  :root { font-family: system-ui, sans-serif; color: #1d2433; background: #f5f6f8; }
  body { margin: 0; display: flex; height: 100vh; }
  aside { width: 16rem; padding: 1rem; background: #fff; border-right: 1px solid #dde1e7; overflow-y: auto; }
  aside h1 { font-size: 1.05rem; margin: 0 0 .2rem; word-break: break-all; }
  aside .ctx { color: #667; font-size: .85rem; margin-bottom: 1rem; }
  aside label { display: block; font-size: .85rem; margin: .6rem 0 .15rem; }
  aside input, aside textarea { width: 100%; box-sizing: border-box; padding: .3rem; font: inherit; }
  main { flex: 1; display: flex; flex-direction: column; min-width: 0; }
  #messages { flex: 1; overflow-y: auto; padding: 1rem; }
  .msg { max-width: 48rem; margin: 0 0 .8rem; padding: .6rem .8rem; border-radius: .5rem; white-space: pre-wrap;
         word-wrap: break-word; }
  .user { background: #dbe8ff; margin-left: auto; }
  .assistant { background: #fff; border: 1px solid #dde1e7; }
  .error { background: #ffe1e1; }
  form { display: flex; gap: .5rem; padding: .8rem; border-top: 1px solid #dde1e7; background: #fff; }
  #input { flex: 1; resize: none; font: inherit; padding: .4rem; }
  button { font: inherit; padding: .4rem 1rem; }
  #status { font-size: .8rem; color: #667; padding: 0 1rem .4rem; min-height: 1em; }
</style>
</head>
<body>
<aside>
  <h1 id="model">__MODEL__</h1>
  <div class="ctx">context <span id="context">__CONTEXT__</span> tokens · tokennet serve</div>
  <label for="system">System prompt</label><textarea id="system" rows="3"></textarea>
  <label for="temperature">Temperature</label><input id="temperature" type="number" min="0" max="2" step="0.05"
    value="0.8">
  <label for="top_p">Top-p</label><input id="top_p" type="number" min="0.01" max="1" step="0.01" value="0.95">
  <label for="top_k">Top-k (0: off)</label><input id="top_k" type="number" min="0" step="1" value="0">
  <label for="max_tokens">Max tokens</label><input id="max_tokens" type="number" min="1" step="1" value="256">
  <label for="seed">Seed (empty: random)</label><input id="seed" type="number" step="1" value="">
  <label for="api_key">API key (if the server wants one)</label><input id="api_key" type="password"
    autocomplete="off">
  <p><button id="clear" type="button">New chat</button></p>
</aside>
<main>
  <div id="messages"></div>
  <div id="status"></div>
  <form id="form">
    <textarea id="input" rows="2" placeholder="Message (Enter sends, Shift+Enter: new line)"></textarea>
    <button id="send" type="submit">Send</button>
  </form>
</main>
<script>
"use strict";
const CONFIG = __CONFIG__;
const $ = (id) => document.getElementById(id);
const history = [];
let busy = null;  // the AbortController of the reply being streamed

function bubble(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  div.textContent = text;
  $("messages").appendChild(div);
  $("messages").scrollTop = $("messages").scrollHeight;
  return div;
}

function number(id, parse) {
  const v = $(id).value.trim();
  return v === "" ? null : parse(v);
}

function body() {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({role: "system", content: system});
  const b = {model: CONFIG.model, messages: messages.concat(history), stream: true,
             stream_options: {include_usage: true},
             temperature: number("temperature", parseFloat), top_p: number("top_p", parseFloat),
             max_tokens: number("max_tokens", (v) => parseInt(v, 10))};
  const k = number("top_k", (v) => parseInt(v, 10));
  if (k) b.top_k = k;
  const seed = number("seed", (v) => parseInt(v, 10));
  if (seed !== null) b.seed = seed;
  for (const key of Object.keys(b)) if (b[key] === null) delete b[key];
  return b;
}

async function send(text) {
  history.push({role: "user", content: text});
  bubble("user", text);
  const out = bubble("assistant", "");
  out.dataset.state = "streaming";
  out.dataset.chunks = "0";
  const headers = {"Content-Type": "application/json"};
  const key = $("api_key").value.trim();
  if (key) headers["Authorization"] = "Bearer " + key;
  busy = new AbortController();
  $("send").textContent = "Stop";
  $("status").textContent = "…";
  const started = performance.now();
  let reply = "", usage = null;
  try {
    const resp = await fetch(CONFIG.endpoint, {method: "POST", headers, body: JSON.stringify(body()),
                                               signal: busy.signal});
    if (!resp.ok) {
      let msg = resp.status + " " + resp.statusText;
      try { msg = (await resp.json()).error.message; } catch (e) {}
      throw new Error(msg);
    }
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buf += decoder.decode(value, {stream: true});
      let cut;
      while ((cut = buf.indexOf("\\n\\n")) >= 0) {  // one server-sent event per blank line
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of event.split("\\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message);
          if (chunk.usage) usage = chunk.usage;
          const piece = chunk.choices && chunk.choices.length ? chunk.choices[0].delta.content : null;
          if (piece) {
            reply += piece;
            out.textContent = reply;
            out.dataset.chunks = String(Number(out.dataset.chunks) + 1);
            $("messages").scrollTop = $("messages").scrollHeight;
          }
        }
      }
    }
    out.dataset.state = "done";
    const sec = (performance.now() - started) / 1000;
    $("status").textContent = usage
      ? usage.completion_tokens + " tokens in " + sec.toFixed(2) + " s (" +
        (usage.completion_tokens / sec).toFixed(1) + " tokens/s)" : "";
  } catch (e) {
    out.dataset.state = e.name === "AbortError" ? "stopped" : "error";
    if (e.name !== "AbortError") { out.classList.add("error"); out.textContent = reply + "\\n[" + e.message + "]"; }
    $("status").textContent = e.name === "AbortError" ? "stopped" : "";
  } finally {
    if (reply) history.push({role: "assistant", content: reply});
    busy = null;
    $("send").textContent = "Send";
  }
}

$("form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  if (busy) { busy.abort(); return; }
  const text = $("input").value;
  if (!text.trim()) return;
  $("input").value = "";
  send(text);
});
$("input").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("form").requestSubmit(); }
});
$("clear").addEventListener("click", () => {
  if (busy) busy.abort();
  history.length = 0;
  $("messages").textContent = "";
  $("status").textContent = "";
});
</script>
</body>
</html>
"""


def chat_page(model_name: str, context: int | None) -> str:
    """The page's HTML for the served model ``model_name`` (the name every request of the page sends)."""
    config = json.dumps({"model": model_name, "endpoint": CHAT_ENDPOINT, "context": context})
    config = config.replace("<", "\\u003c")  # a name holding "</script>" stays inside the script
    values = {"TITLE": html.escape(model_name), "MODEL": html.escape(model_name),
              "CONTEXT": "?" if context is None else f"{context:,}", "CONFIG": config}
    return re.sub(r"__(TITLE|MODEL|CONTEXT|CONFIG)__", lambda m: values[m.group(1)], _PAGE)  # one pass


def chat_page_route(model_name: str, context: int | None) -> Route:
    """``GET /`` → the chat page (made once)."""
    page = chat_page(model_name, context)

    async def index(request: Request) -> HTMLResponse:
        return HTMLResponse(page, headers={"Cache-Control": "no-cache"})

    return Route("/", index, methods=["GET"])
