"""Replay through the server's request path on a tiny run dir: records with content send their
messages, records without it get stand-ins of their shape, and a repeated image (same sha256)
stays a repeat, so it is encoded once."""

import dataclasses

import pytest

from graft.errors import GraftConfigError
from graft.tune.replay import StepClock, load_engine, replay
from graft.tune.synth import synth_trace
from graft.tune.trace import parse_record

OPTIONS = {"num_kv_blocks": 96, "max_model_len": 256}


def _records(content: bool):
    records = [parse_record(r, f"record {i}") for i, r in
               enumerate(synth_trace("image-burst", n=8, seed=2, image_size=32))]
    if not content:
        records = [dataclasses.replace(r, messages=None) for r in records]
    return records


@pytest.mark.parametrize("content", [True, False])
def test_image_burst_replays_with_cache_hits(tiny_run_dir, content):
    records = _records(content)
    unique = len({im.sha256 for r in records for im in r.images})
    assert unique < sum(len(r.images) for r in records)  # the trace repeats images
    engine = load_engine(tiny_run_dir, OPTIONS)
    summary = replay(engine, records, clock=StepClock(0.01), warmup=False)
    assert (summary["completed"], summary["failed"]) == (8, 0)
    assert summary["output_tokens"] == sum(r.output_tokens for r in records)
    assert engine.mm.misses == unique  # each distinct picture encoded once, repeats reused
    assert summary["ttft_ms"]["p99"] > 0 and summary["steps"] > 0


def test_images_on_a_text_only_model_name_the_record(tiny_llama):
    engine = load_engine(tiny_llama, OPTIONS)
    with pytest.raises(GraftConfigError, match="trace record 1 .*text-only"):
        replay(engine, _records(True), clock=StepClock(0.01), warmup=False)
