"""Speculative decoding is lossless: greedy tokens equal the non-speculative engine's for
every family, alone and batched, with prefix caching, chunked prefill, preemption and
quantized weights; rejected proposals leave no trace in the block pool or prefix cache."""

import pytest

from graft.serving import Engine, EngineConfig, SamplingParams
from tests.serving.conftest import make_prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)
MIXED = (5, 17, 40, 33, 1, 16)


class OracleProposer:
    """Proposes the known greedy continuation with every third position wrong, so verify
    steps accept 0..k tokens at every offset and roll back across block boundaries."""

    def __init__(self, prompts, outputs, num_tokens=4, vocab=384):
        self.want = {tuple(p): o for p, o in zip(prompts, outputs)}
        self.num_tokens, self.vocab = num_tokens, vocab

    def propose(self, token_ids, limit=None):
        k = self.num_tokens if limit is None else min(self.num_tokens, limit)
        for prompt, out in self.want.items():
            if tuple(token_ids[:len(prompt)]) == prompt and len(token_ids) >= len(prompt):
                done = len(token_ids) - len(prompt)
                guess = list(out[done:done + k])
                return [(t + 1) % self.vocab if (done + j) % 3 == 2 else t
                        for j, t in enumerate(guess)]
        return []


def _copy_prompts(lengths, seed=0):
    """Random prompts plus one that repeats itself (prompt lookup finds matches at once)."""
    prompts = make_prompts(lengths, seed=seed)
    return prompts + [prompts[-1] + prompts[-1][:12]]


def _run(model_dir, prompts, params=GREEDY, oracle=None, **cfg):
    engine = Engine.from_pretrained(model_dir, EngineConfig(**cfg))
    if oracle is not None:
        engine.spec.ngram = oracle
    free0 = engine.block_manager.num_free_blocks
    outs = engine.generate(prompt_token_ids=prompts, sampling_params=params)
    assert engine.block_manager.num_free_blocks == free0
    assert all(r == 0 for r in engine.block_manager.ref_counts)
    return engine, [o.token_ids for o in outs], outs


def _cached_blocks_are_real(engine, prompts, outputs):
    """Every block in the prefix cache holds a block of some request's prompt + output."""
    bs = engine.block_manager.block_size
    real = set()
    for p, o in zip(prompts, outputs):
        full = p + o
        real.update(tuple(full[i:i + bs]) for i in range(0, len(full) - bs + 1, bs))
    for bid in engine.block_manager.cache.values():
        assert engine.block_manager.block_content[bid][1] in real


@pytest.mark.parametrize("kernels", ["auto", "reference"])
def test_greedy_ngram_equals_plain_every_family(tiny_llm_any, kernels, monkeypatch):
    monkeypatch.setenv("GRAFT_KERNELS", kernels)
    prompts = _copy_prompts(MIXED)
    _, want, _ = _run(tiny_llm_any, prompts, num_kv_blocks=64)
    engine, got, outs = _run(tiny_llm_any, prompts, num_kv_blocks=64, speculative="ngram")
    assert got == want
    stats = engine.stats()
    assert stats.spec_accepted_tokens > 0 and stats.spec_verify_steps > 0
    assert sum(o.spec_proposed_tokens for o in outs) == stats.spec_proposed_tokens
    alone = [_run(tiny_llm_any, [p], num_kv_blocks=64, speculative="ngram")[1][0]
             for p in prompts[-2:]]
    assert alone == want[-2:]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_rejections_roll_back_with_prefix_cache(tiny_llm_factory, family):
    model_dir = tiny_llm_factory(family)
    prompts = _copy_prompts((9, 21, 30, 3))
    cfg = dict(block_size=4, num_kv_blocks=96)
    _, want, _ = _run(model_dir, prompts, **cfg)
    oracle = OracleProposer(prompts, want)
    engine, got, _ = _run(model_dir, prompts, oracle=oracle, speculative="ngram", **cfg)
    assert got == want
    stats = engine.stats()
    assert 0 < stats.spec_accepted_tokens < stats.spec_proposed_tokens
    _cached_blocks_are_real(engine, prompts, got)
    # repeats hit the cached prompt + output blocks: the cached KV must be right
    again = engine.generate(prompt_token_ids=[p + o for p, o in zip(prompts, got)],
                            sampling_params=SamplingParams(temperature=0.0, max_tokens=6))
    plain = Engine.from_pretrained(model_dir, EngineConfig(**cfg)).generate(
        prompt_token_ids=[p + o for p, o in zip(prompts, got)],
        sampling_params=SamplingParams(temperature=0.0, max_tokens=6))
    assert [o.token_ids for o in again] == [o.token_ids for o in plain]
    assert sum(o.num_cached_tokens for o in again) > 0


