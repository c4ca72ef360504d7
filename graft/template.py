"""Chat formatting: the tokenizer's own chat template, `<image>` markers, label masks.

Text is cut at image markers and at assistant-turn boundaries, and each piece is tokenized
on its own. Training and inference cut prompts at the same places, so they see the same
ids; a text-only prompt is one piece, so it tokenizes exactly as the plain LLM would.
Serving can keep special-token text typed inside messages as plain text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from graft.chat_layout import assistant_spans, content_offsets
from graft.errors import GraftDataError
from graft.image_prompt import IMAGE_MARKER  # also imported from here by callers
from graft.inject import IMAGE_PLACEHOLDER

IGNORE_INDEX = -100  # label value that carries no loss (HF convention)


@dataclass
class EncodedChat:
    input_ids: list[int]  # IMAGE_PLACEHOLDER runs at image positions
    labels: list[int]  # IGNORE_INDEX outside assistant turns
    image_spans: list[tuple[int, int]] = field(default_factory=list)  # (offset, length) per image


def count_markers(messages: list[dict]) -> int:
    return sum(str(m.get("content", "")).count(IMAGE_MARKER) for m in messages)


class ChatTemplateError(GraftDataError):
    """The chat template cannot render the conversation; `message_index` names the first
    message it fails on (None when no single message is to blame)."""

    def __init__(self, message: str, message_index: int | None = None):
        super().__init__(message)
        self.message_index = message_index


def _render(tokenizer, messages, add_generation_prompt: bool,
            tools: list[dict] | None = None) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise GraftDataError(
            "the LLM tokenizer has no chat_template; use an instruct checkpoint or set "
            "tokenizer.chat_template in its tokenizer_config.json")
    try:
        return tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt)
    except Exception as err:  # noqa: BLE001 - jinja raise_exception, empty chat, bad values
        raise ChatTemplateError(f"the chat template cannot render this conversation: "
                                f"{type(err).__name__}: {err}") from None


def _render_full(tokenizer, messages, add_generation_prompt: bool, tools=None) -> str:
    """The whole chat; on failure, the error names the first message it fails at (the
    shortest failing prefix, found by bisection: a few renders, on the error path only)."""
    try:
        return _render(tokenizer, messages, add_generation_prompt, tools)
    except ChatTemplateError as err:
        lo, hi = 1, len(messages)  # render(messages[:hi]) fails
        while lo < hi:
            mid = (lo + hi) // 2
            try:
                _render(tokenizer, messages[:mid], add_generation_prompt, tools)
                lo = mid + 1
            except ChatTemplateError:
                hi = mid
        raise ChatTemplateError(f"messages[{hi - 1}]: {err}", hi - 1) from None


def _label_spans(tokenizer, messages: list[dict], full: str,
                 tools: list[dict] | None = None) -> list[tuple[int, int]]:
    """Character spans of `full` that belong to assistant turns (content + end token)."""
    spans = []
    for i, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        prefix = _render(tokenizer, messages[:i], True, tools)
        upto = _render(tokenizer, messages[: i + 1], False, tools)
        if not (upto.startswith(prefix) and full.startswith(upto)):
            raise GraftDataError(
                "the chat template does not render conversations as growing prefixes; "
                "assistant turns cannot be located for label masking")
        spans.append((len(prefix), len(upto)))
    return spans


def special_texts(tokenizer) -> list[str]:
    """Strings the tokenizer turns into single added/special tokens wherever they appear."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    texts = {t.content for t in added.values()} | set(getattr(tokenizer, "all_special_tokens", []))
    return sorted((t for t in texts if t), key=len, reverse=True)


