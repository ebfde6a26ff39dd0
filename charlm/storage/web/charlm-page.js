// What charlm's two pages share (the served playground and the exported web page): element lookup, status lines
// and the sampling sliders' shown values. Loaded before each page's own script.
"use strict";

const $ = (id) => document.getElementById(id);

// A status line under a control; an error is shown in red.
function setStatus(id, text, isError) {
  $(id).textContent = text;
  $(id).classList.toggle("error", Boolean(isError));
}

function showSlider(id, format) {
  const update = () => { $(id + "-value").textContent = format($(id).value); };
  $(id).addEventListener("input", update);
  update();
}

// temperature, top-k (0: off), top-p and length: the sampling controls both pages have.
function showSamplingSliders() {
  showSlider("temperature", (v) => v);
  showSlider("top-k", (v) => (Number(v) === 0 ? "off" : v));
  showSlider("top-p", (v) => v);
  showSlider("length", (v) => v);
}
