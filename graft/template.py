"""Chat formatting: the tokenizer's own chat template, `<image>` markers, label masks.

Text is cut at image markers and at assistant-turn boundaries, and each piece is tokenized
on its own. Training and inference cut prompts at the same places, so they see the same
ids; a text-only prompt is one piece, so it tokenizes exactly as the plain LLM would.
Serving can keep special-token text typed inside messages as plain text.
"""

from __future__ import annotations

import json
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


# apply_chat_template's own parameters and the names HF's renderer defines: a
# chat_template_kwargs entry under one of them would not reach the template as a variable
RESERVED_TEMPLATE_KWARGS = frozenset({
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
    "raise_exception", "strftime_now"})


def _render(tokenizer, messages, add_generation_prompt: bool, extra: dict | None = None,
            continue_final_message: bool = False) -> str:
    """`extra`: more keywords for apply_chat_template (`tools`, the template's variables)."""
    if not getattr(tokenizer, "chat_template", None):
        raise GraftDataError(
            "the LLM tokenizer has no chat_template; use an instruct checkpoint or set "
            "tokenizer.chat_template in its tokenizer_config.json")
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, **(extra or {}))
    except Exception as err:  # noqa: BLE001 - jinja raise_exception, empty chat, bad values
        # one line: HF's continue_final_message error quotes the whole rendered chat
        raise ChatTemplateError(f"the chat template cannot render this conversation: "
                                f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
                                ) from None


def _render_full(tokenizer, messages, add_generation_prompt: bool, extra=None) -> str:
    """The whole chat; on failure, the error names the first message it fails at (the
    shortest failing prefix, found by bisection: a few renders, on the error path only)."""
    try:
        return _render(tokenizer, messages, add_generation_prompt, extra)
    except ChatTemplateError as err:
        lo, hi = 1, len(messages)  # render(messages[:hi]) fails
        while lo < hi:
            mid = (lo + hi) // 2
            try:
                _render(tokenizer, messages[:mid], add_generation_prompt, extra)
                lo = mid + 1
            except ChatTemplateError:
                hi = mid
        raise ChatTemplateError(f"messages[{hi - 1}]: {err}", hi - 1) from None


def _label_spans(tokenizer, messages: list[dict], full: str,
                 extra: dict | None = None) -> list[tuple[int, int]]:
    """Character spans of `full` that belong to assistant turns (content + end token)."""
    spans = []
    for i, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        prefix = _render(tokenizer, messages[:i], True, extra)
        upto = _render(tokenizer, messages[: i + 1], False, extra)
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
    continue_final_message: bool = False,
    template_kwargs: dict | None = None,
    training: bool = False,
) -> EncodedChat:
    """Token ids + labels for `messages`; the k-th `<image>` becomes a run of
    image_token_counts[k] placeholders. Marker/image count mismatch -> GraftDataError.
    parse_special_tokens=False keeps special-token text inside messages (a user typing
    `<|im_start|>system`) as plain text; the template's own control tokens stay special.
    `tools` (OpenAI function tools) go to the template as `apply_chat_template(tools=...)`,
    `template_kwargs` as its variables (`enable_thinking`); continue_final_message ends the
    prompt inside the last message (its end-of-turn text left out), as HF's does.
    Where the template writes no end-of-turn text after an assistant turn (GLM: the next
    role token ends it), the token that follows the turn carries loss too; `training`
    appends the tokenizer's eos token after such a turn that ends the chat, so that
    stopping is learned (GLM's own fine-tuning does the same)."""
    n_markers = count_markers(messages)
    if n_markers != len(image_token_counts):
        raise GraftDataError(
            f"{n_markers} {IMAGE_MARKER} marker(s) in the text but {len(image_token_counts)} "
            f"image(s); put exactly one {IMAGE_MARKER} in the user text per image")
    if continue_final_message and add_generation_prompt:
        raise GraftDataError("continue_final_message goes with add_generation_prompt=False: "
                             "the prompt cannot both continue the last message and open a turn")
    extra = {"tools": tools, **(template_kwargs or {})}
    full = _render_full(tokenizer, messages, add_generation_prompt, extra)

    def render(msgs, gen):
        return _render(tokenizer, msgs, gen, extra)

    offsets = content_offsets(render, messages, full, add_generation_prompt)
    spans = assistant_spans(render, messages, full, offsets) if offsets is not None else None
    if spans is None:  # a template that rewrites contents: one render per assistant turn
        spans = _label_spans(tokenizer, messages, full, extra)
    literal = set() if parse_special_tokens else set(
        _literal_specials(tokenizer, messages, full, offsets))
    end = len(_continued(tokenizer, messages, full, extra) if continue_final_message else full)
    # Cut points: label span edges, image markers and literal special-token text.
    cuts = {0, end}
    for a, b in [*spans, *literal]:
        cuts.update((a, b))
    start = 0
    while (pos := full.find(IMAGE_MARKER, start)) >= 0:
        cuts.update((pos, pos + len(IMAGE_MARKER)))
        start = pos + len(IMAGE_MARKER)
    bounds = sorted(c for c in cuts if c <= end)
    answers = [m for m in messages if m["role"] == "assistant"]
    open_ends = {b for (a, b), m in zip(spans, answers) if _left_open(full[a:b], m)}
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
        if a in open_ends and toks:  # the token that ends an open assistant turn
            labels[-len(toks)] = toks[0]
    eos = getattr(tokenizer, "eos_token_id", None)
    if training and end in open_ends and eos is not None:
        ids.append(eos)
        labels.append(eos)
    return EncodedChat(ids, labels, image_spans)


def _left_open(span_text: str, message: dict) -> bool:
    """Whether an assistant turn's label text ends with its answer (no end-of-turn token)."""
    answer = str(message.get("content") or "").strip()
    return bool(answer) and span_text.rstrip().endswith(answer)


def _continued(tokenizer, messages: list[dict], full: str, extra: dict) -> str:
    """The chat cut after its last message's text: HF's continue_final_message render, which
    must be a prefix of the whole chat `full` for the cut points found on `full` to hold."""
    if not messages or not str(messages[-1].get("content") or "").strip():
        raise ChatTemplateError("continue_final_message needs text in the last message to "
                                "continue; send it or leave continue_final_message unset",
                                len(messages) - 1 if messages else None)
    text = _render(tokenizer, messages, False, extra, continue_final_message=True)
    if not full.startswith(text):
        raise ChatTemplateError("this model's chat template does not render the last message "
                                "as a prefix of the whole chat, so it cannot be continued; "
                                "leave continue_final_message unset", len(messages) - 1)
    return text


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
        value = turn["value"]
        # str() would turn null into the text "None" and a list into its Python repr
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise GraftDataError(f"conversations[{j}].value is {json.dumps(value)[:40]}; "
                                 "it must be the turn's text (a string)")
        messages.append({"role": role, "content": str(value)})
    return messages
