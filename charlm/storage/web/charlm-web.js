// charlm's web page: generates text in the browser with onnxruntime-web from the ONNX export beside it, with
// charlm's windowing policy and sampling filters (docs/export.md says how it differs from `charlm sample`).
"use strict"; // after charlm-page.js: $, setStatus, showSlider

const EMPTY = -(2n ** 40n); // a cache slot no position has written: attention's mask hides it
let model = null; // what loadModel() read: the session, the config, the vocabulary
let stopRequested = false;

// ---------------------------------------------------------------- loading

async function fetchFile(name, kind) {
  let response;
  try {
    response = await fetch(name);
  } catch (e) {
    throw new Error(`${name} cannot be read (${e.message}): open this page from a web server ` +
      "(python -m http.server in its folder), not from a file");
  }
  if (!response.ok) {
    throw new Error(`${name} is missing from this folder (HTTP ${response.status}): ` +
      "export it again with charlm export CKPT DIR --web");
  }
  return kind === "json" ? response.json() : new Uint8Array(await response.arrayBuffer());
}

async function loadModel() {
  if (typeof ort === "undefined") {
    throw new Error(`onnxruntime-web did not load from ${window.ORT_BASE}: check the network, or export with ` +
      "--runtime DIR to bundle it");
  }
  const config = await fetchFile("config.json", "json");
  const vocab = await fetchFile("vocab.json", "json");
  const graph = config.onnx.graphs.model;
  const bytes = await fetchFile(graph.file, "bytes");
  // One thread: threads need cross-origin isolation headers, which plain static hosts do not send.
  ort.env.wasm.numThreads = 1;
  ort.env.wasm.wasmPaths = new URL(window.ORT_BASE, document.baseURI).href;
  const session = await ort.InferenceSession.create(bytes, { executionProviders: ["wasm"] });
  const byteModel = Boolean(vocab.bytes);
  const chars = byteModel ? null : vocab.chars;
  const ids = byteModel ? null : new Map(chars.map((c, i) => [c, i]));
  return { session, config, chars, ids, byteModel, shift: graph.inputs.includes("shift") };
}

// ---------------------------------------------------------------- the step and its state

function zeros(dims) {
  return new ort.Tensor("float32", new Float32Array(dims.reduce((a, b) => a * b, 1)), dims);
}

// A fresh text's state: every slot empty, token shift's memory zeros (models/onnx_graphs.py's layout).
function emptyState() {
  const c = model.config.model;
  const dims = [c.n_layer, 1, c.n_head, c.block_size, c.n_embd / c.n_head];
  const state = {
    cache_k: zeros(dims), cache_v: zeros(dims),
    cache_pos: new ort.Tensor("int64", new BigInt64Array(c.block_size).fill(EMPTY), [c.block_size]),
  };
  if (model.shift) state.shift = zeros([c.n_layer + 1, 1, c.n_embd]);
  return state;
}

// Logits of the last of `ids` (new characters from position `start`) and the next state.
async function step(ids, start, state) {
  const feeds = {
    ids: new ort.Tensor("int64", BigInt64Array.from(ids, (i) => BigInt(i)), [1, ids.length]),
    start: new ort.Tensor("int64", BigInt64Array.from([BigInt(start)]), [1]),
    ...(state || emptyState()),
  };
  const out = await model.session.run(feeds);
  const [, T, V] = out.logits.dims;
  const next = { cache_k: out.new_cache_k, cache_v: out.new_cache_v, cache_pos: out.new_cache_pos };
  if (model.shift) next.shift = out.new_shift;
  return [out.logits.data.slice((T - 1) * V, T * V), next];
}

// charlm's windowing policy (charlm/decoding/window.py's ContextWindow): relative positions roll, absolute ones
// jump forward to the last block_size / 2 characters, re-encoded.
class ContextWindow {
  constructor(window) {
    Object.assign(this, { relative: window.relative, reach: window.reach, block: window.block_size, start: 0 });
  }
  windowStart(length, start) {
    return length - start > this.block ? length - Math.max(1, Math.floor(this.block / 2)) : start;
  }
  advance(length) {
    this.start = this.relative ? Math.max(0, length - this.reach) : this.windowStart(length, this.start);
    return this.start;
  }
  jumps(length) { return !this.relative && this.windowStart(length, this.start) !== this.start; }
  position(start) { return this.relative ? start : 0; }
}

// ---------------------------------------------------------------- sampling, as charlm/decoding/sampling.py

