// graft chat page: a plain OpenAI-API client in the browser (no framework, no build step).
// Streams /v1/chat/completions, shows TTFT and tokens/s, reads /metrics to tell whether the
// image came from the server's encoder cache, and keeps conversations in localStorage
// (conversations.js). Stop aborts the fetch: the server sees the client go and aborts the
// request at its next step.
"use strict";

const $ = (id) => document.getElementById(id);
// models: id -> capabilities from v1/models ("multimodal": takes images; null: the server
// does not say, so image input stays on)
const page = { image: null, controller: null, busy: false, models: {} };

function status(text) { $("status").textContent = text; }

function persist() {
  const saved = saveChats();
  if (saved === "without images") status("history saved without its images (browser storage is full)");
  else if (!saved) status("browser storage is full: this conversation is not saved");
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

// fetch() rejects with a TypeError ("Failed to fetch") only when no answer came at all
function unreachable(err) {
  return err instanceof TypeError;
}

async function loadModels() {
  try {
    const r = await fetch("v1/models", { headers: headers() });
    if (!r.ok) throw new Error(await errorText(r));
    const data = (await r.json()).data;
    page.models = Object.fromEntries(data.map((m) => [m.id, m.capabilities || null]));
    const ids = data.map((m) => m.id);
    const select = $("model");
    const keep = select.value || select.dataset.wanted;
    select.replaceChildren(...ids.map((id) => new Option(id, id)));
    if (ids.includes(keep)) select.value = keep;
    $("model-label").hidden = ids.length < 2;  // a picker only when there is a choice
    status(`${ids.length} model(s) served: ${ids.join(", ")}`);
    imageInput();
  } catch (err) {
    if (!unreachable(err)) { status("could not list the models: " + err.message); return; }
    status("server unreachable (is graft serve running?): trying again every 5 s");
    setTimeout(loadModels, 5000);
  }
}

function takesImages() {
  const caps = page.models[$("model").value];
  return !caps || caps.includes("multimodal");
}

// A text-only model gets no image input: the server would refuse every turn with one.
function imageInput() {
  const on = takesImages();
  $("drop").hidden = !on;
  if (!on) setImage(null);
  $("prompt").placeholder = on ? "Message, or ask about an image (Enter sends, Shift+Enter: new line)"
    : "Message (Enter sends, Shift+Enter: new line)";
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

function button(label, className, onclick, title) {
  const b = document.createElement("button");
  b.type = "button";
  b.className = className;
  b.textContent = label;
  if (title) b.title = title;
  b.onclick = onclick;
  return b;
}

function bubble(role, text, image, reasoning) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  if (image) {
    const img = document.createElement("img");
    img.src = image;
    div.append(img);
  }
  const body = document.createElement("div");
  body.className = "body";
  div.append(body);
  show(body, role, text, reasoning);
  $("log").append(div);
  div.scrollIntoView({ block: "end" });
  return { div, body };
}

// An answer's thinking (a server run with --reasoning-parser) goes in a fold above it: open
// while the model thinks, then as the reader left it (a finished turn shows it folded).
function show(body, role, text, reasoning) {
  if (role !== "assistant") {
    body.textContent = text;
    return;
  }
  const parts = [renderMarkdown(text)];
  if (reasoning) {
    const fold = document.createElement("details");
    fold.className = "reasoning";
    const was = body.querySelector("details.reasoning");
    fold.open = was ? was.open : !text;
    const summary = document.createElement("summary");
    summary.textContent = "thinking";
    const thought = document.createElement("div");
    thought.textContent = reasoning;
    fold.append(summary, thought);
    parts.unshift(fold);
  }
  body.replaceChildren(...parts);
}

// "‹ 2/3 ›" under a message with other versions (edits or regenerated answers)
function versions(chat, node) {
  const siblings = siblingsOf(chat, node);
  const at = siblings.indexOf(node.id);
  const bar = document.createElement("span");
  bar.className = "versions";
  if (siblings.length < 2) return bar;
  const go = (step) => () => {
    if (page.busy) return;
    showVersion(chat, siblings[at + step]);
    persist();
    render();
  };
  const prev = button("‹", "prev", go(-1), "previous version");
  const next = button("›", "next", go(1), "next version");
  prev.disabled = at === 0;
  next.disabled = at === siblings.length - 1;
  const label = document.createElement("span");
  label.className = "version";
  label.textContent = `${at + 1}/${siblings.length}`;
  bar.append(prev, label, next);
  return bar;
}

function actions(chat, node, div) {
  const bar = document.createElement("div");
  bar.className = "actions";
  if (node.role === "assistant") {
    const copy = button("copy", "copy", () => copyText(node.content, copy));
    bar.append(copy, button("regenerate", "regenerate", () => regenerate(node)));
  } else {
    bar.append(button("edit", "edit", () => edit(node, div)));
  }
  bar.append(versions(chat, node));
  div.append(bar);
}

function render() {
  const chat = currentChat();
  $("log").replaceChildren();
  for (const node of pathOf(chat)) {
    const { div } = bubble(node.role, messageText(node), messageImage(node), node.reasoning);
    div.dataset.id = node.id;
    if (node.stats) {
      const line = document.createElement("span");
      line.className = "stats";
      line.textContent = node.stats;
      div.append(line);
    }
    actions(chat, node, div);
  }
  renderList();
}

function renderList() {
  const query = $("search").value;
  const items = store.chats.filter((c) => matchesSearch(c, query)).map((chat) => {
    const li = document.createElement("li");
    li.dataset.id = chat.id;
    li.classList.toggle("current", chat.id === store.current);
    const open = button(chat.title || "new chat", "open", () => {
      if (page.busy) return;
      store.current = chat.id;
      document.body.classList.remove("sidebar-open");
      persist();
      render();
    });
    const del = button("✕", "delete", () => {  // a second click within 3 s deletes
      if (del.dataset.armed) { deleteChat(chat.id); persist(); render(); return; }
      del.dataset.armed = "1";
      del.textContent = "delete?";
      setTimeout(() => { delete del.dataset.armed; del.textContent = "✕"; }, 3000);
    }, "delete this conversation");
    li.append(open, button("✎", "rename", () => rename(chat, li), "rename"),
              button("⤓", "export", () => download(chat), "export as JSON"), del);
    return li;
  });
  $("chat-list").replaceChildren(...items);
}

function rename(chat, li) {
  const input = document.createElement("input");
  input.className = "rename-box";
  input.value = chat.title;
  let done = false;
  const finish = (keep) => {
    if (done) return;
    done = true;
    if (keep && input.value.trim()) { chat.title = input.value.trim(); chat.named = true; persist(); }
    renderList();
  };
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter") finish(true);
    if (e.key === "Escape") finish(false);
  });
  input.addEventListener("blur", () => finish(true));
  li.querySelector(".open").replaceWith(input);
  input.focus();
  input.select();
}

