"""Prompt logprobs (SamplingParams.prompt_logprobs) equal HF transformers' log-softmax of the
same prompt, under chunked prefill, preemption, the prefix cache and mixed batches."""

import pytest
import torch

from graft.errors import GraftConfigError
from graft.serving import Engine, EngineConfig, SamplingParams
from graft.serving.engine import prompt_logprobs
from tests.serving.conftest import hf_greedy, make_prompts

_HF = {}


def hf_prompt_logprobs(model_dir, prompt) -> torch.Tensor:
    """log_softmax of HF's logits over the prompt, fp32: row p scores prompt token p + 1."""
    from transformers import AutoModelForCausalLM

    if str(model_dir) not in _HF:
        _HF[str(model_dir)] = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = _HF[str(model_dir)](torch.tensor([prompt])).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


TOL = 2e-4  # the engine's logprobs against HF's (other kernels, other sums)


def rank_bounds(row: torch.Tensor, value: float) -> tuple[int, int]:
    """The ranks a logprob `value` may have in HF's `row`, given TOL: near-ties may order
    either way in the engine's numbers."""
    return int((row > value + TOL).sum()) + 1, int((row > value - TOL).sum()) + 1


def check(model_dir, prompt, entries, k, ranks=None):
    ref = hf_prompt_logprobs(model_dir, prompt)
    assert len(entries) == len(prompt) and entries[0] is None
    for p in range(1, len(prompt)):
        entry, row, token = entries[p], ref[p - 1], prompt[p]
        assert entry[token] == pytest.approx(float(row[token]), abs=TOL), f"position {p}"
        if ranks is not None:
            low, high = rank_bounds(row, float(row[token]))
            assert low <= ranks[p] <= high, f"position {p}"
        others = [t for t in entry if t != token]
        assert len(set(entry) | {token}) in (k, k + 1) and len(others) >= k - 1
        kth = float(torch.topk(row, k).values[-1]) if k else None
        for tid, value in entry.items():
            assert value == pytest.approx(float(row[tid]), abs=TOL)
            assert tid == token or value >= kth - TOL, f"position {p}: {tid} is no top-{k}"


def run(engine, prompts, k=3, max_tokens=4):
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, prompt_logprobs=k)
    return engine.generate(prompt_token_ids=prompts, sampling_params=params)


@pytest.mark.parametrize("k", [0, 3])
def test_prompt_logprobs_equal_hf(tiny_llm_any, k):
    engine = Engine.from_pretrained(tiny_llm_any, EngineConfig(num_kv_blocks=64))
    prompts = make_prompts((1, 2, 17, 40), seed=11)
    outs = run(engine, prompts, k)
    for prompt, out in zip(prompts, outs):
        check(tiny_llm_any, prompt, out.prompt_logprobs, k, out.prompt_ranks)
        assert out.prompt_ranks[0] is None and min(out.prompt_ranks[1:], default=1) >= 1
        assert out.token_ids == hf_greedy(tiny_llm_any, prompt, 4)


def test_chunks_cut_and_small_budget(tiny_llama, monkeypatch):
    """Chunks of 7 tokens (the step budget), and prompts that score at most STEP_TOKENS a
    step between them, beside requests that do not want prompt logprobs (those keep their
    tokens)."""
    prompts = make_prompts((30, 45), seed=12)
    small = Engine.from_pretrained(tiny_llama, EngineConfig(max_num_batched_tokens=7))
    for prompt, out in zip(prompts, run(small, prompts)):
        check(tiny_llama, prompt, out.prompt_logprobs, 3)

    monkeypatch.setattr(prompt_logprobs, "STEP_TOKENS", 8)
    engine = Engine.from_pretrained(tiny_llama, EngineConfig())
    plain = make_prompts((33, 5), seed=13)
    params = [SamplingParams(temperature=0.0, max_tokens=4, prompt_logprobs=2)] * 2 + \
        [SamplingParams(temperature=0.0, max_tokens=4)] * 2
    steps = []
    execute = engine.runner.execute
    engine.runner.execute = lambda batch: steps.append(
        dict(zip([s.request_id for s in batch.seqs], batch.num_tokens))) or execute(batch)
    outs = engine.generate(prompt_token_ids=prompts + plain, sampling_params=params,
                           request_ids=["a", "b", "c", "d"])
    prefills = [{r: n for r, n in step.items() if n > 1} for step in steps]
    assert all(step.get("a", 0) + step.get("b", 0) <= 8 for step in prefills)
    assert max(step.get("c", 0) for step in steps) == 33  # the others' prefill is not cut
    for prompt, out in zip(prompts, outs[:2]):
        check(tiny_llama, prompt, out.prompt_logprobs, 2)
    for prompt, out in zip(plain, outs[2:]):
        assert out.prompt_logprobs is None
        assert out.token_ids == hf_greedy(tiny_llama, prompt, 4)


def test_no_prefix_cache_hits(tiny_llama):
    engine = Engine.from_pretrained(tiny_llama, EngineConfig())
    prompt = make_prompts([40], seed=14)[0]
    plain = SamplingParams(temperature=0.0, max_tokens=2)
    engine.generate(prompt_token_ids=[prompt], sampling_params=plain)
    assert engine.generate(prompt_token_ids=[prompt], sampling_params=plain)[0].num_cached_tokens
    out = run(engine, [prompt])[0]
    assert out.num_cached_tokens == 0  # every position computed, so every position scored
    check(tiny_llama, prompt, out.prompt_logprobs, 3)


def test_preempted_requests_score_once(tiny_llama):
    cfg = EngineConfig(block_size=4, num_kv_blocks=16, max_num_batched_tokens=64)
    engine = Engine.from_pretrained(tiny_llama, cfg)
    prompts = make_prompts((20, 18, 22, 9), seed=3)
    outs = run(engine, prompts, max_tokens=20)
    assert engine.scheduler.num_preemptions > 0
    for prompt, out in zip(prompts, outs):
        check(tiny_llama, prompt, out.prompt_logprobs, 3)
    assert engine.block_manager.num_free_blocks == 16


@pytest.mark.parametrize("bad", [-1, True, 1.5])
def test_bad_values_are_refused(bad):
    with pytest.raises(GraftConfigError, match="SamplingParams.prompt_logprobs"):
        SamplingParams(prompt_logprobs=bad)
