"""Suffix decoding: proposals from recent requests' outputs, bounded memory, lossless."""

from graft.serving import Engine, EngineConfig, SamplingParams
from graft.serving.engine.spec_decode.suffix import SuffixIndex
from tests.serving.conftest import make_prompts


def test_most_frequent_continuation_of_the_longest_context():
    index = SuffixIndex(min_n=2, max_n=3, num_tokens=4)
    index.add([1, 2, 3, 4, 5])
    index.add([1, 2, 3, 4, 5])
    index.add([9, 2, 3, 7, 8])
    assert index.propose([6, 1, 2, 3]) == [4, 5]  # context (1, 2, 3): seen twice, then 4 5
    assert index.propose([6, 9, 2, 3]) == [7, 8]  # the longer context (9, 2, 3) wins
    assert index.propose([6, 0, 2, 3]) == [4, 5]  # (2, 3): 4 in two of three cases
    assert index.propose([6, 0, 2, 3], limit=1) == [4]
    assert index.propose([5, 6]) == []


def test_memory_is_bounded_and_forgetting_removes_counts():
    index = SuffixIndex(min_n=2, max_n=2, num_tokens=4, max_tokens=8)
    index.add([1, 2, 3, 4, 5])
    index.add([6, 7, 8, 9, 10])  # 10 tokens > 8: the first output is forgotten
    assert index.size == 5 and len(index.outputs) == 1
    assert index.propose([1, 2]) == []
    assert index.propose([6, 7]) == [8, 9, 10]
    assert all(key[0] >= 6 for key in index.next)


def test_repeated_requests_are_lossless_and_hit_the_index(tiny_llm_factory):
    model_dir = tiny_llm_factory("qwen2")
    prompts = make_prompts((14, 30), seed=11)
    params = SamplingParams(temperature=0.0, max_tokens=24)
    plain = Engine.from_pretrained(model_dir, EngineConfig(num_kv_blocks=64))
    want = [o.token_ids for o in plain.generate(prompt_token_ids=prompts, sampling_params=params)]
    engine = Engine.from_pretrained(model_dir, EngineConfig(
        num_kv_blocks=64, speculative="suffix", enable_prefix_caching=False))
    first = engine.generate(prompt_token_ids=prompts, sampling_params=params)
    assert [o.token_ids for o in first] == want
    assert engine.spec.suffix.size > 0
    again = engine.generate(prompt_token_ids=prompts, sampling_params=params)
    assert [o.token_ids for o in again] == want
    assert sum(o.spec_accepted_tokens for o in again) > sum(o.spec_accepted_tokens for o in first)
    assert engine.block_manager.num_free_blocks == 64
    off = Engine.from_pretrained(model_dir, EngineConfig(num_kv_blocks=64))
    off.generate(prompt_token_ids=prompts, sampling_params=params)
    assert off.spec.suffix.size == 0  # nothing is remembered unless suffix mode is used
