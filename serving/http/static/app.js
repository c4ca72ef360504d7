// graft chat page: a plain OpenAI-API client in the browser (no framework, no build step).
// Streams /v1/chat/completions, shows TTFT and tokens/s, and reads /metrics to tell whether
// the image came from the server's encoder cache.
"use strict";

const $ = (id) => document.getElementById(id);
const chat = { messages: [], image: null, busy: false };  // image: data: URL for the next turn

function status(text) { $("status").textContent = text; }

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
    const keep = select.value;
    select.replaceChildren(...models.map((id) => new Option(id, id)));
    if (models.includes(keep)) select.value = keep;
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

function bubble(role, text, image) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  if (image) {
    const img = document.createElement("img");
    img.src = image;
    div.append(img);
  }
  const body = document.createElement("span");
  body.textContent = text;
  div.append(body);
  $("log").append(div);
  div.scrollIntoView({ block: "end" });
  return { div, body };
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

async function send(text) {
  const model = $("model").value;
  const content = [{ type: "text", text }];
  if (chat.image) content.unshift({ type: "image_url", image_url: { url: chat.image } });
  const turn = { role: "user", content };
  bubble("user", text, chat.image);
  const withImage = [...chat.messages, turn].some((m) => Array.isArray(m.content)
    && m.content.some((part) => part.type === "image_url"));
  const hitsBefore = withImage ? await cacheHits(model) : null;
  const answer = bubble("assistant", "…");
  const request = {
    model, messages: [...chat.messages, turn], stream: true,
    stream_options: { include_usage: true },
    max_tokens: Number($("max-tokens").value) || 128,
    temperature: Number($("temperature").value) || 0,
  };
  const t0 = performance.now();
  let first = null, reply = "", pieces = 0, usage = null;
  try {
    const r = await fetch("v1/chat/completions", { method: "POST", headers: headers(), body: JSON.stringify(request) });
    if (!r.ok) throw new Error(await errorText(r));
    await readEvents(r, (chunk) => {
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) usage = chunk.usage;
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (delta && delta.content) {
        if (first === null) first = performance.now();
        pieces += 1;
        reply += delta.content;
        answer.body.textContent = reply;
      }
    });
  } catch (err) {
    answer.div.className = "msg error";
    answer.body.textContent = "error: " + err.message;
    return;
  }
  const end = performance.now();
  const tokens = usage ? usage.completion_tokens : pieces;
  const stats = [];
  if (first !== null) stats.push(`TTFT ${Math.round(first - t0)} ms`);
  if (first !== null && tokens > 1 && end > first) {
    stats.push(`${((tokens - 1) / ((end - first) / 1000)).toFixed(1)} tokens/s`);
  }
  stats.push(`${tokens} tokens`);
  if (withImage) {
    const hitsAfter = await cacheHits(model);
    if (hitsBefore !== null && hitsAfter !== null) {
      stats.push(hitsAfter > hitsBefore ? "image from the encoder cache" : "image encoded");
    }
  }
  const line = document.createElement("span");
  line.className = "stats";
  line.textContent = stats.join(" · ");
  answer.div.append(line);
  chat.messages.push(turn, { role: "assistant", content: reply });
  setImage(null);
}

function setImage(dataUrl) {
  chat.image = dataUrl;
  $("preview").hidden = !dataUrl;
  $("clear-image").hidden = !dataUrl;
  if (dataUrl) $("preview").src = dataUrl; else $("file").value = "";
}

function readImage(file) {
  if (!file || !file.type.startsWith("image/")) return;
  const reader = new FileReader();
  reader.onload = () => setImage(reader.result);
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
$("composer").addEventListener("submit", async (e) => {
  e.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || chat.busy) return;
  chat.busy = true;
  $("send").disabled = true;
  $("prompt").value = "";
  try { await send(text); } finally { chat.busy = false; $("send").disabled = false; }
});
$("reset").addEventListener("click", () => {
  chat.messages = [];
  setImage(null);
  $("log").replaceChildren();
});
$("key").addEventListener("change", loadModels);

loadModels();
