// tokennet explore: the page. Plain JavaScript and canvas, nothing fetched but this server's own JSON.
// State: the run, the current input (tokens, views), the picked query token, kind, layer and head, and the
// query's attention rows (layers x heads x keys) as the server returned them. Tokens are numbered as the input
// lists them; an attention kind's queries and keys start at its query_offset and key_offset among them (an
// encoder-decoder: the source, then the target; "cross" rows are target tokens, its columns source tokens).
"use strict";
const $ = (id) => document.getElementById(id);
const state = { run: null, input: null, query: null, rows: null, rollout: null, next: null, pictures: {},
                lastRedrawMs: null, draws: 0, errors: [] };
window.explore = state;  // for tests and the bench: read-only use

async function api(path, options) {
  const response = await fetch(path, options);
  const body = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
  if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
  return body;
}

function showError(message) {
  const box = $("error");
  box.hidden = !message;
  box.textContent = message || "";
}

// A token as a chip shows it: a newline, a tab and a lone space made visible.
const visible = (label) => (label === " " ? "␣" : String(label).replace(/\n/g, "↵").replace(/\t/g, "⇥"));

function option(select, value, text) {
  const item = document.createElement("option");
  item.value = value;
  item.textContent = text;
  select.appendChild(item);
}

// -- the input ---------------------------------------------------------------------------------------------------
function customForm(accepts) {
  const box = $("custom");
  box.textContent = "";
  const add = (html) => { const div = document.createElement("div"); div.innerHTML = html; box.appendChild(div); return div; };
  if (accepts.includes("text")) {
    add('<label for="text">or your own text</label><textarea id="text"></textarea><button id="send-text" type="button">show</button>');
    $("send-text").onclick = () => pick({ text: $("text").value });
  }
  if (accepts.includes("question")) {
    add('<label for="question">your question (about the picked example, or your picture)</label>' +
        '<input id="question" type="text" style="width:100%"><button id="send-question" type="button">ask</button>');
    $("send-question").onclick = () => {
      const example = Number($("example").value || 0);
      const file = $("file") && $("file").files[0];
      if (file) upload("image", file, $("question").value); else pick({ question: $("question").value, example });
    };
  }
  if (accepts.includes("image") || accepts.includes("audio")) {
    const kind = accepts.includes("audio") ? "audio" : "image";
    add(`<label for="file">or upload ${kind === "audio" ? "a WAV clip" : "a picture (PNG, or .npy) of the model's size"}</label>` +
        `<input id="file" type="file" accept="${kind === "audio" ? ".wav,audio/*" : "image/*,.npy"}">`);
    $("file").onchange = () => {
      const file = $("file").files[0];
      if (file && !accepts.includes("question")) upload(kind, file);
    };
  }
  if (accepts.includes("graph")) {
    add('<label for="graph">or your graph as JSON</label><textarea id="graph">{"nodes": [[1], [0], [0], [1]], "edges": [[0, 1], [1, 2], [2, 3]]}</textarea>' +
        '<button id="send-graph" type="button">show</button>');
    $("send-graph").onclick = () => {
      let graph;
      try { graph = JSON.parse($("graph").value); } catch (error) { showError(`the graph is not JSON: ${error.message}`); return; }
      pick({ graph });
    };
  }
}

async function pick(fields) {
  try {
    showInput(await api("/api/input", { method: "POST", headers: { "Content-Type": "application/json" },
                                        body: JSON.stringify(fields) }));
  } catch (error) { showError(error.message); }
}

async function upload(kind, file, question) {
  const query = new URLSearchParams({ kind });
  if (question !== undefined) query.set("question", question);
  try {
    showInput(await api(`/api/upload?${query}`, { method: "POST", body: file }));
  } catch (error) { showError(error.message); }
}

function showInput(input) {
  showError("");
  state.input = input;
  $("title").textContent = "— " + input.title;
  const kinds = Object.keys(input.kinds);
  $("kind").textContent = "";
  kinds.forEach((kind) => option($("kind"), kind, kind));
  fillLayers();
  drawViews();
  showPrediction(input.prediction, $("prediction"));
  $("ablated").textContent = "";
  const shape = input.kinds[$("kind").value];
  const first = input.tokens.findIndex((token, g) => !token.hidden && g >= shape.query_offset);
  selectQuery(first < 0 ? 0 : first);
}

