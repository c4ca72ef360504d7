"""The engine worker in-process: per-step encoder budget, EDF among pending requests,
deadlines of requests that never started, pins and blocks released at the end."""

import time

import pytest
from PIL import Image

from graft.serving import Engine, EngineConfig, SamplingParams
from graft.serving.http.engine_worker import EngineWorker
from graft.serving.http.job import Job

ASK = [{"role": "user", "content": "<image>\nWhat color?"}]


@pytest.fixture
def worker(tiny_run_dir):
    engine = Engine.from_pretrained(tiny_run_dir, EngineConfig(block_size=4, num_kv_blocks=96))
    return EngineWorker(engine, encoder_tokens_per_step=16)  # one image per step


def _job(worker, rid, color, events, deadline=None):
    front = worker.engine.mm
    image = front.prepare_image(_loaded(Image.new("RGB", (32, 32), color)))
    prepared = front.prompt(ASK, [image])
    return Job(rid, prepared.prompt_token_ids,
               SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True),
               sink=lambda kind, payload: events.append((rid, kind, payload)),
               prepared=prepared, deadline=deadline,
               encode_tokens=front.uncached_tokens(prepared.images), front=front)


def _loaded(image):
    from graft.serving.multimodal.media import LoadedImage, pixel_hash

    return LoadedImage(image, pixel_hash(image), image.width, image.height)


def test_encoder_budget_edf_and_cleanup(worker):
    events = []
    now = time.monotonic()
    free0 = worker.engine.block_manager.num_free_blocks
    late = _job(worker, "late", (250, 0, 0), events, deadline=now + 600)
    soon = _job(worker, "soon", (0, 250, 0), events, deadline=now + 300)
    none = _job(worker, "none", (0, 0, 250), events)
    for job in (none, late, soon):
        worker.submit(job, budget_s=None)
    assert [j.request_id for j in worker.pending] == ["soon", "late", "none"]  # EDF
    worker._run_once([])  # one step: the encoder budget admits one image only
    assert worker.engine.mm.encode_calls == 1 and list(worker.active) == ["soon"]
    assert [j.request_id for j in worker.pending] == ["late", "none"]
    while worker.pending or worker.engine.has_unfinished_requests():
        worker._run_once([])
    finished = {rid for rid, kind, out in events if kind == "output" and out.finished}
    assert finished == {"soon", "late", "none"} and worker.engine.mm.encode_calls == 3
    assert worker.engine.mm.cache.pinned_bytes == 0 and not worker.active
    assert worker.engine.block_manager.num_free_blocks == free0


def test_pending_request_past_its_deadline(worker):
    events = []
    job = _job(worker, "gone", (9, 9, 9), events, deadline=time.monotonic() - 1.0)
    worker.pending.append(job)  # bypass admission: already late when the worker looks
    worker._run_once([])
    assert events == [("gone", "deadline", None)] and not worker.pending
    assert worker.engine.mm.encode_calls == 0  # never encoded


def test_abort_before_and_after_admission(worker):
    events = []
    a = _job(worker, "a", (1, 2, 3), events)
    b = _job(worker, "b", (3, 2, 1), events)
    worker.submit(a, None)
    worker.submit(b, None)
    worker._run_once([])  # "a" enters the engine, "b" waits for the next encoder budget
    worker._run_once(["a", "b"])
    assert not worker.active and not worker.pending
    assert not worker.engine.has_unfinished_requests()
    assert worker.engine.mm.cache.pinned_bytes == 0
