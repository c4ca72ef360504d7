// Markdown for the chat page's answers, built as DOM nodes with textContent only: whatever a
// model writes (<script>, <img onerror=...>) stays text, never HTML. Covers what chat models
// write: paragraphs, # headings, - and 1. lists, ``` code blocks, `code`, **bold**, *italic*,
// and [links](URL) whose URL is http or https.
"use strict";

function el(tag, ...children) {
  const node = document.createElement(tag);
  node.append(...children);
  return node;
}

const INLINE = /(`[^`]+`)|(\*\*[^*]+\*\*)|(\*[^*\s][^*]*\*)|(\[[^\]]+\]\([^)\s]+\))/g;

function inline(text) {
  const out = [];
  let last = 0;
  for (const m of text.matchAll(INLINE)) {
    if (m.index > last) out.push(text.slice(last, m.index));
    const token = m[0];
    if (m[1]) out.push(el("code", token.slice(1, -1)));
    else if (m[2]) out.push(el("strong", ...inline(token.slice(2, -2))));
    else if (m[3]) out.push(el("em", ...inline(token.slice(1, -1))));
    else {
      const [, label, href] = token.match(/^\[([^\]]+)\]\(([^)\s]+)\)$/);
      if (/^https?:\/\//i.test(href)) {
        const a = el("a", ...inline(label));
        a.href = href;
        a.target = "_blank";
        a.rel = "noopener noreferrer";
        out.push(a);
      } else {
        out.push(token);  // javascript:, data: ... stay text
      }
    }
    last = m.index + token.length;
  }
  if (last < text.length) out.push(text.slice(last));
  return out;
}

function renderMarkdown(text) {
  const root = document.createDocumentFragment();
  const lines = text.split("\n");
  let para = [], list = null;
  const flush = () => {
    if (para.length) root.append(el("p", ...inline(para.join("\n"))));
    para = [];
    list = null;
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    if (line.startsWith("```")) {  // a code block runs to the closing fence (or the end)
      flush();
      const body = [];
      while (++i < lines.length && !lines[i].startsWith("```")) body.push(lines[i]);
      root.append(el("pre", el("code", body.join("\n"))));
      continue;
    }
    const heading = line.match(/^(#{1,6})\s+(.*)$/);
    const item = line.match(/^\s*(?:[-*+]|(\d+)[.)])\s+(.*)$/);
    if (heading) {
      flush();
      root.append(el(`h${Math.min(heading[1].length + 2, 6)}`, ...inline(heading[2])));
    } else if (item) {
      if (para.length) flush();
      const kind = item[1] ? "ol" : "ul";
      if (!list || list.localName !== kind) { list = el(kind); root.append(list); }
      list.append(el("li", ...inline(item[2])));
    } else if (!line.trim()) {
      flush();
    } else {
      list = null;
      para.push(line);
    }
  }
  flush();
  return root;
}
