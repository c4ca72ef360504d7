"""Embeddings (PoolingParams): equal to HF transformers' last_hidden_state pooled the same way,
for every LLM family, under chunked prefill, preemption, the prefix cache, image rows and
batches shared with generating requests, which keep their tokens."""

import pytest
import torch

from graft.errors import GraftConfigError
from graft.inject import IMAGE_PLACEHOLDER
from graft.serving import (Engine, EngineConfig, ImageRange, MultiModalInputs, PoolingParams,
                           SamplingParams)
from tests.serving.conftest import hf_greedy, make_prompts

_HF = {}
TOL = 1e-5  # unit vectors: the engine's kernels and sums against HF's


def hf_hidden(model_dir, prompt=None, embeds=None) -> torch.Tensor:
    """HF's last_hidden_state (after the final norm) of one prompt, fp32 [P, d]."""
    from transformers import AutoModel

    if str(model_dir) not in _HF:
        _HF[str(model_dir)] = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    model = _HF[str(model_dir)]
    with torch.no_grad():
        if embeds is not None:
            return model(inputs_embeds=embeds[None]).last_hidden_state[0]
        return model(torch.tensor([prompt])).last_hidden_state[0]


def pooled(hidden: torch.Tensor, kind: str, normalize: bool = True) -> torch.Tensor:
    v = {"last": hidden[-1], "mean": hidden.mean(dim=0), "cls": hidden[0]}[kind]
    return torch.nn.functional.normalize(v, dim=0) if normalize else v


def check(model_dir, prompt, out, kind="last", normalize=True):
    assert out.finished and out.finish_reason == "stop" and out.token_ids == []
    want = pooled(hf_hidden(model_dir, prompt), kind, normalize)
    got = torch.tensor(out.embedding)
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=TOL * (1 if normalize else want.abs().max())), \
        (got - want).abs().max()


def run_beside(engine, texts, max_tokens, embeds, kind) -> dict:
    """Greedy generations g0, g1, ... of texts queued first, then embeddings e0, e1, ... of
    embeds; every final output by request id once all are done."""
    for i, prompt in enumerate(texts):
        engine.add_request(f"g{i}", prompt_token_ids=prompt, sampling_params=SamplingParams(
            temperature=0.0, max_tokens=max_tokens))
    for i, prompt in enumerate(embeds):
        engine.add_request(f"e{i}", prompt_token_ids=prompt, sampling_params=PoolingParams(kind))
    finals = {}
    while engine.has_unfinished_requests():
        finals.update({o.request_id: o for o in engine.step() if o.finished})
    return finals


@pytest.mark.parametrize("kind", ["last", "mean", "cls"])
def test_embeddings_equal_hf(tiny_llm_any, kind):
    engine = Engine.from_pretrained(tiny_llm_any, EngineConfig(num_kv_blocks=64))
    prompts = make_prompts((1, 2, 17, 40), seed=21)
    outs = engine.embed(prompt_token_ids=prompts, pooling_params=PoolingParams(kind))
    for prompt, out in zip(prompts, outs):
        check(tiny_llm_any, prompt, out, kind)
    assert engine.block_manager.num_free_blocks == 64


def test_unnormalized_and_text_prompts(tiny_llama):
    engine = Engine.from_pretrained(tiny_llama, EngineConfig())
    prompt = make_prompts([12], seed=22)[0]
    out = engine.embed(prompt_token_ids=[prompt],
                       pooling_params=PoolingParams("mean", normalize=False))[0]
    check(tiny_llama, prompt, out, "mean", normalize=False)
    assert abs(torch.tensor(out.embedding).norm() - 1) > 1e-3