def test_chunked_prefill_and_preemption(tiny_llm_factory):
    model_dir = tiny_llm_factory("qwen3")
    prompts = _copy_prompts((20, 18, 22, 9), seed=3)
    params = SamplingParams(temperature=0.0, max_tokens=20)
    tight = dict(block_size=4, num_kv_blocks=14, max_num_batched_tokens=8, max_num_seqs=4)
    _, want, _ = _run(model_dir, prompts, params, num_kv_blocks=64)
    oracle = OracleProposer(prompts, want)
    engine, got, _ = _run(model_dir, prompts, params, oracle=oracle, speculative="ngram", **tight)
    assert got == want
    assert engine.scheduler.num_preemptions > 0 and engine.stats().spec_accepted_tokens > 0
    engine, got, _ = _run(model_dir, prompts, params, speculative="ngram", **tight)
    assert got == want


def test_glm4_and_int8_weights_stay_lossless(tiny_llm_factory):
    for family in ("glm4", "llama"):
        model_dir = tiny_llm_factory(family)
        prompts = _copy_prompts((5, 17, 40), seed=1)
        _, want, _ = _run(model_dir, prompts, quantization="int8", num_kv_blocks=64)
        oracle = OracleProposer(prompts, want)
        engine, got, _ = _run(model_dir, prompts, oracle=oracle, quantization="int8",
                              num_kv_blocks=64, speculative="ngram")
        assert got == want and engine.stats().spec_accepted_tokens > 0
        # prompt lookup mixes plain steps (llama: the one-call C decode) with verify steps
        engine, got, _ = _run(model_dir, prompts, quantization="int8", num_kv_blocks=64,
                              speculative="ngram")
        assert got == want
        assert (engine.runner.model.fused_decode is not None) == (family == "llama")


@pytest.mark.parametrize("kv", ["bfloat16", "int8"])
def test_low_precision_kv_caches_stay_lossless(tiny_llama, kv):
    """Rejected proposals' K/V (and an int8 pool's scales) roll back like fp32 rows do."""
    prompts = _copy_prompts((5, 17, 40), seed=2)
    cfg = dict(num_kv_blocks=64, kv_cache_dtype=kv)
    _, want, _ = _run(tiny_llama, prompts, **cfg)
    engine, got, _ = _run(tiny_llama, prompts, oracle=OracleProposer(prompts, want),
                          speculative="ngram", **cfg)
    assert got == want and engine.stats().spec_accepted_tokens > 0


def test_per_request_override_and_off_by_default(tiny_llama):
    prompts = _copy_prompts((12,))
    engine, _, outs = _run(tiny_llama, prompts, num_kv_blocks=64)
    assert engine.stats().spec_verify_steps == 0 and outs[-1].spec_proposed_tokens == 0
    on = SamplingParams(temperature=0.0, max_tokens=24, speculative="ngram")
    engine, got, outs = _run(tiny_llama, prompts, on, num_kv_blocks=64)
    assert outs[-1].spec_accepted_tokens > 0
    off = SamplingParams(temperature=0.0, max_tokens=24, speculative="off")
    engine, _, _ = _run(tiny_llama, prompts, off, num_kv_blocks=64, speculative="ngram")
    assert engine.stats().spec_verify_steps == 0


def test_stop_tokens_and_logprobs_inside_accepted_runs(tiny_llama):
    prompts = _copy_prompts((12, 30))
    _, want, plain = _run(tiny_llama, prompts, SamplingParams(temperature=0.0, max_tokens=24,
                                                              logprobs=2), num_kv_blocks=64)
    stop = want[-1][7]  # finishes the copying request in the middle of an accepted run
    params = SamplingParams(temperature=0.0, max_tokens=24, logprobs=2, stop_token_ids=[stop])
    _, base, _ = _run(tiny_llama, prompts, params, num_kv_blocks=64)
    _, got, outs = _run(tiny_llama, prompts, params, num_kv_blocks=64, speculative="ngram")
    assert got == base and len(got[-1]) <= 8
    _, _, spec = _run(tiny_llama, prompts, SamplingParams(temperature=0.0, max_tokens=24,
                                                          logprobs=2), num_kv_blocks=64,
                      speculative="ngram")
    for a, b in zip(plain, spec):
        assert len(a.logprobs) == len(b.logprobs) == len(a.token_ids)
        for x, y in zip(a.logprobs, b.logprobs):
            assert x.keys() == y.keys()
            assert all(abs(x[t] - y[t]) < 1e-4 for t in x)


@pytest.mark.parametrize("budget", [2048, 7])
def test_images_in_the_prompt(tiny_llama, budget):
    from tests.serving.engine.test_mm_seam import _image_request

    params = SamplingParams(temperature=0.0, max_tokens=20)
    engine = Engine.from_pretrained(tiny_llama, EngineConfig(
        max_num_batched_tokens=budget, block_size=4, num_kv_blocks=64, speculative="ngram"))
    text, prompt, mm = _image_request(engine, seed=30)
    want = Engine.from_pretrained(tiny_llama, EngineConfig(num_kv_blocks=64)).generate(
        prompt_token_ids=[text], sampling_params=params)[0].token_ids
    engine.spec.ngram = OracleProposer([prompt], [want])
    engine.add_request("img", prompt, params, mm_inputs=mm)
    final = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            final = out if out.finished else final
    assert final.token_ids == want and final.spec_accepted_tokens > 0
    assert engine.block_manager.num_free_blocks == 64
