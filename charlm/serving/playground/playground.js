// charlm playground: streams completions, colours text by surprisal and draws attention maps, through the
// server's own API (/v1/completions, /v1/score, /v1/attention).
"use strict"; // after charlm-page.js: $, setStatus, showSlider

let modelName = "charlm";
let apiKey = localStorage.getItem("charlm-api-key") || "";
let running = null; // the AbortController of the completion being streamed
let attentionData = null;
let itemsModel = false; // a lines model (data.format lines): Generate makes whole items, the prompt begins each
const ITEMS_SHOWN = 10;

function headers() {
  const h = { "Content-Type": "application/json" };
  if (apiKey) h["Authorization"] = "Bearer " + apiKey;
  return h;
}

// One API call; a refused request shows the server's one-line message.
async function api(path, body) {
  const response = await fetch(path, body === undefined ? { headers: headers() }
    : { method: "POST", headers: headers(), body: JSON.stringify(body) });
  if (response.status === 401) $("key-row").hidden = false;
  if (!response.ok) {
    let message = response.status + " " + response.statusText;
    try { message = (await response.json()).error.message; } catch (e) { /* not JSON: keep the status */ }
    throw new Error(message);
  }
  return response;
}

// ---------------------------------------------------------------- tabs

for (const tab of document.querySelectorAll(".tab")) {
  tab.addEventListener("click", () => {
    for (const other of document.querySelectorAll(".tab")) other.classList.toggle("active", other === tab);
    for (const view of document.querySelectorAll(".view")) view.hidden = view.id !== "view-" + tab.dataset.view;
  });
}

// ---------------------------------------------------------------- the model

async function describeModel() {
  try {
    const card = (await (await api("/v1/models")).json()).data[0];
    modelName = card.id;
    $("model-info").textContent = `model ${card.id}: ${card.layers} layers × ${card.width} wide, context ` +
      `${card.context}, ${card.vocab_size} ${card.unit === "byte" ? "byte values" : "characters"}, ` +
      `${card.parameters.toLocaleString()} parameters`;
    $("top-k").max = card.vocab_size;
    startControls(card);
    if (card.items && !itemsModel) describeItems(card);
  } catch (e) {
    $("model-info").textContent = "cannot describe the model: " + e.message;
  }
}

// The sliders start from what a request that leaves them out gets, the model's sampling settings (or OpenAI's
// defaults under --generation-defaults openai), and the page says which: Generate then gives what the API would.
function startControls(card) {
  const d = card.sampling_defaults;
  const start = { temperature: d.temperature, "top-k": d.top_k === null ? 0 : d.top_k, "top-p": d.top_p };
  if (d.max_tokens !== null) {
    start.length = d.max_tokens;
    $("length").step = 1; // the exact default, not the nearest step of 10
    $("length").min = Math.min(Number($("length").min), d.max_tokens);
    $("length").max = Math.max(Number($("length").max), d.max_tokens);
  }
  for (const [id, value] of Object.entries(start)) {
    $(id).value = value;
    $(id).dispatchEvent(new Event("input"));
  }
  const whose = card.generation_defaults === "openai" ? "OpenAI's defaults" : "the model's sampling settings";
  $("model-info").textContent += `; the sliders start from ${whose} (temperature ${d.temperature}, top-k ` +
    `${d.top_k === null ? "off" : d.top_k}, top-p ${d.top_p}, length ${d.max_tokens})`;
}

// A lines model makes whole items, each ended by its end symbol: the prompt is an item's beginning (empty by
// default), the length slider only a cap up to the context, and Generate shows ITEMS_SHOWN items, one per line.
function describeItems(card) {
  itemsModel = true;
  $("model-info").textContent += `; makes whole items (one per line), ${ITEMS_SHOWN} per Generate`;
  for (const id of ["prompt", "score-text", "attn-prompt"]) {
    $(id).value = "";
    $(id).placeholder = id === "prompt" ? "an item's beginning (may be empty)" : "one item";
  }
  $("length").min = $("length").step = 1;
  // the longest item: the context less the start symbol; a longer default cap is held to it
  $("length").max = card.context - 1;
  $("length").value = Math.min(card.context - 1, card.sampling_defaults.max_tokens);
  $("length").dispatchEvent(new Event("input"));
}

$("save-key").addEventListener("click", () => {
  apiKey = $("api-key").value;
  localStorage.setItem("charlm-api-key", apiKey);
  $("key-row").hidden = true;
  describeModel();
});

// ---------------------------------------------------------------- generate

showSamplingSliders();