function showAblation() {
  const shape = state.input.kinds[$("kind").value];
  $("ablate").disabled = !shape.ablation;
  $("ablate-note").textContent = shape.ablation ? "the selected layer and head contribute nothing; the rest of the model runs as trained"
    : `this model's ${$("kind").value} attention modules do not line up one per layer: no ablation`;
}

// Whether token g is one of a kind's queries, and a key's weight by token number (null: not one of its keys).
const isQuery = (shape, g) => g >= shape.query_offset && g < shape.query_offset + shape.queries;
function weightOf(weights, g) {
  if (!weights) return null;
  const shape = state.input.kinds[$("kind").value], k = g - shape.key_offset;
  return k >= 0 && k < shape.keys ? weights[k] : null;
}

function fillLayers() {
  const shape = state.input.kinds[$("kind").value];
  const layer = $("layer"), head = $("head");
  layer.textContent = "";
  head.textContent = "";
  for (let l = 0; l < shape.layers; l++) option(layer, l, String(l));
  layer.value = String(shape.layers - 1);
  option(head, "mean", "mean of heads");
  for (let h = 0; h < shape.heads; h++) option(head, h, String(h));
  if (["self", "encoder", "decoder"].includes($("kind").value)) option(head, "rollout", "rollout (all layers)");
  head.value = "0";
  showAblation();
}

// -- drawing -----------------------------------------------------------------------------------------------------
function drawViews() {
  const views = $("views");
  views.textContent = "";
  $("prefix").textContent = "";
  state.canvases = {};
  for (const [name, view] of Object.entries(state.input.views)) {
    const box = document.createElement("div");
    box.className = "view";
    const caption = document.createElement("div");
    caption.className = "sub";
    caption.textContent = view.caption || name;
    box.appendChild(caption);
    if (view.kind === "text") {
      const chips = document.createElement("div");
      chips.className = "chips";
      chips.id = `view-${name}`;
      box.appendChild(chips);
    } else {
      const canvas = document.createElement("canvas");
      canvas.id = `view-${name}`;
      const [h, w] = view.kind === "grid" ? view.image_hw : [1, 1];
      const scale = view.kind === "grid" ? Math.max(1, Math.floor(360 / Math.max(h, w))) : 1;
      canvas.width = view.kind === "grid" ? Math.round(w * scale * (h === 1 ? 1 : 1)) : 360;
      canvas.height = view.kind === "grid" ? Math.max(Math.round(h * scale), h === 1 ? 60 : 0) : 360;
      canvas.onclick = (event) => clickCanvas(name, view, canvas, event);
      box.appendChild(canvas);
      state.canvases[name] = canvas;
      if (view.kind === "grid") {
        const image = new Image();
        image.onload = () => { state.pictures[name] = image; redraw(); };
        image.src = view.image;
      }
    }
    views.appendChild(box);
  }
  state.input.tokens.forEach((token, index) => {
    if (token.hidden) return;
    if (token.view === null || state.input.views[token.view].kind === "text") {
      const chip = document.createElement("span");
      chip.className = "chip" + (token.generated ? " generated" : "");
      chip.textContent = visible(token.label);
      chip.title = `token ${index}: ${JSON.stringify(token.label)}`;
      chip.dataset.index = index;
      chip.onclick = () => selectQuery(index);
      (token.view === null ? $("prefix") : $(`view-${token.view}`)).appendChild(chip);
    }
  });
}

function cellBox(view, cell, sx, sy) {
  const [, gw] = view.grid;
  const row = Math.floor(cell / gw), col = cell % gw;
  return [(col * view.stride[1] - view.offset[1]) * sx, (row * view.stride[0] - view.offset[0]) * sy,
          view.patch[1] * sx, view.patch[0] * sy];
}

