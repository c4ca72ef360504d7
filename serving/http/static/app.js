// graft chat page: a plain OpenAI-API client in the browser (no framework, no build step).
// Streams /v1/chat/completions, shows TTFT and tokens/s, reads /metrics to tell whether the
// image came from the server's encoder cache, and keeps the chat in localStorage. Stop
// aborts the fetch: the server sees the client go and aborts the request at its next step.
"use strict";

const $ = (id) => document.getElementById(id);
const STORE = "graft-chat";  // localStorage key: messages and settings (never the API key)
const SETTINGS = { system: "system", maxTokens: "max-tokens", temperature: "temperature", extra: "extra" };
// messages: the OpenAI messages so far (user content may hold an image_url part)
const chat = { messages: [], image: null, controller: null, model: "", busy: false };

function status(text) { $("status").textContent = text; }

function save() {
  const settings = Object.fromEntries(Object.entries(SETTINGS).map(([k, id]) => [k, $(id).value]));
  const state = { messages: chat.messages, settings, model: $("model").value || chat.model };
  try {
    localStorage.setItem(STORE, JSON.stringify(state));
  } catch (err) {  // over the quota (images are data: URLs): keep the text, drop the images
    const textOnly = chat.messages.map((m) => (Array.isArray(m.content)
      ? { ...m, content: m.content.filter((p) => p.type === "text") } : m));
    try { localStorage.setItem(STORE, JSON.stringify({ ...state, messages: textOnly })); } catch (e) { /* full */ }
    status("history saved without its images (browser storage is full)");
  }
}

function restore() {
  let state = null;
  try { state = JSON.parse(localStorage.getItem(STORE) || "null"); } catch (err) { state = null; }
  if (!state) return;
  chat.messages = Array.isArray(state.messages) ? state.messages : [];
  chat.model = state.model || "";
  for (const [k, id] of Object.entries(SETTINGS)) {
    if (state.settings && state.settings[k] !== undefined) $(id).value = state.settings[k];
  }
  render();
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("key").value.trim();
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

async function errorText(response) {
  const body = await response.json().catch(() => ({}));
  return body.error ? body.error.message : `HTTP ${response.status}`;
}

async function loadModels() {
  try {
    const r = await fetch("v1/models", { headers: headers() });
    if (!r.ok) throw new Error(await errorText(r));
    const models = (await r.json()).data.map((m) => m.id);
    const select = $("model");
    const keep = select.value || chat.model;
    select.replaceChildren(...models.map((id) => new Option(id, id)));
    if (models.includes(keep)) select.value = keep;
    $("model-label").hidden = models.length < 2;  // a picker only when there is a choice
    status(`${models.length} model(s) served: ${models.join(", ")}`);
  } catch (err) {
    status("could not list the models: " + err.message);
  }
}

// Encoder-cache hits of one graft from the Prometheus text (null when /metrics is closed).
async function cacheHits(model) {
  try {
    const r = await fetch("metrics", { headers: headers() });
    if (!r.ok) return null;
    const text = await r.text();
    const name = model.replace(/[\\"]/g, "\\$&");
    for (const line of text.split("\n")) {
      if (line.startsWith("graft_per_graft_encoder_cache_hits{") && line.includes(`graft="${name}"`)) {
        return Number(line.trim().split(/\s+/).pop());
      }
    }
  } catch (err) { /* no metrics: the page simply does not say */ }
  return null;
}

function textOf(message) {
  return Array.isArray(message.content)
    ? message.content.filter((p) => p.type === "text").map((p) => p.text).join("\n") : message.content;
}

function imageOf(message) {
  const part = Array.isArray(message.content) && message.content.find((p) => p.type === "image_url");
  return part ? part.image_url.url : null;
}

function bubble(role, text, image) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  if (image) {
    const img = document.createElement("img");
    img.src = image;
    div.append(img);
  }
  const body = document.createElement("div");
  div.append(body);
  show(body, role, text);
  $("log").append(div);
  div.scrollIntoView({ block: "end" });
  return { div, body };
}

function show(body, role, text) {
  if (role === "assistant") body.replaceChildren(renderMarkdown(text));
  else body.textContent = text;
}

function actions(div, index) {
  const bar = document.createElement("div");
  bar.className = "actions";
  const copy = document.createElement("button");
  copy.type = "button";
  copy.className = "copy";
  copy.textContent = "copy";
  copy.onclick = () => copyText(chat.messages[index].content, copy);
  bar.append(copy);
  if (index === chat.messages.length - 1) {
    const again = document.createElement("button");
    again.type = "button";
    again.className = "regenerate";
    again.textContent = "regenerate";
    again.onclick = regenerate;
    bar.append(again);
  }
  div.append(bar);
}

async function copyText(text, button) {
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = "copied";
  } catch (err) {
    status("could not copy (the browser refused the clipboard): select the text instead");
  }
}

function render() {
  $("log").replaceChildren();
  chat.messages.forEach((m, i) => {
    const { div } = bubble(m.role, textOf(m), imageOf(m));
    if (m.role === "assistant") actions(div, i);
  });
}

// Reads an SSE stream; calls onChunk(parsed JSON) per `data:` event until [DONE].
async function readEvents(response, onChunk) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffered = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffered += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffered.indexOf("\n\n")) >= 0) {
      const event = buffered.slice(0, end);
      buffered = buffered.slice(end + 2);
      for (const line of event.split("\n")) {
        const data = line.startsWith("data:") ? line.slice(5).trim() : null;
        if (data && data !== "[DONE]") onChunk(JSON.parse(data));
      }
    }
  }
}

