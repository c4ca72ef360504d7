"""The trace format: one JSON object per line, one line per finished request, written by
`graft serve --trace` and `graft tune synth`, read (and checked) by `graft tune`.

A leaf of the tune package (no serving imports): the server's trace writer builds its lines
with `make_record`, so writer and reader share one list of fields.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from graft.errors import GraftConfigError

VERSION = 1
STATUSES = ("ok", "error", "deadline", "abort")
MAX_ARRIVAL = 1e10  # seconds since the epoch (year 2286): time.sleep overflows past ~9e9 s
MAX_COUNT = 10**9  # any token count or size; the model's context bounds them further
# graft serve's default --max-image-pixels, which a replay's server settings keep: a larger
# image could not be replayed, and its stand-in pixels would not fit in memory
MAX_IMAGE_PIXELS = 4096 * 4096
# the fields counting tokens of one request: none may exceed the model's context
TOKEN_COUNTS = ("prompt_tokens", "output_tokens", "max_tokens", "encoder_cache_hit_tokens",
                "prefix_cache_hit_tokens")


@dataclass
class TraceImage:
    width: int
    height: int
    sha256: str  # graft.digests.pixel_hash: same picture, same hash, any encoding
    tokens: int | None = None  # placeholder tokens the server gave it (None: not known)


@dataclass
class TraceRecord:
    arrival: float  # wall-clock seconds (time.time()); replay uses the offsets between lines
    prompt_tokens: int
    output_tokens: int
    images: list[TraceImage] = field(default_factory=list)
    max_tokens: int | None = None  # what the client asked (None: the context's room)
    temperature: float = 1.0
    stream: bool = False
    status: str = "ok"
    finish_reason: str | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    encoder_cache_hit_tokens: int = 0  # image tokens found in the encoder cache at admission
    prefix_cache_hit_tokens: int = 0  # prompt tokens served from the KV prefix cache
    model: str | None = None
    messages: list | None = None  # the chat as sent (only with --trace-content)


def make_record(**values) -> dict:
    """One trace line as a dict (keys in the format's order; `messages` only when given)."""
    images = [im if isinstance(im, dict) else vars(im) for im in values.pop("images", [])]
    record = {"v": VERSION, **vars(TraceRecord(**values, images=[]))}
    record["images"] = images
    if record["messages"] is None:
        del record["messages"]
    return record


# field -> (check, what the value must be); None is allowed where the dataclass default is None
def _int(v):
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_COUNT


def _num(v):  # JSON's Infinity and NaN are numbers to Python: not to a trace
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < math.inf


_COUNT = f"an int from 0 to {MAX_COUNT:.0e}"
_CHECKS = {
    "arrival": (lambda v: _num(v) and v <= MAX_ARRIVAL,
                f"a number of seconds from 0 to {MAX_ARRIVAL:.0e} (time.time() when it arrived)"),
    "prompt_tokens": (_int, _COUNT),
    "output_tokens": (_int, _COUNT),
    "max_tokens": (lambda v: _int(v) and v > 0, f"an int from 1 to {MAX_COUNT:.0e} or null"),
    "temperature": (_num, "a finite number >= 0"),
    "stream": (lambda v: isinstance(v, bool), "true or false"),
    "status": (lambda v: v in STATUSES, f"one of {', '.join(STATUSES)}"),
    "finish_reason": (lambda v: isinstance(v, str), "a string or null"),
    "ttft_ms": (_num, "a finite number >= 0 or null"),
    "tpot_ms": (_num, "a finite number >= 0 or null"),
    "e2e_ms": (_num, "a finite number >= 0 or null"),
    "encoder_cache_hit_tokens": (_int, _COUNT),
    "prefix_cache_hit_tokens": (_int, _COUNT),
    "model": (lambda v: isinstance(v, str), "a string or null"),
    "messages": (lambda v: isinstance(v, list) and all(isinstance(m, dict) for m in v),
                 "a list of chat messages (objects)"),
}
_REQUIRED = ("arrival", "prompt_tokens", "output_tokens")
_NULLABLE = {"max_tokens", "finish_reason", "ttft_ms", "tpot_ms", "e2e_ms", "model", "messages"}
_IMAGE_CHECKS = {
    "width": (lambda v: _int(v) and v > 0, "an int >= 1"),
    "height": (lambda v: _int(v) and v > 0, "an int >= 1"),
    "sha256": (lambda v: isinstance(v, str) and len(v) == 64, "a 64-character hex digest"),
    "tokens": (_int, f"{_COUNT} or null"),
}


def parse_record(obj, where: str, context: int | None = None) -> TraceRecord:
    """A TraceRecord from one decoded line; GraftConfigError naming `where` and the field.
    `context`: the model's context in tokens, which no token count may exceed."""
    if not isinstance(obj, dict):
        raise GraftConfigError(f"{where}: must be a JSON object, got {type(obj).__name__}")
    if obj.get("v", VERSION) != VERSION:
        raise GraftConfigError(f"{where}: field 'v' is {obj.get('v')!r}; this graft reads trace "
                               f"format {VERSION}")
    for name in _REQUIRED:
        if name not in obj:
            raise GraftConfigError(f"{where}: field {name!r} is missing")
    values = {}
    for name, value in obj.items():
        if name in ("v", "images"):
            continue
        if name not in _CHECKS:
            raise GraftConfigError(f"{where}: unknown field {name!r} (fields: "
                                   f"{', '.join(['images', *_CHECKS])})")
        check, wording = _CHECKS[name]
        if not (value is None and name in _NULLABLE) and not check(value):
            raise GraftConfigError(f"{where}: field {name!r} must be {wording}, got {value!r}")
        values[name] = value
    images = obj.get("images", [])
    if not isinstance(images, list):
        raise GraftConfigError(f"{where}: field 'images' must be a list, got {images!r}")
    values["images"] = [_parse_image(im, f"{where}: images[{k}]") for k, im in enumerate(images)]
    record = TraceRecord(**values)
    if context is not None:
        _check_context(record, where, context)
    return record


def _check_context(record: TraceRecord, where: str, context: int) -> None:
    counts = [(name, getattr(record, name)) for name in TOKEN_COUNTS]
    counts += [(f"images[{k}].tokens", im.tokens) for k, im in enumerate(record.images)]
    for name, value in counts:
        if value is not None and value > context:
            raise GraftConfigError(f"{where}: field {name!r} is {value}, more than the model's "
                                   f"context of {context} tokens; fix the line or drop it")


def _parse_image(obj, where: str) -> TraceImage:
    if not isinstance(obj, dict):
        raise GraftConfigError(f"{where}: must be an object with width, height, sha256")
    for name in ("width", "height", "sha256"):
        if name not in obj:
            raise GraftConfigError(f"{where}: field {name!r} is missing")
    for name, value in obj.items():
        if name not in _IMAGE_CHECKS:
            raise GraftConfigError(f"{where}: unknown field {name!r}")
        check, wording = _IMAGE_CHECKS[name]
        if not (value is None and name == "tokens") and not check(value):
            raise GraftConfigError(f"{where}: field {name!r} must be {wording}, got {value!r}")
    if obj["width"] * obj["height"] > MAX_IMAGE_PIXELS:
        raise GraftConfigError(f"{where}: {obj['width']}x{obj['height']} pixels, over the "
                               f"{MAX_IMAGE_PIXELS} a replay serves (graft serve's default "
                               "--max-image-pixels); fix the line or drop it")
    return TraceImage(**obj)


def read_trace(path: str | Path, context: int | None = None) -> list[TraceRecord]:
    """Every record of a trace file, in arrival order; the first bad line is a one-line error
    naming the file, the line number and the field. `context`: the model's context in tokens,
    which bounds every token count."""
    from graft.loads import json_loads

    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise GraftConfigError(f"TRACE {path}: cannot read it ({err.strerror})") from None
    except UnicodeDecodeError:
        raise GraftConfigError(f"TRACE {path}: not UTF-8 text (a trace is JSON lines)") from None
    wheres = (f"{path} line {number}" for number in range(1, len(lines) + 1))
    records = [parse_record(json_loads(line, where), where, context)
               for line, where in zip(lines, wheres) if line.strip()]
    if not records:
        raise GraftConfigError(f"TRACE {path}: no records; record one with graft serve --trace "
                               "or write one with graft tune synth")
    return sorted(records, key=lambda r: r.arrival)


def write_trace(path: str | Path, records: list[dict]) -> Path:
    """A whole trace file from record dicts (make_record), written atomically."""
    import json

    from graft.io import atomic_write_text

    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in records))
    return Path(path)
