// Conversations kept in this browser's localStorage (never sent anywhere but to the model).
// Each is a tree of messages: an edited question or a regenerated answer becomes a sibling
// version of the one it replaces (as llama.cpp's page branches), and the chat shown is the
// path from a root to `leaf`.
"use strict";

const CHATS_KEY = "graft-chats";
const OLD_KEY = "graft-chat";  // the single conversation pages before the list kept

const store = { chats: [], current: null };

function newId() {
  return Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
}

function createChat() {
  const chat = { id: newId(), title: "", named: false, created: Date.now(), updated: Date.now(),
                 nodes: {}, roots: [], leaf: null };
  store.chats.unshift(chat);
  store.current = chat.id;
  return chat;
}

function currentChat() {
  return store.chats.find((c) => c.id === store.current) || createChat();
}

function addNode(chat, parentId, role, content, extra = {}) {
  const node = { id: newId(), parent: parentId, role, content, children: [], ...extra };
  chat.nodes[node.id] = node;
  const siblings = parentId ? chat.nodes[parentId].children : chat.roots;
  siblings.push(node.id);
  if (parentId) chat.nodes[parentId].shown = node.id;
  chat.leaf = node.id;
  chat.updated = Date.now();
  if (!chat.named && role === "user" && !parentId) chat.title = titleFrom(content);
  return node;
}

function titleFrom(content) {
  const text = messageText({ content }).replace(/\s+/g, " ").trim();
  return text.length > 48 ? text.slice(0, 47) + "…" : text || "(image)";
}

// The nodes from the root to the leaf: the conversation as shown and as sent.
function pathOf(chat) {
  const path = [];
  for (let id = chat.leaf; id; id = chat.nodes[id].parent) path.unshift(chat.nodes[id]);
  return path;
}

function siblingsOf(chat, node) {
  return node.parent ? chat.nodes[node.parent].children : chat.roots;
}

// Show another version of `node`: it, then down the branch last shown below it.
function showVersion(chat, id) {
  const node = chat.nodes[id];
  if (node.parent) chat.nodes[node.parent].shown = id;
  let leaf = node;
  while (leaf.children.length) leaf = chat.nodes[leaf.shown || leaf.children[leaf.children.length - 1]];
  chat.leaf = leaf.id;
}

// A failed or stopped-before-any-text node leaves the tree again.
function dropNode(chat, id) {
  const node = chat.nodes[id];
  const siblings = siblingsOf(chat, node);
  siblings.splice(siblings.indexOf(id), 1);
  delete chat.nodes[id];
  const parent = node.parent && chat.nodes[node.parent];
  if (parent) parent.shown = parent.children[parent.children.length - 1];
  if (siblings.length) showVersion(chat, siblings[siblings.length - 1]);
  else chat.leaf = node.parent;
}

function deleteChat(id) {
  store.chats = store.chats.filter((c) => c.id !== id);
  if (store.current === id) store.current = store.chats.length ? store.chats[0].id : null;
}

function messageText(message) {
  return Array.isArray(message.content)
    ? message.content.filter((p) => p.type === "text").map((p) => p.text).join("\n") : message.content;
}

function messageImage(message) {
  const part = Array.isArray(message.content) && message.content.find((p) => p.type === "image_url");
  return part ? part.image_url.url : null;
}

function matchesSearch(chat, query) {
  const q = query.trim().toLowerCase();
  if (!q || chat.title.toLowerCase().includes(q)) return true;
  return Object.values(chat.nodes).some((n) => (messageText(n) || "").toLowerCase().includes(q));
}

// What "export" downloads: the conversation shown (OpenAI messages) and every version kept.
function exportChat(chat) {
  return { title: chat.title, created: new Date(chat.created).toISOString(),
           messages: pathOf(chat).map((n) => ({ role: n.role, content: n.content,
                                                ...(n.reasoning ? { reasoning: n.reasoning } : {}) })),
           versions: chat };
}

function loadChats() {
  let saved = null;
  try { saved = JSON.parse(localStorage.getItem(CHATS_KEY) || "null"); } catch (err) { saved = null; }
  if (saved && Array.isArray(saved.chats)) {
    store.chats = saved.chats;
    store.current = saved.current;
    return;
  }
  let old = null;
  try { old = JSON.parse(localStorage.getItem(OLD_KEY) || "null"); } catch (err) { old = null; }
  if (old && Array.isArray(old.messages) && old.messages.length) {  // carried over once
    const chat = createChat();
    let parent = null;
    for (const m of old.messages) parent = addNode(chat, parent, m.role, m.content).id;
  }
}

// Returns false when the browser's storage is full even without the images.
function saveChats() {
  const state = { current: store.current, chats: store.chats };
  try {
    localStorage.setItem(CHATS_KEY, JSON.stringify(state));
    return true;
  } catch (err) {  // over the quota (images are data: URLs): keep the text, drop the images
    const textOnly = JSON.parse(JSON.stringify(state));
    for (const chat of textOnly.chats) {
      for (const node of Object.values(chat.nodes)) {
        if (Array.isArray(node.content)) node.content = node.content.filter((p) => p.type === "text");
      }
    }
    try { localStorage.setItem(CHATS_KEY, JSON.stringify(textOnly)); } catch (e) { return false; }
    return "without images";
  }
}