async function generate() {
  const prompt = $("prompt").value;
  const body = {
    model: modelName, prompt: prompt, stream: true,
    max_tokens: Number($("length").value),
    temperature: Number($("temperature").value),
    top_p: Number($("top-p").value),
  };
  if (Number($("top-k").value) > 0) body.top_k = Number($("top-k").value);
  if ($("seed").value !== "") body.seed = Number($("seed").value);
  if (itemsModel) body.n = ITEMS_SHOWN;
  const texts = Array(body.n || 1).fill(""); // each choice's text so far, by index
  $("output-prompt").textContent = itemsModel ? "" : prompt;
  $("continuation").textContent = "";
  $("generate").disabled = true;
  $("stop").disabled = false;
  setStatus("generate-status", "generating…");
  running = new AbortController();
  const started = performance.now();
  let count = 0;
  try {
    const response = await fetch("/v1/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(body), signal: running.signal,
    });
    if (!response.ok) {
      if (response.status === 401) $("key-row").hidden = false;
      throw new Error((await response.json()).error.message);
    }
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) { // one server-sent event
        const line = buffer.slice(0, end).trim();
        buffer = buffer.slice(end + 2);
        if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
        const chunk = JSON.parse(line.slice(6));
        if (chunk.error) throw new Error(chunk.error.message);
        for (const choice of chunk.choices) {
          texts[choice.index] += choice.text;
          count += [...choice.text].length;
        }
        $("continuation").textContent = itemsModel ? texts.map((t) => prompt + t).join("\n") : texts[0];
      }
    }
    const seconds = (performance.now() - started) / 1000;
    setStatus("generate-status", `${count} characters in ${seconds.toFixed(2)} s`);
  } catch (e) {
    if (e.name === "AbortError") setStatus("generate-status", `stopped after ${count} characters`);
    else setStatus("generate-status", e.message, true);
  } finally {
    running = null;
    $("generate").disabled = false;
    $("stop").disabled = true;
  }
}

$("generate").addEventListener("click", generate);
$("stop").addEventListener("click", () => { if (running) running.abort(); });
$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) generate();
});

// ---------------------------------------------------------------- score

const MAX_BITS = 8; // surprisal at which the colour saturates

function surpriseColour(bits) {
  const t = Math.min(1, Math.max(0, bits / MAX_BITS));
  return `hsl(${60 - 60 * t}, 100%, ${97 - 47 * t}%)`; // pale yellow (expected) to red (surprising)
}

function drawLegend() {
  const legend = $("legend");
  legend.replaceChildren();
  for (let bits = 0; bits <= MAX_BITS; bits += 2) {
    const cell = document.createElement("span");
    cell.style.background = surpriseColour(bits);
    cell.textContent = bits === MAX_BITS ? `≥${bits} bits` : `${bits} bits`;
    legend.appendChild(cell);
  }
}
drawLegend();

async function score() {
  setStatus("score-status", "scoring…");
  try {
    const result = await (await api("/v1/score", { model: modelName, text: $("score-text").value })).json();
    const view = $("score-view");
    view.replaceChildren();
    result.tokens.forEach((token, i) => {
      const span = document.createElement("span");
      const bits = result.surprisal_bits[i];
      span.textContent = token;
      span.className = "scored";
      if (bits === null) {
        span.title = "first character: nothing before it to predict from";
      } else {
        span.style.background = surpriseColour(bits);
        span.title = `${JSON.stringify(token)}: ${bits.toFixed(2)} bits`;
        span.dataset.bits = bits;
      }
      view.appendChild(span);
    });
    setStatus("score-status", `${result.bits_per_char.toFixed(3)} bits/${result.unit} ` +
      `(${result.nats_per_char.toFixed(4)} nats) over ${result.scored} predictions`);
  } catch (e) {
    setStatus("score-status", e.message, true);
  }
}
$("score").addEventListener("click", score);

// ---------------------------------------------------------------- attention

function fillSelect(select, count, label) {
  select.replaceChildren();
  for (let i = 0; i < count; i++) {
    const option = document.createElement("option");
    option.value = i;
    option.textContent = `${label} ${i}`;
    select.appendChild(option);
  }
}

function drawAttention() {
  if (!attentionData) return;
  const layer = Number($("layer").value), head = Number($("head").value);
  const weights = attentionData.weights[layer][head];
  const chars = attentionData.chars;
  const n = chars.length;
  const canvas = $("attn-canvas");
  const margin = 28, cell = Math.max(6, Math.floor((Math.min(640, 40 + n * 24) - margin) / n));
  canvas.width = canvas.height = margin + n * cell;
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "white";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  for (let i = 0; i < n; i++) {
    for (let j = 0; j < n; j++) {
      const w = weights[i][j];
      ctx.fillStyle = `rgba(30, 80, 200, ${w})`;
      ctx.fillRect(margin + j * cell, margin + i * cell, cell, cell);
    }
  }
  ctx.fillStyle = "#333";
  ctx.font = `${Math.min(14, cell)}px monospace`;
  ctx.textAlign = "center";
  const show = (c) => (c === "\n" ? "↵" : c === " " ? "·" : c);
  for (let i = 0; i < n; i++) {
    ctx.fillText(show(chars[i]), margin + i * cell + cell / 2, margin - 8); // keys across the top
    ctx.fillText(show(chars[i]), margin / 2, margin + i * cell + cell * 0.7); // queries down the side
  }
  setStatus("attention-status", `layer ${layer}, head ${head}: ${n} characters`);
}

async function attention() {
  setStatus("attention-status", "computing…");
  try {
    attentionData = await (await api("/v1/attention", { model: modelName, prompt: $("attn-prompt").value })).json();
    const keepLayer = $("layer").value, keepHead = $("head").value;
    fillSelect($("layer"), attentionData.layers.length, "layer");
    fillSelect($("head"), attentionData.heads.length, "head");
    if (keepLayer !== "" && keepLayer < attentionData.layers.length) $("layer").value = keepLayer;
    if (keepHead !== "" && keepHead < attentionData.heads.length) $("head").value = keepHead;
    drawAttention();
  } catch (e) {
    setStatus("attention-status", e.message, true);
  }
}
$("attention").addEventListener("click", attention);
$("layer").addEventListener("change", drawAttention);
$("head").addEventListener("change", drawAttention);

describeModel();
