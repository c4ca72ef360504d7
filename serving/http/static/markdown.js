// Model answers to DOM for the chat page. markdown-it parses (raw HTML off: HTML a model writes
// stays visible text), highlight.js colours fenced code, DOMPurify sanitises every answer
// before it reaches the DOM, then KaTeX renders $…$, $$…$$, \(…\) and \[…\] into the
// sanitised tree. KaTeX builds DOM nodes (styles set through the CSSOM), so the page's CSP
// needs no 'unsafe-inline'. All four libraries are vendored (vendor/, tools/fetch_vendor.sh).
"use strict";

const MATH_OPEN = [["$$", "$$", true], ["\\[", "\\]", true], ["\\(", "\\)", false], ["$", "$", false]];

// Inline math (runs before markdown's backslash escapes, which would eat "\(").
function mathInline(state, silent) {
  const src = state.src, pos = state.pos;
  const found = MATH_OPEN.find(([open]) => src.startsWith(open, pos));
  if (!found) return false;
  const [open, close, display] = found;
  const start = pos + open.length, end = src.indexOf(close, start);
  if (end <= start) return false;
  const tex = src.slice(start, end);
  // pandoc's rule for single dollars: "$5 and $10" is money, not math
  if (open === "$" && (/^\s|\s$/.test(tex) || /\d/.test(src[end + 1] || ""))) return false;
  if (!silent) {
    const token = state.push("math", "", 0);
    token.content = tex;
    token.meta = { display };
  }
  state.pos = end + close.length;
  return true;
}

// A $$ or \[ block at the start of a line, to its closing mark: the lines in between are TeX,
// never markdown (a "- x" or "=" line inside would otherwise turn into a list or a heading).
function mathBlock(state, startLine, endLine, silent) {
  const line = (n) => state.src.slice(state.bMarks[n] + state.tShift[n], state.eMarks[n]);
  if (state.sCount[startLine] - state.blkIndent >= 4) return false;  // indented code
  const first = line(startLine);
  const found = MATH_OPEN.find(([open, , display]) => display && first.startsWith(open));
  if (!found) return false;
  const [open, close] = found;
  let body = first.slice(open.length), n = startLine, at = body.indexOf(close);
  while (at < 0 && ++n < endLine) {
    const text = line(n);
    at = text.indexOf(close);
    body += "\n" + (at < 0 ? text : text.slice(0, at));
  }
  if (at < 0) return false;  // not closed (yet, while streaming): plain text for now
  if (n === startLine) {
    if (first.slice(open.length + at + close.length).trim()) return false;  // inline's job
    body = body.slice(0, at);
  }
  if (silent) return true;
  const token = state.push("math", "div", 0);
  token.content = body.trim();
  token.meta = { display: true };
  token.block = true;
  token.map = [startLine, n + 1];
  state.line = n + 1;
  return true;
}

function highlight(code, lang) {
  if (typeof hljs === "undefined") return "";
  try {
    if (lang && hljs.getLanguage(lang)) return hljs.highlight(code, { language: lang, ignoreIllegals: true }).value;
    return code.length < 20000 ? hljs.highlightAuto(code).value : "";
  } catch (err) {
    return "";  // markdown-it escapes the plain code instead
  }
}

const md = window.markdownit({ html: false, linkify: true, breaks: true, highlight });
md.inline.ruler.before("escape", "math", mathInline);
md.block.ruler.before("fence", "math", mathBlock, { alt: ["paragraph", "reference", "blockquote", "list"] });
// the TeX source as text in a placeholder; KaTeX fills it in after sanitising
md.renderer.rules.math = (tokens, i) => {
  const tag = tokens[i].block ? "div" : "span";
  const kind = tokens[i].meta.display ? "math display" : "math";
  return `<${tag} class="${kind}">${md.utils.escapeHtml(tokens[i].content)}</${tag}>`;
};

// Links the model writes open in a new tab, and never tell the target where they came from
DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A" && node.hasAttribute("href")) {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

// HTML -> a sanitised fragment (no script, no event handlers, no javascript: URLs)
function sanitize(html) {
  return DOMPurify.sanitize(html, { RETURN_DOM_FRAGMENT: true, FORBID_TAGS: ["style", "form"] });
}

function renderMath(root) {
  if (typeof katex === "undefined") return;
  for (const node of root.querySelectorAll(".math")) {
    const tex = node.textContent;
    try {
      katex.render(tex, node, { displayMode: node.classList.contains("display"), throwOnError: false,
                                trust: false, strict: "ignore" });
    } catch (err) {
      node.textContent = tex;  // KaTeX gave up: the source stays readable
    }
  }
}

function addCodeButtons(root) {
  for (const pre of root.querySelectorAll("pre")) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "copy-code";
    button.textContent = "copy";
    button.onclick = () => copyText(pre.querySelector("code")?.textContent ?? pre.textContent, button);
    pre.prepend(button);
  }
}

function renderMarkdown(text) {
  const root = sanitize(md.render(text));
  renderMath(root);
  addCodeButtons(root);
  return root;
}

async function copyText(text, button) {
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = "copied";
  } catch (err) {
    document.getElementById("status").textContent =
      "could not copy (the browser refused the clipboard): select the text instead";
  }
}
