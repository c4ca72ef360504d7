"""LLaVA-format training data: load, validate every sample up front, report bad ones.

A sample is `{"id"?, "image": path | "images": [paths], "conversations": [...]}`, in a JSON
list or one per line (JSON Lines). Validation happens once before training so that step
counts are known and a bad sample is reported with its index or line (or skipped and
counted, with `on_bad_sample: skip`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from graft.digests import pixel_hash
from graft.errors import GraftDataError
from graft.template import IGNORE_INDEX, EncodedChat, encode_chat, llava_to_messages


@dataclass
class Sample:
    index: int  # position in the JSON file
    sample_id: str
    chat: EncodedChat
    image_paths: list[Path]


def load_image(path: str | Path) -> Image.Image:
    """Decode an image to RGB or raise GraftDataError naming the file."""
    try:
        with Image.open(path) as im:
            return im.convert("RGB")
    except FileNotFoundError:
        raise GraftDataError(f"image file {path} does not exist") from None
    except Image.DecompressionBombError as err:  # not an OSError: PIL's guard on huge images
        raise GraftDataError(f"image file {path} is too large to decode ({err}); resize it"
                             ) from None
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise GraftDataError(f"image file {path} cannot be decoded: {err}") from None


# Hash of the decoded pixels (plus size), so re-encoded files still hit; images here are RGB
# (load_image), for which this is the hash it always was.
image_content_hash = pixel_hash


def read_samples(path: str | Path) -> list[tuple[str, object]]:
    """(where, sample) pairs of a JSON list or a JSON Lines file (a file that starts with `{`);
    `where` names the sample in errors: `sample 3` in a JSON list, `line 4` in JSON Lines."""
    path = Path(path)
    if not path.is_file():
        raise GraftDataError(f"data file {path} does not exist (data.train / data.val)")
    try:
        text = path.read_text(encoding="utf-8-sig")  # a BOM (Windows editors) is no error
    except UnicodeDecodeError as err:
        raise GraftDataError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); "
                             "save it as UTF-8") from None
    if text.lstrip().startswith("{"):
        out = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    out.append((f"line {lineno}", json.loads(line)))
                except json.JSONDecodeError as err:
                    raise GraftDataError(f"{path} line {lineno}: not valid JSON ({err}); write "
                                         "a JSON list of samples, or JSON Lines with one whole "
                                         "sample per line") from None
        return out
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise GraftDataError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(raw, list):
        raise GraftDataError(f"{path}: expected a JSON list of samples (or JSON Lines: one "
                             "sample object per line)")
    return [(f"sample {i}", r) for i, r in enumerate(raw)]


def sample_image_paths(raw: dict, image_root: Path) -> list[Path]:
    given = [key for key in ("image", "images") if raw.get(key) is not None]  # null: not given
    if len(given) > 1:
        raise GraftDataError("has both 'image' and 'images'; keep one (a path, or a list of paths)")
    if not given:
        return []
    images = raw[given[0]]
    if isinstance(images, str):
        images = [images]
    if not isinstance(images, list) or not all(isinstance(p, str) for p in images):
        raise GraftDataError("'image'/'images' must be a path or a list of paths")
    return [p if (p := Path(s)).is_absolute() else image_root / p for s in images]


def prepare_samples(
    path: str | Path,
    image_root: str | Path,
    tokenizer,
    image_token_count,  # (width, height) -> number of image tokens after the projector
    max_length: int,
    on_bad_sample: str = "error",
    system_prompt: str | None = None,
    llm_context: int | None = None,  # the LLM's max_position_embeddings, when it has one
) -> tuple[list[Sample], list[str]]:
    """Validated samples and the list of skip reasons (empty unless on_bad_sample=skip)."""
    image_root = Path(image_root)
    samples: list[Sample] = []
    skipped: list[str] = []
    limit = _length_limit(max_length, llm_context)
    for i, (where, raw) in enumerate(read_samples(path)):
        try:
            samples.append(_prepare_one(i, raw, image_root, tokenizer, image_token_count,
                                        limit, system_prompt))
        except GraftDataError as err:
            reason = f"{path} {where}: {err}"
            if on_bad_sample == "error":
                raise GraftDataError(reason + " (set data.on_bad_sample: skip to skip it)") from None
            skipped.append(reason)
    if not samples:
        raise GraftDataError(f"{path}: no usable samples ({len(skipped)} skipped)")
    return samples, skipped


def _length_limit(max_length: int, llm_context: int | None) -> tuple[int, str]:
    """The longest sample allowed and how to say which setting limits it."""
    if llm_context and llm_context < max_length:
        return llm_context, (f"the LLM's context of {llm_context} tokens "
                             f"(max_position_embeddings; data.max_length={max_length}); shorten it")
    return max_length, f"data.max_length={max_length}; shorten it or raise max_length"


def _prepare_one(i, raw, image_root, tokenizer, image_token_count, limit, system_prompt):
    if not isinstance(raw, dict) or not isinstance(raw.get("conversations"), list):
        raise GraftDataError("needs a 'conversations' list")
    paths = sample_image_paths(raw, image_root)
    counts = []
    for p in paths:
        img = load_image(p)  # decodes fully: a truncated file fails here, not mid-training
        counts.append(image_token_count(*img.size))
    messages = llava_to_messages(raw["conversations"], system_prompt)
    if not any(m["role"] == "assistant" for m in messages):
        raise GraftDataError("has no assistant ('gpt') turn, so nothing to learn")
    turns = messages[len(messages) - len(raw["conversations"]):]  # after a system prompt
    empty = [j for j, m in enumerate(turns) if m["role"] == "assistant" and not m["content"].strip()]
    if empty:  # it would teach the model to end its turn at once
        raise GraftDataError(f"conversations[{empty[0]}] is an empty answer; write the answer "
                             "or drop the turn")
    chat = encode_chat(tokenizer, messages, counts, training=True)
    if len(chat.input_ids) > limit[0]:
        raise GraftDataError(
            f"is {len(chat.input_ids)} tokens (images included), longer than {limit[1]}")
    # the first token is predicted by nothing: a label there alone trains nothing
    if all(label == IGNORE_INDEX for label in chat.labels[1:]):
        raise GraftDataError("has no answer token that carries loss (the chat template "
                             "renders no assistant text for it)")
    return Sample(i, str(raw.get("id", i)), chat, paths)