@pytest.mark.parametrize("kind", ["last", "mean", "cls"])
def test_chunked_and_beside_generation(tiny_llama, kind):
    """Chunks of 7 tokens (the step budget), embeddings and generations in the same steps:
    every embedding as alone, every generation HF's greedy tokens."""
    engine = Engine.from_pretrained(tiny_llama, EngineConfig(max_num_batched_tokens=7))
    embeds, texts = make_prompts((30, 9, 1), seed=23), make_prompts((25, 4), seed=24)
    steps = []
    execute = engine.runner.execute
    engine.runner.execute = lambda batch: steps.append(
        {s.request_id for s in batch.seqs}) or execute(batch)
    finals = run_beside(engine, texts, 6, embeds, kind)
    assert any("e0" in s and any(r.startswith("g") for r in s) for s in steps)
    for i, prompt in enumerate(embeds):
        check(tiny_llama, prompt, finals[f"e{i}"], kind)
    for i, prompt in enumerate(texts):
        assert finals[f"g{i}"].token_ids == hf_greedy(tiny_llama, prompt, 6)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_prefix_cache_last_only(tiny_llama):
    """last pooling takes prefix-cache hits (its last position is computed anyway); mean
    computes the whole prompt, as its average needs every position."""
    engine = Engine.from_pretrained(tiny_llama, EngineConfig())
    prompt = make_prompts([40], seed=25)[0]
    engine.generate(prompt_token_ids=[prompt], sampling_params=SamplingParams(max_tokens=1))
    last = engine.embed(prompt_token_ids=[prompt])[0]
    assert last.num_cached_tokens > 0
    check(tiny_llama, prompt, last)
    mean = engine.embed(prompt_token_ids=[prompt], pooling_params=PoolingParams("mean"))[0]
    assert mean.num_cached_tokens == 0
    check(tiny_llama, prompt, mean, "mean")


@pytest.mark.parametrize("kind", ["last", "mean"])
def test_preempted_embeddings_pool_once(tiny_llama, kind):
    cfg = EngineConfig(block_size=4, num_kv_blocks=16, max_num_batched_tokens=8)
    engine = Engine.from_pretrained(tiny_llama, cfg)
    texts = make_prompts((20, 22), seed=26)
    embeds = make_prompts((30, 26), seed=27)
    finals = run_beside(engine, texts, 20, embeds, kind)  # (generations preempt embeddings)
    assert engine.scheduler.num_preemptions > 0
    for i, prompt in enumerate(embeds):
        check(tiny_llama, prompt, finals[f"e{i}"], kind)
    assert engine.block_manager.num_free_blocks == 16


def test_image_rows_are_pooled(tiny_llama):
    """A prompt with an image run: its rows are the model's input there, as HF's
    inputs_embeds."""
    engine = Engine.from_pretrained(tiny_llama, EngineConfig(max_num_batched_tokens=7))
    text = make_prompts((30,), seed=28)[0]
    rows = torch.randn(10, engine.runner.hidden_size, generator=torch.Generator().manual_seed(0))
    prompt = text[:5] + [IMAGE_PLACEHOLDER] * 10 + text[15:]
    mm = MultiModalInputs([ImageRange(5, 10, "img", rows)])
    out = engine.embed(prompt_token_ids=[prompt], pooling_params=PoolingParams("mean"),
                       mm_inputs=[mm])[0]
    embeds = _HF_embeddings(tiny_llama, text)
    embeds[5:15] = rows
    want = pooled(hf_hidden(tiny_llama, embeds=embeds), "mean")
    assert torch.allclose(torch.tensor(out.embedding), want, atol=TOL)


def _HF_embeddings(model_dir, ids) -> torch.Tensor:
    hf_hidden(model_dir, ids[:1])  # loads the model
    return _HF[str(model_dir)].get_input_embeddings()(torch.tensor(ids)).detach().clone()


def test_bad_prompt_fails_alone(tiny_llama):
    engine = Engine.from_pretrained(tiny_llama, EngineConfig(max_model_len=32))
    good = make_prompts([8], seed=29)[0]
    outs = engine.embed(prompt_token_ids=[good, list(range(40))])
    check(tiny_llama, good, outs[0])
    assert outs[1].finish_reason == "error" and "max_model_len" in outs[1].error
    assert outs[1].embedding is None


@pytest.mark.parametrize("kw, match", [({"pooling": "max"}, "pooling must be one of"),
                                       ({"normalize": 1}, "normalize must be a bool")])
def test_bad_pooling_params(kw, match):
    with pytest.raises(GraftConfigError, match=match):
        PoolingParams(**kw)
