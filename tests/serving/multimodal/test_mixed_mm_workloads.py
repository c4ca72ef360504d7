"""Random mixed multimodal workloads, seeded, over one engine holding three grafts: requests
of any graft with 0-2 images drawn from a few (so the encoder cache and the image-keyed
prefix cache hit), text prefixes shared across grafts, image runs cut across prefill chunks,
a pool small enough to preempt, speculation, quantized weights and KV, arrivals between
steps and aborts. Every request that finishes must give the tokens it gives run by itself
in a fresh engine of the same config, and nothing may stay in use: no KV block, no pinned
encoder-cache entry."""

import random

import pytest
from PIL import Image

from graft.serving import Engine, EngineConfig, SamplingParams
from tests.serving.conftest import drain, mixed_arrivals

IMAGES = [Image.new("RGB", (32, 32), color) for color in
          ((220, 20, 20), (20, 20, 220), (20, 200, 40), (240, 240, 240))]
WORDS = "what color is it the picture left right top bottom describe say one word".split()
GRAFTS = ("sig", "sig2", "clip")


def _chat(rng: random.Random, shared: list[str]):
    images = [rng.choice(IMAGES) for _ in range(rng.choice([0, 1, 1, 2]))]
    text = " ".join(shared[:rng.randrange(len(shared) + 1)]
                    + [rng.choice(WORDS) for _ in range(rng.randrange(1, 12))])
    content = "".join("<image>\n" for _ in images) + text
    return [{"role": "user", "content": content}], images


def _params(rng: random.Random) -> SamplingParams:
    kw = dict(max_tokens=rng.choice([1, 3, 8, 20]), ignore_eos=rng.random() < 0.7)
    if rng.random() < 0.3:  # seeded sampling: without speculation, batch-independent
        return SamplingParams(temperature=0.8, seed=rng.randrange(1 << 30), speculative="off", **kw)
    return SamplingParams(temperature=0.0, **kw)


def _config(rng: random.Random) -> EngineConfig:
    return EngineConfig(block_size=rng.choice([4, 16]), num_kv_blocks=rng.choice([16, 32, 128]),
                        max_num_seqs=rng.choice([2, 8]),
                        max_num_batched_tokens=rng.choice([5, 16, 64, 256]),
                        enable_prefix_caching=rng.random() < 0.8,
                        speculative=rng.choice(["off", "ngram", "suffix"]),
                        quantization=rng.choice([None, None, "int8"]),
                        kv_cache_dtype=rng.choice(["auto", "auto", "int8"]))


def _submit(engine, rid, graft, chat, params):
    messages, images = chat
    ids, mm = engine.grafts.front(graft).prepare_chat(messages, images, owner=rid)
    engine.add_request(rid, prompt_token_ids=ids, sampling_params=params, mm_inputs=mm,
                       graft=graft)


@pytest.mark.parametrize("seed", range(10))
def test_each_request_answers_as_alone_and_nothing_stays_used(graft_runs, seed):
    rng, arrivals = random.Random(seed), random.Random(seed + 1)
    config = _config(rng)
    shared = [rng.choice(WORDS) for _ in range(rng.choice([4, 20]))]
    n = rng.randrange(4, 11)
    requests = [(rng.choice(GRAFTS), _chat(rng, shared), _params(rng)) for _ in range(n)]
    engine = Engine.from_grafts(graft_runs, config)
    done, aborted = mixed_arrivals(engine, lambda i: _submit(engine, f"r{i}", *requests[i]), n,
                                   arrivals)
    for i in range(n):
        engine.grafts.front(requests[i][0]).cache.release(f"r{i}")
    assert engine.kv_usage()[0] == 0 and engine.grafts.cache.pinned_bytes == 0, config
    assert set(done) | aborted == {f"r{i}" for i in range(n)}
    for rid, out in done.items():
        graft, chat, params = requests[int(rid[1:])]
        alone = Engine.from_grafts(graft_runs, config)
        _submit(alone, "alone", graft, chat, params)
        want = drain(alone)["alone"]
        assert (out.finish_reason, out.token_ids, out.error) == (
            want.finish_reason, want.token_ids, want.error), (config, graft, chat, params)
