"""Greedy tokens of the engine equal HF `generate` under every scheduling path."""

import pytest

from graft.serving import Engine, EngineConfig, SamplingParams
from tests.serving.conftest import hf_greedy, make_prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
MIXED = (5, 17, 40, 33, 1, 16)  # block boundaries, a single token, a full block


def _check(engine, model_dir, prompts, params=GREEDY):
    outs = engine.generate(prompt_token_ids=prompts, sampling_params=params)
    for i, (p, o) in enumerate(zip(prompts, outs)):
        ref = hf_greedy(model_dir, p, params.max_tokens)
        assert o.token_ids == ref, f"prompt {i} (len {len(p)}) diverges from HF"
        assert o.finish_reason in ("length", "stop")
    return outs


@pytest.mark.parametrize("kernels", ["auto", "reference"])  # auto: the C decode on CPU
def test_parity_every_family_mixed_batch(tiny_llm_any, kernels, monkeypatch):
    monkeypatch.setenv("GRAFT_KERNELS", kernels)
    engine = Engine.from_pretrained(tiny_llm_any, EngineConfig(num_kv_blocks=64))
    free0 = engine.block_manager.num_free_blocks
    _check(engine, tiny_llm_any, make_prompts(MIXED))
    assert engine.block_manager.num_free_blocks == free0
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize("caching", [True, False])
def test_prefix_caching_on_and_off(tiny_llama, caching):
    engine = Engine.from_pretrained(tiny_llama, EngineConfig(enable_prefix_caching=caching))
    shared = make_prompts([37], seed=1)[0]
    tails = make_prompts([3, 9, 20], seed=2)
    _check(engine, tiny_llama, [shared + tails[0]])
    outs = _check(engine, tiny_llama, [shared + t for t in tails[1:]])
    cached = [o.num_cached_tokens for o in outs]
    assert cached == ([32, 32] if caching else [0, 0])  # two full blocks of 16 reused
    # a repeat of a finished request (prompt + output blocks) hits its own blocks
    again = _check(engine, tiny_llama, [shared + tails[0]])
    assert (again[0].num_cached_tokens > 0) == caching


def test_repeat_reuses_the_partial_last_block(tiny_llama):
    engine = Engine.from_pretrained(tiny_llama, EngineConfig())
    free0 = engine.block_manager.num_free_blocks
    prompt = make_prompts([37], seed=4)[0]  # 2 full blocks + 5 tokens in a third
    one = SamplingParams(temperature=0.0, max_tokens=1)
    _check(engine, tiny_llama, [prompt], one)
    again = _check(engine, tiny_llama, [prompt], one)[0]
    assert again.num_cached_tokens == 36  # only the last prompt token is recomputed
    longer = _check(engine, tiny_llama, [prompt + [7, 8]])[0]  # continues the same tail
    assert longer.num_cached_tokens == 37
    assert engine.block_manager.num_free_blocks == free0


def test_chunked_prefill_tiny_budget(tiny_llm_factory):
    model_dir = tiny_llm_factory("qwen3")
    engine = Engine.from_pretrained(model_dir, EngineConfig(max_num_batched_tokens=7))
    _check(engine, model_dir, make_prompts(MIXED))


def test_preemption_with_tiny_pool(tiny_llama):
    cfg = EngineConfig(block_size=4, num_kv_blocks=16, max_num_batched_tokens=64)
    engine = Engine.from_pretrained(tiny_llama, cfg)
    params = SamplingParams(temperature=0.0, max_tokens=20)
    _check(engine, tiny_llama, make_prompts((20, 18, 22, 9), seed=3), params)
    assert engine.scheduler.num_preemptions > 0
    assert engine.block_manager.num_free_blocks == 16


def test_same_prompt_alone_and_in_batch(tiny_llm_factory):
    model_dir = tiny_llm_factory("glm4")
    engine = Engine.from_pretrained(model_dir, EngineConfig(enable_prefix_caching=False))
    target = make_prompts([23], seed=4)[0]
    alone = engine.generate(prompt_token_ids=[target], sampling_params=GREEDY)[0].token_ids
    batch = make_prompts((8, 40, 3), seed=5)
    inside = engine.generate(prompt_token_ids=batch[:2] + [target] + batch[2:],
                             sampling_params=GREEDY)[2].token_ids
    assert alone == inside == hf_greedy(model_dir, target, GREEDY.max_tokens)


def test_blocks_return_after_abort(tiny_llama):
    engine = Engine.from_pretrained(tiny_llama, EngineConfig(num_kv_blocks=40))
    free0 = engine.block_manager.num_free_blocks
    for i, p in enumerate(make_prompts((30, 12, 50), seed=6)):
        engine.add_request(f"r{i}", prompt_token_ids=p,
                           sampling_params=SamplingParams(temperature=0.0, max_tokens=50))
    for _ in range(3):
        engine.step()
    assert engine.block_manager.num_free_blocks < free0
    assert engine.abort("r1") and not engine.abort("r1")
    assert engine.abort("r0") and engine.abort("r2")
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == free0
    assert engine.step() == []


def test_pressure_matches_relaxed_run(tiny_llm_factory):
    """Shared prefixes + a tiny pool + a tiny budget + seeded sampling: same tokens as roomy."""
    model_dir = tiny_llm_factory("qwen2")
    base = make_prompts((35,), seed=7)[0]
    prompts = [base[:n] + t for n, t in zip((35, 20, 35, 3, 16, 35),
                                            make_prompts((4, 11, 1, 30, 9, 17), seed=8))]
    params = [SamplingParams(temperature=0.0, max_tokens=14),
              SamplingParams(temperature=0.9, top_p=0.8, seed=3, max_tokens=14)] * 3
    roomy = Engine.from_pretrained(model_dir, EngineConfig(enable_prefix_caching=False))
    tight = Engine.from_pretrained(model_dir, EngineConfig(
        block_size=4, num_kv_blocks=20, max_num_batched_tokens=10, max_num_seqs=4))
    want = [o.token_ids for o in roomy.generate(prompt_token_ids=prompts, sampling_params=params)]
    got = [o.token_ids for o in tight.generate(prompt_token_ids=prompts, sampling_params=params)]
    assert got == want
    assert tight.scheduler.num_preemptions > 0 and tight.block_manager.hit_tokens > 0
    assert tight.block_manager.num_free_blocks == 20
