"""Where each message's text and each assistant turn lie in a rendered chat, from one extra
render (sentinel contents) instead of one render per prefix: prompt building stays linear in
the number of turns. Returns None wherever its assumptions do not hold, so callers fall back
to the exact per-prefix renders.
"""

from __future__ import annotations

import re
from typing import Callable

# private-use code points: no chat template or tokenizer treats them specially
_SENTINEL = "\ue000{}\ue001"
_SENTINEL_RE = re.compile("\ue000(\\d+)\ue001")

Render = Callable[[list[dict], bool], str]  # (messages, add_generation_prompt) -> text


def content_offsets(render: Render, messages: list[dict], full: str,
                    add_generation_prompt: bool) -> list[tuple[int, int]] | None:
    """(start, end) in `full` of every message's content, or None when the template does not
    insert contents as given (or stripped, as `| trim` does)."""
    skeleton = render([{**m, "content": _SENTINEL.format(k)} for k, m in enumerate(messages)],
                      add_generation_prompt)
    found = list(_SENTINEL_RE.finditer(skeleton))
    if [int(m.group(1)) for m in found] != list(range(len(messages))):
        return None  # a template that drops, repeats or reorders contents
    glue = [skeleton[a.end() if a else 0:b.start()] for a, b in zip([None] + found, found)]
    tail = skeleton[found[-1].end():] if found else skeleton
    for transform in (lambda text: text, str.strip):
        offsets, parts, at = [], [], 0
        for piece, msg in zip(glue, messages):
            text = transform(str(msg.get("content") or ""))
            at += len(piece)
            offsets.append((at, at + len(text)))
            at += len(text)
            parts += (piece, text)
        if len(full) == at + len(tail) and "".join(parts) + tail == full:
            return offsets
    return None


def assistant_spans(render: Render, messages: list[dict], full: str,
                    offsets: list[tuple[int, int]]) -> list[tuple[int, int]] | None:
    """The label spans `graft.template` defines (from after the generation prompt that opens
    an assistant turn to the end of its end-of-turn text), measured exactly on the last
    assistant turn and carried to the others by their content offsets when they end with the
    same text; None otherwise. A turn that opens differently from the last one (Qwen3 writes
    its empty think block in the last turn only) is measured on its own prefix render."""
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not turns:
        return []
    last = turns[-1]
    start, end = offsets[last]
    upto = render(messages[:last + 1], False)
    if not full.startswith(upto) or len(upto) < end:
        return None
    closing = upto[end:]  # end-of-turn text after an assistant's content
    opening = ""  # text of the span before the content (empty for every common template)
    if last > 0:  # (an assistant-first chat has no prefix to render: its span starts at text)
        prefix = render(messages[:last], True)
        if not full.startswith(prefix) or len(prefix) > start:
            return None
        opening = full[len(prefix):start]
    spans = []
    for i in turns:
        a, b = offsets[i]
        if full[b:b + len(closing)] != closing:
            return None
        start = a - len(opening)
        if full[start:a] != opening:
            if i == 0:
                return None
            prefix = render(messages[:i], True)
            if not full.startswith(prefix) or len(prefix) > a:
                return None
            start = len(prefix)
        spans.append((start, b + len(closing)))
    if any(prev[1] > nxt[0] for prev, nxt in zip(spans, spans[1:])):
        return None
    return spans
