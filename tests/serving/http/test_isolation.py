"""One request's failure is that request's only: a failure injected into one sequence of a
running batch finishes it with an error, frees its blocks and pins, and the others finish
with exactly the tokens they produce alone."""

import pytest
from PIL import Image

from graft.serving import Engine, EngineConfig, SamplingParams
from graft.serving.http.engine_worker import EngineWorker
from graft.serving.http.job import Job

PROMPTS = {"a": [5, 9, 13, 17, 21, 25, 29], "bad": [6, 10, 14, 18], "c": [7, 11, 15, 19, 23]}
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def _engine(path):
    return Engine.from_pretrained(path, EngineConfig(block_size=4, num_kv_blocks=96))


@pytest.fixture(scope="module")
def alone(tiny_llama):
    """Each prompt's greedy tokens when it runs by itself."""
    engine = _engine(tiny_llama)
    return {rid: engine.generate(prompt_token_ids=[ids], sampling_params=GREEDY)[0].token_ids
            for rid, ids in PROMPTS.items()}


def _run(engine, steps_before_fault: int, fault, params=None):
    free0 = engine.block_manager.num_free_blocks
    for rid, ids in PROMPTS.items():
        engine.add_request(rid, prompt_token_ids=ids,
                           sampling_params=params[rid] if params else GREEDY)
    final = {}
    for step in range(200):  # bounded: 3 requests of 8 tokens need far fewer steps
        if step == steps_before_fault:
            fault()
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
        if not engine.has_unfinished_requests():
            break
    assert engine.block_manager.num_free_blocks == free0  # every block came back
    return final


def test_batched_failure_stays_with_its_request(tiny_llama, alone):
    engine = _engine(tiny_llama)
    real = engine.sampler

    def sampler(logits, seqs):  # a sampler that breaks on one request's row (think: its seed)
        if any(s.request_id == "bad" for s in seqs):
            raise RuntimeError("injected failure")
        return real(logits, seqs)

    final = _run(engine, 2, lambda: setattr(engine, "sampler", sampler))
    assert final["bad"].finish_reason == "internal_error"
    assert "injected failure" in final["bad"].error
    assert len(final["bad"].token_ids) == 2  # what it made before the fault
    for rid in ("a", "c"):
        assert final[rid].finish_reason == "length"
        assert final[rid].token_ids == alone[rid]


def test_seeded_requests_draw_as_alone_after_a_failure_mid_sample(tiny_llama):
    seeded = {rid: SamplingParams(temperature=1.0, seed=i + 1, max_tokens=8, ignore_eos=True)
              for i, rid in enumerate(PROMPTS)}
    alone = {rid: _engine(tiny_llama).generate(prompt_token_ids=[PROMPTS[rid]],
                                               sampling_params=seeded[rid])[0].token_ids
             for rid in ("a", "c")}
    engine = _engine(tiny_llama)
    real = engine.sampler

    def sampler(logits, seqs):  # every row drew its noise, then the batch failed
        got = real(logits, seqs)
        if any(s.request_id == "bad" for s in seqs):
            raise RuntimeError("injected after sampling")
        return got

    final = _run(engine, 2, lambda: setattr(engine, "sampler", sampler), seeded)
    assert final["bad"].finish_reason == "internal_error"
    assert {rid: final[rid].token_ids for rid in ("a", "c")} == alone


def test_per_token_failure_stays_with_its_request(tiny_llama, alone):
    engine = _engine(tiny_llama)
    real = engine.detokenizer.append

    def append(seq):
        if seq.request_id == "bad":
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")
        real(seq)

    final = _run(engine, 3, lambda: setattr(engine.detokenizer, "append", append))
    assert final["bad"].finish_reason == "internal_error"
    assert [final[r].token_ids for r in ("a", "c")] == [alone["a"], alone["c"]]


# -- the engine worker (images, encoder cache pins, sinks) ---------------------------------

ASK = [{"role": "user", "content": "<image>\nWhat color?"}]
COLORS = {"a": (250, 0, 0), "bad": (0, 250, 0), "c": (0, 0, 250)}


def _job(front, rid, events):
    from graft.serving.multimodal.media import LoadedImage, pixel_hash

    image = Image.new("RGB", (32, 32), COLORS[rid])
    prepared = front.prompt(ASK, [front.prepare_image(
        LoadedImage(image, pixel_hash(image), 32, 32))])
    return Job(rid, prepared.prompt_token_ids, GREEDY, prepared=prepared,
               sink=lambda kind, payload: events.append((rid, kind, payload)),
               encode_tokens=front.uncached_tokens(prepared.images), front=front)


def _drive(worker, events):
    for _ in range(200):
        if not (worker.pending or worker.engine.has_unfinished_requests()):
            return {rid: (kind, out) for rid, kind, out in events
                    if kind == "error" or (kind == "output" and out.finished)}
        worker._run_once([])
    raise AssertionError("worker did not finish")


@pytest.fixture
def worker(tiny_run_dir):
    engine = _engine(tiny_run_dir)
    return EngineWorker(engine)


def _reference(tiny_run_dir):
    """The tokens "a" and "c" get alone, through a worker of their own."""
    engine = _engine(tiny_run_dir)
    ref_worker = EngineWorker(engine)
    out = {}
    for rid in ("a", "c"):
        events = []
        ref_worker.submit(_job(ref_worker.engine.mm, rid, events), None)
        out[rid] = _drive(ref_worker, events)[rid][1].token_ids
    return out


def _check(worker, done, ref, free0):
    kind, err = done["bad"]
    assert kind == "error" and err.status == 500 and err.code == "engine_error"
    assert "injected" not in err.message  # internals stay in the server log
    assert {rid: done[rid][1].token_ids for rid in ("a", "c")} == ref
    assert worker.engine.mm.cache.pinned_bytes == 0 and not worker.active and not worker.pending
    assert worker.engine.block_manager.num_free_blocks == free0


def test_worker_encoder_failure_fails_one_job(worker, tiny_run_dir):
    ref = _reference(tiny_run_dir)
    front, events = worker.engine.mm, []
    real = front.image_path.image_features

    def features(images):  # the green image breaks the encoder
        if any(im.getpixel((0, 0)) == COLORS["bad"] for im in images):
            raise RuntimeError("injected encoder failure")
        return real(images)

    front.image_path.image_features = features
    free0 = worker.engine.block_manager.num_free_blocks
    for rid in COLORS:
        worker.submit(_job(front, rid, events), None)
    _check(worker, _drive(worker, events), ref, free0)


def test_worker_engine_failure_fails_one_job(worker, tiny_run_dir):
    ref = _reference(tiny_run_dir)
    engine, events = worker.engine, []
    free0 = engine.block_manager.num_free_blocks
    for rid in COLORS:
        worker.submit(_job(worker.engine.mm, rid, events), None)
    worker._run_once([])
    worker._run_once([])  # all three are running now
    real = engine.sampler

    def sampler(logits, seqs):
        if any(s.request_id == "bad" for s in seqs):
            raise RuntimeError("injected")
        return real(logits, seqs)

    engine.sampler = sampler
    _check(worker, _drive(worker, events), ref, free0)