function clickCanvas(name, view, canvas, event) {
  const rect = canvas.getBoundingClientRect();
  const x = (event.clientX - rect.left) * canvas.width / rect.width;
  const y = (event.clientY - rect.top) * canvas.height / rect.height;
  let best = null, bestDistance = Infinity;
  state.input.tokens.forEach((token, index) => {
    if (token.view !== name) return;
    let cx, cy;
    if (view.kind === "grid") {
      const [left, top, w, h] = cellBox(view, token.cell, canvas.width / view.image_hw[1], canvas.height / view.image_hw[0]);
      cx = left + w / 2; cy = top + h / 2;
    } else {
      [cx, cy] = graphPoint(view, token.cell, canvas);
    }
    const distance = (cx - x) ** 2 + (cy - y) ** 2;
    if (distance < bestDistance) { bestDistance = distance; best = index; }
  });
  if (best !== null) selectQuery(best);
}

function graphPoint(view, node, canvas, margin = 22) {
  const [x, y] = view.positions[node];
  return [margin + x * (canvas.width - 2 * margin), margin + y * (canvas.height - 2 * margin)];
}

async function selectQuery(index) {
  const started = performance.now();
  const kinds = state.input.kinds;
  if (!isQuery(kinds[$("kind").value], index)) {  // a token of another kind's queries: show that kind
    const other = Object.keys(kinds).find((kind) => isQuery(kinds[kind], index));
    if (other === undefined) return;
    $("kind").value = other;
    fillLayers();
  }
  state.query = index;
  try {
    const local = index - kinds[$("kind").value].query_offset;
    const query = new URLSearchParams({ id: state.input.id, kind: $("kind").value, query: local });
    const answer = await api(`/api/attention?${query}`);
    if (state.query !== index) return;  // a later click won
    state.rows = answer.rows;
    state.rollout = answer.rollout;
    state.next = answer.next || null;
    redraw();
    state.lastRedrawMs = performance.now() - started;
  } catch (error) { showError(error.message); }
}

// The weights the main view shows: one head's row, the mean of the heads, or the rollout row.
function shownWeights() {
  if (!state.rows) return null;
  const layer = Number($("layer").value), head = $("head").value;
  if (head === "rollout") return state.rollout;
  const heads = state.rows[layer];
  if (head === "mean") return heads[0].map((_, k) => heads.reduce((sum, row) => sum + row[k], 0) / heads.length);
  return heads[Number(head)];
}

// Orange, as opaque as the weight is large against the largest (over a picture a little less, so it shows through).
function heatColour(share, strongest = 0.95) {
  return `rgba(232, 89, 12, ${(0.05 + (strongest - 0.05) * share).toFixed(3)})`;
}

function drawView(name, view, canvas, weights, keyTokens, query) {
  const context = canvas.getContext("2d");
  context.clearRect(0, 0, canvas.width, canvas.height);
  let peak = 1e-12;
  keyTokens.forEach((token, g) => { const w = weightOf(weights, g); if (token.view === name && w !== null) peak = Math.max(peak, w); });
  if (view.kind === "grid") {
    const picture = state.pictures[name];
    if (picture) context.drawImage(picture, 0, 0, canvas.width, canvas.height);
    context.fillStyle = "rgba(0, 0, 0, 0.45)";
    context.fillRect(0, 0, canvas.width, canvas.height);
    const sx = canvas.width / view.image_hw[1], sy = canvas.height / view.image_hw[0];
    keyTokens.forEach((token, g) => {
      const w = weightOf(weights, g);
      if (token.view !== name || w === null) return;
      const share = w / peak;
      if (share < 0.02) return;
      context.fillStyle = heatColour(share, 0.8);
      context.fillRect(...cellBox(view, token.cell, sx, sy));
    });
    const picked = query !== null && state.input.tokens[query];
    if (picked && picked.view === name) {
      context.strokeStyle = "#00e5ff";
      context.lineWidth = 2;
      context.strokeRect(...cellBox(view, picked.cell, sx, sy));
    }
  } else if (view.kind === "graph") {
    const radius = Math.max(4, Math.min(12, canvas.width / 30));
    context.strokeStyle = "#9aa3b2";
    for (const [i, j] of view.edges) {
      const [x1, y1] = graphPoint(view, i, canvas), [x2, y2] = graphPoint(view, j, canvas);
      context.beginPath(); context.moveTo(x1, y1); context.lineTo(x2, y2); context.stroke();
    }
    keyTokens.forEach((token, g) => {
      if (token.view !== name) return;
      const [x, y] = graphPoint(view, token.cell, canvas), w = weightOf(weights, g);
      context.fillStyle = w !== null ? heatColour(w / peak) : "#ccd2dd";
      context.beginPath();
      if (view.marked.includes(token.cell)) context.rect(x - radius, y - radius, 2 * radius, 2 * radius);
      else context.arc(x, y, radius, 0, 2 * Math.PI);
      context.fill();
      context.strokeStyle = "#333";
      context.lineWidth = 1;
      context.stroke();
    });
    const picked = query !== null && state.input.tokens[query];
    if (picked && picked.view === name) {
      const [x, y] = graphPoint(view, picked.cell, canvas);
      context.strokeStyle = "#00b7d4"; context.lineWidth = 3;
      context.beginPath(); context.arc(x, y, radius + 4, 0, 2 * Math.PI); context.stroke();
    }
  }
}

