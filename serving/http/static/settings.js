// The chat page's settings: sampling fields -> request fields (an empty field is left out, so
// the server's default holds), kept in localStorage with the model and the colour scheme
// (never the API key), and the light/dark toggle.
"use strict";

const SETTINGS_KEY = "graft-settings";
// field id -> [request field, parse]
const NUMBER_FIELDS = {
  "max-tokens": ["max_tokens", parseInt], temperature: ["temperature", Number],
  "top-p": ["top_p", Number], "top-k": ["top_k", parseInt], "min-p": ["min_p", Number],
  "presence-penalty": ["presence_penalty", Number], "frequency-penalty": ["frequency_penalty", Number],
  "repetition-penalty": ["repetition_penalty", Number], seed: ["seed", parseInt],
};
const KEPT = [...Object.keys(NUMBER_FIELDS), "system", "stop", "response-format", "schema", "extra", "model"];
const THEMES = ["auto", "light", "dark"];

function el$(id) { return document.getElementById(id); }

// A bad field throws an Error naming it; the page shows it in place of the answer.
function samplingFields() {
  const fields = {};
  for (const [id, [name, parse]] of Object.entries(NUMBER_FIELDS)) {
    const raw = el$(id).value.trim();
    if (!raw) continue;
    const value = parse(raw);
    if (Number.isNaN(value)) throw new Error(`${name}: ${JSON.stringify(raw)} is not a number`);
    fields[name] = value;
  }
  const stop = el$("stop").value.split("\n").filter((s) => s !== "");
  if (stop.length) fields.stop = stop;
  const format = el$("response-format").value;
  if (format === "json_object") fields.response_format = { type: "json_object" };
  if (format === "json_schema") {
    let schema;
    try { schema = JSON.parse(el$("schema").value); } catch (err) {
      throw new Error(`JSON schema: not valid JSON (${err.message})`);
    }
    fields.response_format = { type: "json_schema", json_schema: { name: "answer", schema } };
  }
  const raw = el$("extra").value.trim();
  if (raw) {
    let extra;
    try { extra = JSON.parse(raw); } catch (err) {
      throw new Error(`other request fields: not valid JSON (${err.message})`);
    }
    if (typeof extra !== "object" || !extra || Array.isArray(extra)) {
      throw new Error("other request fields: use a JSON object, e.g. {\"ignore_eos\": true}");
    }
    Object.assign(fields, extra);
  }
  return fields;
}

function saveSettings() {
  const kept = Object.fromEntries(KEPT.map((id) => [id, el$(id).value]));
  kept.theme = document.documentElement.dataset.theme || "auto";
  try { localStorage.setItem(SETTINGS_KEY, JSON.stringify(kept)); } catch (err) { /* full */ }
}

function restoreSettings() {
  let kept = null;
  try { kept = JSON.parse(localStorage.getItem(SETTINGS_KEY) || "null"); } catch (err) { kept = null; }
  kept = kept || {};
  for (const id of KEPT) {
    if (kept[id] === undefined) continue;
    if (id === "model") el$(id).dataset.wanted = kept[id];  // the list is not loaded yet
    else el$(id).value = kept[id];
  }
  setTheme(kept.theme || "auto");
  el$("schema-label").hidden = el$("response-format").value !== "json_schema";
}

// "auto" follows prefers-color-scheme (app.css: color-scheme light dark); the others pin it.
function setTheme(theme) {
  if (theme === "auto") delete document.documentElement.dataset.theme;
  else document.documentElement.dataset.theme = theme;
  el$("theme").textContent = "theme: " + theme;
  el$("theme").dataset.theme = theme;
}

el$("theme").addEventListener("click", () => {
  const now = document.documentElement.dataset.theme || "auto";
  setTheme(THEMES[(THEMES.indexOf(now) + 1) % THEMES.length]);
  saveSettings();
});
el$("response-format").addEventListener("change", () => {
  el$("schema-label").hidden = el$("response-format").value !== "json_schema";
});
for (const id of KEPT) el$(id).addEventListener("change", saveSettings);
