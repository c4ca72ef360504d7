"""`graft bench serve URL --trace TRACE`: send a recorded (or synthetic) trace to a server.

Each record becomes the chat a client sent, at the trace's arrival gaps divided by
`--speed`, forced to the recorded output length (`max_tokens` = recorded output tokens,
`ignore_eos`), so two servers given the same trace get the same work. Records written with
`--trace-content` (and `graft tune synth` traces) send their own messages; the others get
stand-ins of the recorded shape: random words of about the prompt length (a word is one or
two tokens) and per image seeded random pixels of its size, the same picture for the same
sha256 so the encoder cache sees the trace's repeats. `graft tune` replays the same way
in-process; this is the served side of that comparison.
"""

from __future__ import annotations

import random

from graft.benchmarks.prompt_words import random_prompt
from graft.tune.trace import TraceRecord


def trace_workload(records: list[TraceRecord], model: str, speed: float = 1.0,
                   seed: int = 0) -> list[tuple[float, dict, bool]]:
    """(seconds after the first arrival, chat body, has image) per record; `records` in
    arrival order."""
    if speed <= 0:
        from graft.errors import GraftConfigError

        raise GraftConfigError(f"--speed {speed}: must be > 0 (2 sends the trace twice as fast)")
    rng = random.Random(seed)
    base = records[0].arrival if records else 0.0
    out = []
    for r in records:
        body = {"model": model, "messages": r.messages or _stand_in(r, rng),
                "max_tokens": max(1, r.output_tokens), "ignore_eos": True,
                "temperature": r.temperature, "stream": True,
                "stream_options": {"include_usage": True}}
        out.append(((r.arrival - base) / speed, body, bool(r.images)))
    return out


def _stand_in(record: TraceRecord, rng: random.Random) -> list[dict]:
    from graft.tune.synth import stand_in_images, stand_in_text_tokens

    words = max(1, round(stand_in_text_tokens(record) / 1.3))  # a word here is ~1.3 tokens
    text = random_prompt(rng, words)
    return [{"role": "user",
             "content": stand_in_images(record.images) + [{"type": "text", "text": text}]}]