function download(chat) {
  const blob = new Blob([JSON.stringify(exportChat(chat), null, 1)], { type: "application/json" });
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = `graft-chat-${(chat.title || "chat").replace(/[^\w-]+/g, "-").slice(0, 40)}.json`;
  a.click();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
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

function requestMessages(chat) {
  const system = $("system").value.trim();
  const images = takesImages();  // a text-only model gets the text of earlier image turns
  const messages = pathOf(chat).map((n) => ({ role: n.role, content: images || !Array.isArray(n.content)
    ? n.content : n.content.filter((p) => p.type === "text") }));
  return [...(system ? [{ role: "system", content: system }] : []), ...messages];
}

function statsLine(stopped, t0, first, end, tokens) {
  const stats = stopped ? ["stopped"] : [];
  if (first !== null) stats.push(`TTFT ${Math.round(first - t0)} ms`);
  if (!stopped && first !== null && tokens > 1 && end > first) {
    stats.push(`${((tokens - 1) / ((end - first) / 1000)).toFixed(1)} tokens/s`);
  }
  stats.push(`${tokens} tokens`);
  return stats;
}

// One answer to the current path (which ends with a user turn), streamed into a new bubble
// and kept as the next version under that turn. Returns the error, if any, for the caller.
async function generate(chat) {
  const model = $("model").value;
  const userId = chat.leaf;
  const withImage = takesImages() && pathOf(chat).some((n) => messageImage(n));
  const hitsBefore = withImage ? await cacheHits(model) : null;
  const answer = bubble("assistant", "…");
  const t0 = performance.now();
  let first = null, reply = "", thinking = "", pieces = 0, usage = null, stopped = false, frame = 0;
  page.controller = new AbortController();
  try {
    const request = { ...samplingFields(), model, stream: true, stream_options: { include_usage: true },
                      messages: requestMessages(chat) };
    const r = await fetch("v1/chat/completions", { method: "POST", headers: headers(),
      body: JSON.stringify(request), signal: page.controller.signal });
    if (!r.ok) throw new Error(await errorText(r));
    await readEvents(r, (chunk) => {
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) usage = chunk.usage;
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (delta && (delta.content || delta.reasoning)) {
        if (first === null) first = performance.now();
        pieces += 1;
        reply += delta.content || "";
        thinking += delta.reasoning || "";
        // one markdown pass per frame, however many pieces arrive in it
        frame = frame || requestAnimationFrame(() => {
          frame = 0;
          show(answer.body, "assistant", reply, thinking);
        });
      }
    });
  } catch (err) {
    if (err.name !== "AbortError") {
      answer.div.remove();
      return err;
    }
    stopped = true;
  } finally {
    page.controller = null;
    cancelAnimationFrame(frame);
  }
  const end = performance.now();
  const stats = statsLine(stopped, t0, first, end, usage ? usage.completion_tokens : pieces);
  if (withImage && !stopped) {
    const hitsAfter = await cacheHits(model);
    if (hitsBefore !== null && hitsAfter !== null) {
      stats.push(hitsAfter > hitsBefore ? "image from the encoder cache" : "image encoded");
    }
  }
  const extra = { stats: stats.join(" · "), ...(thinking ? { reasoning: thinking } : {}) };
  if (store.chats.includes(chat)) addNode(chat, userId, "assistant", reply, extra);
  persist();
  if (chat === currentChat()) render();
  return null;
}