function redraw() {
  if (!state.input) return;
  const weights = shownWeights();
  const tokens = state.input.tokens;
  for (const [name, view] of Object.entries(state.input.views)) {
    if (view.kind !== "text") drawView(name, view, state.canvases[name], weights, tokens, state.query);
  }
  let peak = 1e-12;
  tokens.forEach((token, g) => { const w = weightOf(weights, g); if (w !== null && !token.hidden) peak = Math.max(peak, w); });
  document.querySelectorAll(".chip").forEach((chip) => {
    const g = Number(chip.dataset.index), w = weightOf(weights, g);
    chip.style.background = w !== null ? heatColour(w / peak) : "";
    chip.classList.toggle("query", g === state.query);
  });
  const token = tokens[state.query];
  const head = $("head").value;
  $("query").textContent = token ? `token ${state.query}: ${JSON.stringify(token.label)} — layer ${$("layer").value}, ${head === "mean" ? "mean of heads" : head === "rollout" ? "rollout" : "head " + head}` : "";
  $("legend").textContent = weights ? `orange: how much the picked token takes from each token (scaled to the largest, ${peak.toFixed(3)}; uniform would be ${(1 / weights.length).toFixed(3)})` : "";
  drawModelView();
  showNext();
  showMeasures();
  state.draws += 1;
}

// bertviz's model view for every modality: one small picture per layer and head, the query's row in each.
function drawModelView() {
  const box = $("model-view");
  const shape = state.input.kinds[$("kind").value];
  box.style.gridTemplateColumns = `repeat(${shape.heads}, minmax(40px, 110px))`;
  if (box.childElementCount !== shape.layers * shape.heads) {
    box.textContent = "";
    for (let l = 0; l < shape.layers; l++) {
      for (let h = 0; h < shape.heads; h++) {
        const small = document.createElement("canvas");
        small.width = 110; small.height = 110;
        small.title = `layer ${l}, head ${h}`;
        small.onclick = () => { $("layer").value = String(l); $("head").value = String(h); redraw(); };
        box.appendChild(small);
      }
    }
  }
  // The small pictures draw the view the kind's keys sit on (the picture for a captioner's cross-attention).
  const keyToken = state.input.tokens.find((token, g) => token.view !== null && g >= shape.key_offset && g < shape.key_offset + shape.keys);
  const name = keyToken ? keyToken.view : Object.keys(state.input.views)[0], view = state.input.views[name];
  [...box.children].forEach((small, i) => {
    const l = Math.floor(i / shape.heads), h = i % shape.heads;
    small.classList.toggle("picked", String(l) === $("layer").value && String(h) === $("head").value);
    const weights = state.rows ? state.rows[l][h] : null;
    if (view.kind === "text") drawStrip(small, weights);
    else drawView(name, view, small, weights, state.input.tokens, state.query);
  });
}

