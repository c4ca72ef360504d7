"""`graft tune synth`: seeded synthetic traces in the trace format, with their content (the
messages, images as data URLs) so a replay has prompts to send.

Profiles:
  chat         Poisson arrivals, short questions after one shared system prompt, 16-64 tokens out
  copy-heavy   "repeat / fix this text" over a passage: the answer copies the prompt (n-gram
               speculation's best case)
  image-burst  bursts of requests with one or two synthetic images each, a third of them images
               already sent (encoder cache hits)
"""

from __future__ import annotations

import random

from graft.tune.trace import make_record

PROFILES = ("chat", "copy-heavy", "image-burst")
_WORDS = ("red green blue circle square triangle left right top bottom small large what is "
          "shown in the image describe the scene count objects river bank farmer cattle old "
          "oak tree meeting budget slides search page router light settings invoice boxes").split()
_SYSTEM = ("You are a helpful assistant. Answer briefly and precisely, and say so when the "
           "question cannot be answered from what was given.")
_COPY_TASKS = ("Repeat the following text exactly, word for word:\n\n{}",
               "Fix any spelling mistakes in this text and return the full text:\n\n{}")


def synth_trace(profile: str, n: int = 64, seed: int = 0, rate: float = 4.0,
                image_size: int = 64) -> list[dict]:
    """`n` trace records (dicts, arrival order) of `profile`; `rate`: mean requests/s."""
    from graft.errors import GraftConfigError

    if profile not in PROFILES:
        raise GraftConfigError(f"--profile {profile!r}: use one of {', '.join(PROFILES)}")
    rng = random.Random(seed)
    make = {"chat": _chat, "copy-heavy": _copy, "image-burst": _image_burst}[profile]
    records, t, sent = [], 1_700_000_000.0, []  # a fixed epoch: same seed, same file
    for i in range(n):
        t += _gap(profile, i, rng, rate)
        messages, images, out_tokens, prompt_words = make(rng, sent, image_size)
        records.append(make_record(
            arrival=round(t, 6), prompt_tokens=prompt_words, output_tokens=out_tokens,
            images=images, max_tokens=out_tokens, temperature=0.0, stream=True,
            finish_reason="length", messages=messages))
    return records


def _gap(profile: str, i: int, rng: random.Random, rate: float) -> float:
    if profile == "image-burst":  # bursts of 8 at once, then a pause as long as 8 gaps
        return 8.0 / rate if i % 8 == 0 and i else 0.0
    return rng.expovariate(rate)


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def _chat(rng, sent, image_size):
    question = _words(rng, rng.randint(6, 24)) + "?"
    messages = [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": question}]
    return messages, [], rng.randint(16, 64), len((_SYSTEM + " " + question).split())


def _copy(rng, sent, image_size):
    passage = _words(rng, rng.randint(24, 48)) + "."
    text = rng.choice(_COPY_TASKS).format(passage)
    # the answer is about as long as the passage (a word is a token or two)
    return [{"role": "user", "content": text}], [], len(passage.split()) + 8, len(text.split())


def _image_burst(rng, sent, image_size):
    parts, images = [], []
    for _ in range(rng.choice((1, 1, 2))):
        if sent and rng.random() < 1 / 3:
            url, meta = rng.choice(sent)
        else:
            url, meta = _image(rng, image_size)
            sent.append((url, meta))
        parts.append({"type": "image_url", "image_url": {"url": url}})
        images.append(meta)
    question = _words(rng, rng.randint(4, 12)) + "?"
    parts.append({"type": "text", "text": question})
    return [{"role": "user", "content": parts}], images, rng.randint(8, 32), len(question.split())


def _image(rng: random.Random, size: int) -> tuple[str, dict]:
    """(data URL, trace image entry) of a seeded random picture."""
    from graft.digests import pixel_hash

    url, image = random_image(rng.getrandbits(32), size, size)
    return url, {"width": size, "height": size, "sha256": pixel_hash(image), "tokens": None}


def stand_in_text_tokens(record) -> int:
    """Text tokens a stand-in prompt for a record without content should have: its prompt
    less its image tokens and the ~8 the chat template adds itself."""
    return max(1, record.prompt_tokens - sum(im.tokens or 0 for im in record.images) - 8)


def stand_in_images(images) -> list[dict]:
    """Chat image parts for trace images without content: seeded random pixels of each one's
    size, the same picture for the same sha256 (so the encoder cache sees the repeats)."""
    return [{"type": "image_url",
             "image_url": {"url": random_image(int(im.sha256[:16], 16), im.width, im.height)[0]}}
            for im in images]


def random_image(seed: int, width: int, height: int):
    """(data URL, PIL image) of seeded random pixels: same seed and size, same picture."""
    import numpy as np
    from PIL import Image

    from graft.serving.multimodal.media import to_data_url

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    return to_data_url(image), image