function showError(err, retry) {
  const text = unreachable(err)
    ? "server unreachable (is graft serve still running?): your message is kept; retry when it is back"
    : "error: " + err.message;
  const { div } = bubble("error", text);
  div.append(button("retry", "retry", () => { div.remove(); retry(); }));
}

async function busy(work) {
  page.busy = true;
  $("send").hidden = true;
  $("stop").hidden = false;
  try {
    await work();
  } finally {
    page.busy = false;
    $("send").hidden = false;
    $("stop").hidden = true;
  }
}

// A new turn: on failure it leaves the conversation, its text and image go back to the box.
function send(text) {
  const chat = currentChat();
  const content = [{ type: "text", text }];
  const image = page.image;
  if (image) content.unshift({ type: "image_url", image_url: { url: image } });
  const node = addNode(chat, chat.leaf, "user", content);
  setImage(null);
  persist();
  render();
  return busy(async () => {
    const err = await generate(chat);
    if (!err) return;
    dropNode(chat, node.id);
    persist();
    render();
    if (!$("prompt").value) $("prompt").value = text;
    if (image && takesImages()) setImage(image);
    showError(err, () => $("composer").requestSubmit());
  });
}

// Another answer to the same question, kept beside the first (‹ 1/2 ›).
function regenerate(node) {
  if (page.busy) return;
  const chat = currentChat();
  chat.leaf = node.parent;
  render();
  return answerLeaf(chat);
}

function answerLeaf(chat) {
  return busy(async () => {
    const err = await generate(chat);
    if (err) showError(err, () => answerLeaf(chat));
  });
}

// Edit a question: the new text is a sibling version of it, and gets an answer of its own.
function edit(node, div) {
  if (page.busy) return;
  const box = document.createElement("textarea");
  box.className = "edit-box";
  box.value = messageText(node);
  box.rows = Math.min(8, box.value.split("\n").length + 1);
  const save = button("send", "save-edit", () => {
    const text = box.value.trim();
    if (!text || page.busy) return;
    const chat = currentChat();
    const parts = Array.isArray(node.content) ? node.content.filter((p) => p.type !== "text") : [];
    addNode(chat, node.parent, "user", [...parts, { type: "text", text }]);
    persist();
    render();
    answerLeaf(chat);
  });
  div.querySelector(".body").replaceWith(box);
  div.querySelector(".actions").replaceChildren(save, button("cancel", "cancel-edit", render));
  box.focus();
}

function setImage(dataUrl) {
  page.image = dataUrl;
  $("preview").hidden = !dataUrl;
  $("clear-image").hidden = !dataUrl;
  $("pick").hidden = !!dataUrl;
  if (dataUrl) $("preview").src = dataUrl; else $("file").value = "";
}

function readImage(file) {
  if (!file) return;
  if (!takesImages()) {
    status(`${$("model").value} takes text only: pick a model that takes images`);
    return;
  }
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
  if (!text || page.busy) return;
  $("prompt").value = "";
  send(text);
});
$("stop").addEventListener("click", () => { if (page.controller) page.controller.abort(); });
$("reset").addEventListener("click", () => {  // a new conversation; the others stay listed
  if (page.controller) page.controller.abort();
  if (pathOf(currentChat()).length) createChat();
  setImage(null);
  persist();
  render();
});
$("search").addEventListener("input", renderList);
$("sidebar-toggle").addEventListener("click", () => {
  const open = document.body.classList.toggle("sidebar-open");
  $("sidebar-toggle").setAttribute("aria-expanded", String(open));
});
function showSettings(open) {
  $("settings").hidden = !open;
  $("settings-toggle").setAttribute("aria-expanded", String(open));
}
$("settings-toggle").addEventListener("click", () => showSettings($("settings").hidden));
// the panel lies over the chat: a click elsewhere or Escape puts it away
document.addEventListener("click", (e) => {
  if (!$("settings").hidden && !e.target.closest("#settings, #settings-toggle")) showSettings(false);
});
document.addEventListener("keydown", (e) => { if (e.key === "Escape") showSettings(false); });
$("model").addEventListener("change", imageInput);
$("key").addEventListener("change", loadModels);

restoreSettings();
loadChats();
render();
loadModels();