function extraFields() {
  const raw = $("extra").value.trim();
  if (!raw) return {};
  const parsed = JSON.parse(raw);  // a SyntaxError names the problem; shown as the answer's error
  if (typeof parsed !== "object" || Array.isArray(parsed)) throw new Error("extra request fields: use a JSON object");
  return parsed;
}

// One answer to chat.messages (which ends with a user turn), streamed into a new bubble.
async function generate() {
  const model = $("model").value;
  const system = $("system").value.trim();
  const withImage = chat.messages.some((m) => imageOf(m));
  const hitsBefore = withImage ? await cacheHits(model) : null;
  const answer = bubble("assistant", "…");
  const t0 = performance.now();
  let first = null, reply = "", pieces = 0, usage = null, stopped = false;
  chat.controller = new AbortController();
  try {
    const request = {
      max_tokens: Number($("max-tokens").value) || 128,
      temperature: Number($("temperature").value) || 0,
      ...extraFields(), model, stream: true, stream_options: { include_usage: true },
      messages: [...(system ? [{ role: "system", content: system }] : []), ...chat.messages],
    };
    const r = await fetch("v1/chat/completions", { method: "POST", headers: headers(),
      body: JSON.stringify(request), signal: chat.controller.signal });
    if (!r.ok) throw new Error(await errorText(r));
    await readEvents(r, (chunk) => {
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) usage = chunk.usage;
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (delta && delta.content) {
        if (first === null) first = performance.now();
        pieces += 1;
        reply += delta.content;
        show(answer.body, "assistant", reply);
      }
    });
  } catch (err) {
    if (err.name !== "AbortError") {  // the failed turn is forgotten; its text goes back to the box
      answer.div.className = "msg error";
      answer.body.textContent = "error: " + err.message;
      const turn = chat.messages.pop();
      if (!$("prompt").value) $("prompt").value = textOf(turn);
      save();
      return;
    }
    stopped = true;
  } finally {
    chat.controller = null;
  }
  const end = performance.now();
  const tokens = usage ? usage.completion_tokens : pieces;
  const stats = stopped ? ["stopped"] : [];
  if (first !== null) stats.push(`TTFT ${Math.round(first - t0)} ms`);
  if (!stopped && first !== null && tokens > 1 && end > first) {
    stats.push(`${((tokens - 1) / ((end - first) / 1000)).toFixed(1)} tokens/s`);
  }
  stats.push(`${tokens} tokens`);
  if (withImage && !stopped) {
    const hitsAfter = await cacheHits(model);
    if (hitsBefore !== null && hitsAfter !== null) {
      stats.push(hitsAfter > hitsBefore ? "image from the encoder cache" : "image encoded");
    }
  }
  show(answer.body, "assistant", reply);
  const line = document.createElement("span");
  line.className = "stats";
  line.textContent = stats.join(" · ");
  answer.div.append(line);
  document.querySelectorAll(".regenerate").forEach((b) => b.remove());  // only the last answer
  chat.messages.push({ role: "assistant", content: reply });
  actions(answer.div, chat.messages.length - 1);
  save();
}

async function busy(work) {
  chat.busy = true;
  $("send").hidden = true;
  $("stop").hidden = false;
  try {
    await work();
  } finally {
    chat.busy = false;
    $("send").hidden = false;
    $("stop").hidden = true;
  }
}

function send(text) {
  const content = [{ type: "text", text }];
  if (chat.image) content.unshift({ type: "image_url", image_url: { url: chat.image } });
  chat.messages.push({ role: "user", content });
  bubble("user", text, chat.image);
  setImage(null);
  save();
  return busy(generate);
}

function regenerate() {
  if (chat.busy || !chat.messages.length) return;
  if (chat.messages[chat.messages.length - 1].role === "assistant") chat.messages.pop();
  render();
  return busy(generate);
}

function setImage(dataUrl) {
  chat.image = dataUrl;
  $("preview").hidden = !dataUrl;
  $("clear-image").hidden = !dataUrl;
  if (dataUrl) $("preview").src = dataUrl; else $("file").value = "";
}

function readImage(file) {
  if (!file) return;
  if (!file.type.startsWith("image/")) {
    status(`${file.name} is not an image (${file.type || "unknown type"}): pick a PNG, JPEG, WebP or GIF`);
    $("file").value = "";
    return;
  }
  const reader = new FileReader();
  reader.onload = () => { setImage(reader.result); status(`image: ${file.name}`); };
  reader.readAsDataURL(file);
}

$("file").addEventListener("change", (e) => readImage(e.target.files[0]));
$("clear-image").addEventListener("click", () => setImage(null));
document.addEventListener("paste", (e) => {
  const item = [...(e.clipboardData || {}).items || []].find((i) => i.type.startsWith("image/"));
  if (item) { e.preventDefault(); readImage(item.getAsFile()); }
});
$("drop").addEventListener("dragover", (e) => { e.preventDefault(); $("drop").classList.add("over"); });
$("drop").addEventListener("dragleave", () => $("drop").classList.remove("over"));
$("drop").addEventListener("drop", (e) => {
  e.preventDefault();
  $("drop").classList.remove("over");
  readImage(e.dataTransfer.files[0]);
});
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("composer").requestSubmit(); }
});
$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || chat.busy) return;
  $("prompt").value = "";
  send(text);
});
$("stop").addEventListener("click", () => { if (chat.controller) chat.controller.abort(); });
$("reset").addEventListener("click", () => {
  if (chat.controller) chat.controller.abort();
  chat.messages = [];
  setImage(null);
  $("log").replaceChildren();
  save();
});
for (const id of [...Object.values(SETTINGS), "model"]) $(id).addEventListener("change", save);
$("key").addEventListener("change", loadModels);

restore();
loadModels();