// mulberry32: a small seeded generator of 32-bit numbers (torch's generator cannot be reproduced here).
function seededRandom(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function argmax(values) {
  let best = 0;
  for (let i = 1; i < values.length; i++) if (values[i] > values[best]) best = i; // the first of equals, as torch
  return best;
}

function softmax(values) {
  const top = Math.max(...values);
  const e = values.map((v) => (v === -Infinity ? 0 : Math.exp(v - top)));
  const sum = e.reduce((a, b) => a + b, 0);
  return e.map((v) => v / sum);
}

// Temperature, then top-k (ties with the k-th kept), then top-p (the smallest set reaching p, always the most
// likely), then the draw argmax(p / q), q ~ Exp(1): torch.multinomial's own algorithm.
function choose(logits, options, random) {
  if (options.temperature === 0) return argmax(logits);
  let z = Array.from(logits, (v) => v / Math.max(options.temperature, 1e-6));
  if (options.topK > 0 && options.topK < z.length) {
    const kth = [...z].sort((a, b) => b - a)[options.topK - 1];
    z = z.map((v) => (v < kth ? -Infinity : v));
  }
  if (options.topP < 1) {
    const order = z.map((_, i) => i).sort((a, b) => z[b] - z[a]);
    const probs = softmax(order.map((i) => z[i]));
    let before = 0;
    const dropped = new Set();
    order.forEach((i, rank) => {
      if (rank > 0 && before >= options.topP) dropped.add(i);
      before += probs[rank];
    });
    z = z.map((v, i) => (dropped.has(i) ? -Infinity : v));
  }
  const p = softmax(z);
  let best = 0;
  let bestScore = -1;
  for (let i = 0; i < p.length; i++) {
    const q = -Math.log(1 - random()); // Exp(1); 1 - u is in (0, 1]
    const score = p[i] / q;
    if (score > bestScore) { best = i; bestScore = score; }
  }
  return best;
}

// The stop-string rule of charlm/decoding/stops.py: the text ends just before the first stop string.
class StopStrings {
  constructor(stops) { this.stops = stops.filter((s) => s); this.held = ""; this.stopped = false; }
  feed(text) {
    if (!this.stops.length) return text;
    this.held += text;
    const found = this.stops.map((s) => this.held.indexOf(s)).filter((at) => at >= 0);
    if (found.length) {
      this.stopped = true;
      const passed = this.held.slice(0, Math.min(...found));
      this.held = "";
      return passed;
    }
    for (const s of this.stops) for (let k = 1; k < s.length; k++) if (this.held.endsWith(s.slice(0, k))) return "";
    const passed = this.held;
    this.held = "";
    return passed;
  }
}

// ---------------------------------------------------------------- characters

function encode(text) {
  if (model.byteModel) return Array.from(new TextEncoder().encode(text));
  const unknown = [...new Set([...text].filter((c) => !model.ids.has(c)))];
  if (unknown.length) {
    throw new Error("the prompt has characters the model has never seen: " +
      unknown.slice(0, 10).map((c) => JSON.stringify(c)).join(", "));
  }
  return [...text].map((c) => model.ids.get(c));
}

function textDecoder() {
  if (!model.byteModel) return { feed: (id) => model.chars[id], flush: () => "" };
  const bytes = new TextDecoder("utf-8"); // whole characters only, as charlm's stream decoder
  return { feed: (id) => bytes.decode(new Uint8Array([id]), { stream: true }), flush: () => bytes.decode() };
}

// ---------------------------------------------------------------- the page

showSamplingSliders();

const channel = new MessageChannel(); // a task boundary without setTimeout's 4 ms clamp: the page paints
function yieldToPage() {
  return new Promise((resolve) => { channel.port1.onmessage = () => resolve(); channel.port2.postMessage(null); });
}

async function generate() {
  const prompt = $("prompt").value;
  const options = {
    temperature: Number($("temperature").value), topK: Number($("top-k").value), topP: Number($("top-p").value),
  };
  const length = Number($("length").value);
  const seed = $("seed").value === "" ? crypto.getRandomValues(new Uint32Array(1))[0] : Number($("seed").value);
  const random = seededRandom(seed);
  const stops = new StopStrings([$("stop-at").value.replaceAll("\\n", "\n")]);
  $("continuation").textContent = "";
  let tokens;
  try {
    if (!prompt) throw new Error("the prompt is empty; give at least one character");
    tokens = encode(prompt);
  } catch (e) {
    setStatus("generate-status", e.message, true);
    return;
  }
  $("output-prompt").textContent = prompt;
  $("generate").disabled = true;
  $("stop").disabled = false;
  stopRequested = false;
  setStatus("generate-status", "generating…");
  const window = new ContextWindow(model.config.onnx.window);
  const decoder = textDecoder();
  const started = performance.now();
  let state = null;
  let position = 0;
  let count = 0;
  try {
    for (let n = tokens.length; count < length && !stops.stopped && !stopRequested; n++) {
      let logits;
      if (state === null || window.jumps(n)) { // a first chunk, or a window that jumped: encoded afresh
        const first = window.advance(n);
        position = window.position(first);
        [logits, state] = await step(tokens.slice(first, n), position, null);
        position += n - first;
      } else {
        [logits, state] = await step([tokens[n - 1]], position, state);
        position += 1;
      }
      const id = choose(logits, options, random);
      tokens.push(id);
      count += 1;
      const passed = stops.feed(decoder.feed(id));
      if (passed) $("continuation").textContent += passed;
      await yieldToPage();
    }
    if (!stops.stopped) $("continuation").textContent += stops.feed(decoder.flush()) + (stops.stopped ? "" : stops.held);
    const seconds = (performance.now() - started) / 1000;
    const rate = count / Math.max(seconds, 1e-9);
    $("generate-status").dataset.charsPerS = rate.toFixed(1);
    setStatus("generate-status", `${count} characters in ${seconds.toFixed(2)} s (${rate.toFixed(1)} chars/s), seed ${seed}`);
  } catch (e) {
    setStatus("generate-status", "generation failed: " + e.message, true);
  } finally {
    $("generate").disabled = false;
    $("stop").disabled = true;
  }
}

$("generate").addEventListener("click", generate);
$("stop").addEventListener("click", () => { stopRequested = true; });

loadModel().then((loaded) => {
  model = loaded;
  const m = model.config.model;
  const unit = model.byteModel ? "byte values" : "characters";
  const size = model.byteModel ? 256 : model.chars.length;
  $("model-info").textContent = `${m.n_layer} layers × ${m.n_embd} wide, ${m.n_head} heads, context ` +
    `${m.block_size}, ${size} ${unit}, trained ${model.config.step.toLocaleString()} steps on ` +
    `${model.config.data.path}`;
  $("top-k").max = size;
  $("generate").disabled = false;
  setStatus("generate-status", "ready");
}, (e) => {
  $("model-info").textContent = "no model";
  setStatus("generate-status", e.message, true);
});
