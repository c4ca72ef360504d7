"""Chat formatting: the tokenizer's own chat template, `<image>` markers, label masks.

Text is cut at image markers and at assistant-turn boundaries, and each piece is tokenized
on its own. Training and inference cut prompts at the same places, so they see the same
ids; a text-only prompt is one piece, so it tokenizes exactly as the plain LLM would.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graft.errors import GraftDataError
from graft.inject import IMAGE_PLACEHOLDER

IMAGE_MARKER = "<image>"
IGNORE_INDEX = -100  # label value that carries no loss (HF convention)


@dataclass
class EncodedChat:
    input_ids: list[int]  # IMAGE_PLACEHOLDER runs at image positions
    labels: list[int]  # IGNORE_INDEX outside assistant turns
    image_spans: list[tuple[int, int]] = field(default_factory=list)  # (offset, length) per image


def count_markers(messages: list[dict]) -> int:
    return sum(str(m.get("content", "")).count(IMAGE_MARKER) for m in messages)


def _render(tokenizer, messages, add_generation_prompt: bool) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise GraftDataError(
            "the LLM tokenizer has no chat_template; use an instruct checkpoint or set "
            "tokenizer.chat_template in its tokenizer_config.json")
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def _label_spans(tokenizer, messages: list[dict], full: str) -> list[tuple[int, int]]:
    """Character spans of `full` that belong to assistant turns (content + end token)."""
    spans = []
    for i, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        prefix = _render(tokenizer, messages[:i], add_generation_prompt=True)
        upto = _render(tokenizer, messages[: i + 1], add_generation_prompt=False)
        if not (upto.startswith(prefix) and full.startswith(upto)):
            raise GraftDataError(
                "the chat template does not render conversations as growing prefixes; "
                "assistant turns cannot be located for label masking")
        spans.append((len(prefix), len(upto)))
    return spans


def encode_chat(
    tokenizer,
    messages: list[dict],
    image_token_counts: list[int],
    add_generation_prompt: bool = False,
) -> EncodedChat:
    """Token ids + labels for `messages`; the k-th `<image>` becomes a run of
    image_token_counts[k] placeholders. Marker/image count mismatch -> GraftDataError."""
    n_markers = count_markers(messages)
    if n_markers != len(image_token_counts):
        raise GraftDataError(
            f"{n_markers} {IMAGE_MARKER} marker(s) in the text but {len(image_token_counts)} "
            f"image(s); put exactly one {IMAGE_MARKER} in the user text per image")
    full = _render(tokenizer, messages, add_generation_prompt)
    spans = _label_spans(tokenizer, messages, full)
    # Cut points: label span edges and image markers.
    cuts = {0, len(full)}
    for a, b in spans:
        cuts.update((a, b))
    start = 0
    while (pos := full.find(IMAGE_MARKER, start)) >= 0:
        cuts.update((pos, pos + len(IMAGE_MARKER)))
        start = pos + len(IMAGE_MARKER)
    bounds = sorted(cuts)
    ids: list[int] = []
    labels: list[int] = []
    image_spans: list[tuple[int, int]] = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        piece = full[a:b]
        if piece == IMAGE_MARKER:
            n = image_token_counts[len(image_spans)]
            image_spans.append((len(ids), n))
            ids.extend([IMAGE_PLACEHOLDER] * n)
            labels.extend([IGNORE_INDEX] * n)
            continue
        toks = tokenizer(piece, add_special_tokens=False)["input_ids"]
        in_label = any(sa <= a and b <= sb for sa, sb in spans)
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