def _literal_specials(tokenizer, messages: list[dict], full: str,
                      offsets: list[tuple[int, int]] | None) -> list[tuple[int, int]]:
    """Spans of `full` where special-token text typed inside a message lies (to be tokenized
    as the characters it is, not as control tokens)."""
    texts = special_texts(tokenizer)
    if not texts:
        return []
    pattern = re.compile("|".join(map(re.escape, texts)))
    spans = []
    for k, msg in enumerate(messages):
        if not pattern.search(str(msg.get("content") or "")):
            continue
        if offsets is None:
            raise ChatTemplateError(
                f"messages[{k}]: the text contains special-token text ("
                f"{pattern.search(str(msg['content'])).group(0)!r}) and this model's chat "
                "template rewrites message text, so it cannot be kept as plain text; remove it",
                k)
        a, b = offsets[k]
        spans += [m.span() for m in pattern.finditer(full, a, b)]  # positions in `full`
    return spans


def encode_chat(
    tokenizer,
    messages: list[dict],
    image_token_counts: list[int],
    add_generation_prompt: bool = False,
    parse_special_tokens: bool = True,
    tools: list[dict] | None = None,
) -> EncodedChat:
    """Token ids + labels for `messages`; the k-th `<image>` becomes a run of
    image_token_counts[k] placeholders. Marker/image count mismatch -> GraftDataError.
    parse_special_tokens=False keeps special-token text inside messages (a user typing
    `<|im_start|>system`) as plain text; the template's own control tokens stay special.
    `tools` (OpenAI function tools) go to the template as `apply_chat_template(tools=...)`."""
    n_markers = count_markers(messages)
    if n_markers != len(image_token_counts):
        raise GraftDataError(
            f"{n_markers} {IMAGE_MARKER} marker(s) in the text but {len(image_token_counts)} "
            f"image(s); put exactly one {IMAGE_MARKER} in the user text per image")
    full = _render_full(tokenizer, messages, add_generation_prompt, tools)

    def render(msgs, gen):
        return _render(tokenizer, msgs, gen, tools)

    offsets = content_offsets(render, messages, full, add_generation_prompt)
    spans = assistant_spans(render, messages, full, offsets) if offsets is not None else None
    if spans is None:  # a template that rewrites contents: one render per assistant turn
        spans = _label_spans(tokenizer, messages, full, tools)
    literal = set() if parse_special_tokens else set(
        _literal_specials(tokenizer, messages, full, offsets))
    # Cut points: label span edges, image markers and literal special-token text.
    cuts = {0, len(full)}
    for a, b in [*spans, *literal]:
        cuts.update((a, b))
    start = 0
    while (pos := full.find(IMAGE_MARKER, start)) >= 0:
        cuts.update((pos, pos + len(IMAGE_MARKER)))
        start = pos + len(IMAGE_MARKER)
    bounds = sorted(cuts)
    ids: list[int] = []
    labels: list[int] = []
    image_spans: list[tuple[int, int]] = []
    span = 0  # the first label span that does not end before the current piece
    for a, b in zip(bounds[:-1], bounds[1:]):
        piece = full[a:b]
        if piece == IMAGE_MARKER:
            n = image_token_counts[len(image_spans)]
            image_spans.append((len(ids), n))
            ids.extend([IMAGE_PLACEHOLDER] * n)
            labels.extend([IGNORE_INDEX] * n)
            continue
        plain = {"split_special_tokens": True} if (a, b) in literal else {}
        toks = tokenizer(piece, add_special_tokens=False, **plain)["input_ids"]
        while span < len(spans) and spans[span][1] <= a:
            span += 1
        in_label = span < len(spans) and spans[span][0] <= a and b <= spans[span][1]
        ids.extend(toks)
        labels.extend(toks if in_label else [IGNORE_INDEX] * len(toks))
    return EncodedChat(ids, labels, image_spans)


def llava_to_messages(conversations: list[dict], system_prompt: str | None = None) -> list[dict]:
    """LLaVA `conversations` ({from: human|gpt|system, value}) -> chat messages."""
    roles = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
             "system": "system"}
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    for j, turn in enumerate(conversations):
        if not isinstance(turn, dict) or "from" not in turn or "value" not in turn:
            raise GraftDataError(f"conversations[{j}] needs keys 'from' and 'value'")
        role = roles.get(turn["from"])
        if role is None:
            raise GraftDataError(
                f"conversations[{j}].from={turn['from']!r}: use human, gpt or system")
        messages.append({"role": role, "content": str(turn["value"])})
    return messages
