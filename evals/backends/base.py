"""What every backend takes and returns: one Request in, one Result out, in order."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Request:
    messages: list[dict]  # role/content dicts; user text carries one <image> marker per image
    images: list[Path] = field(default_factory=list)  # image files, in marker order
    max_new_tokens: int = 32
    temperature: float = 0.0
    seed: int = 0  # used only when temperature > 0


@dataclass
class Result:
    prediction: str | None  # None when the request failed
    latency: float | None = None  # seconds from send to last token
    ttft: float | None = None  # seconds to the first token, where the backend can see it
    error: str | None = None  # why it failed; the run records it and goes on
    cached: bool = False  # came from the response cache, latencies are the original ones


def load_images(paths: list[Path]):
    from PIL import Image

    out = []
    for p in paths:
        with Image.open(p) as im:
            out.append(im.convert("RGB"))
    return out
