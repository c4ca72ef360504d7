"""LLaVA-format training data: load, validate every sample up front, report bad ones.

A sample is `{"id"?, "image": path | "images": [paths], "conversations": [...]}`.
Validation happens once before training so that step counts are known and a bad sample
is reported with its index (or skipped and counted, with `on_bad_sample: skip`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from graft.digests import pixel_hash
from graft.errors import GraftDataError
from graft.template import EncodedChat, encode_chat, llava_to_messages


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
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise GraftDataError(f"image file {path} cannot be decoded: {err}") from None


# Hash of the decoded pixels (plus size), so re-encoded files still hit; images here are RGB
# (load_image), for which this is the hash it always was.
image_content_hash = pixel_hash


def read_json_samples(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise GraftDataError(f"data file {path} does not exist (data.train / data.val)")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise GraftDataError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(raw, list):
        raise GraftDataError(f"{path}: expected a JSON list of samples")
    return raw


def sample_image_paths(raw: dict, image_root: Path) -> list[Path]:
    images = raw.get("images", raw.get("image"))
    if images is None:
        return []
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
) -> tuple[list[Sample], list[str]]:
    """Validated samples and the list of skip reasons (empty unless on_bad_sample=skip)."""
    image_root = Path(image_root)
    samples: list[Sample] = []
    skipped: list[str] = []
    for i, raw in enumerate(read_json_samples(path)):
        try:
            samples.append(_prepare_one(i, raw, image_root, tokenizer, image_token_count,
                                        max_length, system_prompt))
        except GraftDataError as err:
            reason = f"{path} sample {i}: {err}"
            if on_bad_sample == "error":
                raise GraftDataError(reason + " (set data.on_bad_sample: skip to skip it)") from None
            skipped.append(reason)
    if not samples:
        raise GraftDataError(f"{path}: no usable samples ({len(skipped)} skipped)")
    return samples, skipped


def _prepare_one(i, raw, image_root, tokenizer, image_token_count, max_length, system_prompt):
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
    chat = encode_chat(tokenizer, messages, counts)
    if len(chat.input_ids) > max_length:
        raise GraftDataError(
            f"is {len(chat.input_ids)} tokens (images included), longer than "
            f"data.max_length={max_length}; shorten it or raise max_length")
    return Sample(i, str(raw.get("id", i)), chat, paths)