function drawStrip(canvas, weights) {
  const context = canvas.getContext("2d");
  context.clearRect(0, 0, canvas.width, canvas.height);
  if (!weights) return;
  const n = weights.length, side = Math.ceil(Math.sqrt(n)), cell = canvas.width / side;
  const peak = Math.max(...weights, 1e-12);
  weights.forEach((w, k) => {
    context.fillStyle = heatColour(w / peak);
    context.fillRect((k % side) * cell, Math.floor(k / side) * cell, cell - 0.5, cell - 0.5);
  });
}

function bars(top) {
  const box = document.createElement("div");
  const peak = Math.max(...top.map(([, p]) => Math.abs(p)), 1e-12);
  for (const [name, p] of top) {
    const row = document.createElement("div");
    row.className = "bar";
    const label = document.createElement("span"); label.textContent = visible(name);
    const fill = document.createElement("span"); fill.className = "fill"; fill.style.width = `${(100 * Math.abs(p) / peak).toFixed(1)}%`;
    const value = document.createElement("span"); value.textContent = Number(p).toFixed(3);
    row.append(label, fill, value);
    box.appendChild(row);
  }
  return box;
}

function showPrediction(prediction, box, heading) {
  box.textContent = "";
  if (heading) { const h = document.createElement("div"); h.className = "sub"; h.textContent = heading; box.appendChild(h); }
  const text = document.createElement("div");
  text.className = "pred";
  text.textContent = prediction.text;
  box.append(text, bars(prediction.top));
}

// The run's own measures of the picked layer and head (metrics.json's NAME_layerL[_headH]), where it has them.
function showMeasures() {
  const box = $("measures"), layer = Number($("layer").value), head = $("head").value;
  box.textContent = "";
  const shown = (state.run.head_measures || []).filter((m) => m.layer === layer && (m.head === null || String(m.head) === head));
  if (!shown.length) return;
  const heading = document.createElement("h3");
  heading.textContent = `what the run measured of layer ${layer}` + (/^\d+$/.test(head) ? `, head ${head}` : "");
  box.appendChild(heading);
  for (const m of shown) {
    const row = document.createElement("div");
    row.className = "sub";
    row.textContent = `${m.name}${m.head === null ? "" : " (this head)"}: ${Number(m.value).toPrecision(4)}`;
    box.appendChild(row);
  }
}

function showNext() {
  const box = $("next");
  box.textContent = "";
  if (!state.next) return;
  const heading = document.createElement("h3");
  heading.textContent = `next token after token ${state.query} (the model's top 5)`;
  box.append(heading, bars(state.next));
}

async function ablate() {
  const head = $("head").value;
  if (!/^\d+$/.test(head)) { showError("pick one head (not the mean or the rollout) to ablate"); return; }
  try {
    const answer = await api("/api/ablate", { method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ id: state.input.id, kind: $("kind").value, layer: Number($("layer").value), head: Number(head) }) });
    const note = answer.cosine !== undefined ? ` (cosine with the model's own embedding: ${answer.cosine.toFixed(4)})` : "";
    showPrediction(answer.ablated, $("ablated"), `${answer.kind} layer ${answer.layer}, head ${answer.head} ablated${note}:`);
    showError("");
  } catch (error) { showError(error.message); }
}

// -- start -------------------------------------------------------------------------------------------------------
async function start() {
  try {
    const run = await api("/api/run");
    state.run = run;
    $("run").textContent = `${run.run} — ${run.a_task} run (${run.family})`;
    run.examples.forEach((label, i) => option($("example"), i, label));
    $("example").onchange = () => pick({ example: Number($("example").value) });
    customForm(run.accepts);
    $("kind").onchange = () => {
      fillLayers();
      const shape = state.input.kinds[$("kind").value];
      selectQuery(isQuery(shape, state.query) ? state.query : shape.query_offset);
    };
    $("layer").onchange = redraw;
    $("head").onchange = redraw;
    $("ablate").onclick = ablate;
    if (run.examples.length) { $("example").value = "0"; await pick({ example: 0 }); }
    else if (run.accepts.includes("text")) await pick({ text: "The attention of each token looks back." });
    state.ready = true;
  } catch (error) { showError(error.message); }
}
start();
