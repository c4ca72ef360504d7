"""The engine on a CUDA GPU, where attention, norms, RoPE and the KV store run as Triton kernels
and decode steps replay CUDA graphs: greedy tokens equal HF transformers `generate` on the same
GPU (fp32) under every scheduling path. Skipped without a GPU; `make gpu-check` runs it on one.
"""

import pytest
import torch

from graft.inject import IMAGE_PLACEHOLDER
from graft.kernels import backend_name
from graft.serving import Engine, EngineConfig, ImageRange, MultiModalInputs, SamplingParams
from tests.serving.conftest import hf_greedy, make_prompts, written_slots

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
MIXED = (5, 17, 40, 33, 1, 16)
def _engine(model_dir, **kw):
    return Engine.from_pretrained(model_dir, EngineConfig(device="cuda", **kw))


def _check(engine, model_dir, prompts, params=GREEDY):
    outs = engine.generate(prompt_token_ids=prompts, sampling_params=params)
    for i, (p, o) in enumerate(zip(prompts, outs)):
        assert o.token_ids == hf_greedy(model_dir, p, params.max_tokens, "cuda"), f"prompt {i} (len {len(p)})"
    return outs


@pytest.fixture(autouse=True)
def _no_tf32(monkeypatch):
    # HF's fp32 matmuls must stay fp32 for the comparison to mean anything
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)


def test_every_family_on_triton(tiny_llm_any):
    engine = _engine(tiny_llm_any, num_kv_blocks=64)
    assert backend_name(engine.runner.kv_cache) == "triton"
    free0 = engine.block_manager.num_free_blocks
    _check(engine, tiny_llm_any, make_prompts(MIXED))
    assert engine.block_manager.num_free_blocks == free0
    assert engine.runner.decode_graphs.replays > 0


@pytest.mark.parametrize("family", ["qwen3_moe", "glm4_moe"])
@pytest.mark.parametrize("quantization", [None, "int8"])  # grouped GEMM / weight-only per expert
def test_moe_families_on_triton(tiny_llm_factory, family, quantization):
    model_dir = tiny_llm_factory(family)
    engine = _engine(model_dir, num_kv_blocks=64, quantization=quantization)
    assert engine.runner.decode_graphs is None  # experts are picked on the host: eager steps
    if quantization is None:
        _check(engine, model_dir, make_prompts(MIXED))
        assert engine.runner.model.moe_blocks()[0]._stacked is not None
    else:  # against HF on the same dequantized weights
        from transformers import AutoModelForCausalLM

        from graft.serving.models.quant_config import dequantize_hf_model
        hf = dequantize_hf_model(AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32).eval(), engine.runner.quant_plan).to("cuda")
        prompts = make_prompts((5, 17, 40))
        for p, o in zip(prompts, engine.generate(prompt_token_ids=prompts, sampling_params=GREEDY)):
            ids = torch.tensor([p], device="cuda")
            want = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                               max_new_tokens=GREEDY.max_tokens)[0, len(p):].tolist()
            assert o.token_ids == want


@pytest.mark.parametrize("n", [1, 3, 5, 9])  # 3 -> graph of 4, 5 and 9 -> padded graphs of 8, 16
def test_graphs_equal_eager_at_padded_sizes(tiny_llama, n):
    prompts = make_prompts(range(7, 7 + 5 * n, 5), seed=n)
    params = SamplingParams(temperature=0.0, max_tokens=24)  # crosses a block boundary
    graphs = _engine(tiny_llama, max_num_seqs=16)
    assert graphs.runner.decode_graphs.sizes == [1, 2, 4, 8, 16]
    eager = _engine(tiny_llama, max_num_seqs=16, enforce_eager=True)
    assert eager.runner.decode_graphs is None
    got = [o.token_ids for o in graphs.generate(prompt_token_ids=prompts, sampling_params=params)]
    want = [o.token_ids for o in eager.generate(prompt_token_ids=prompts, sampling_params=params)]
    assert got == want and graphs.runner.decode_graphs.replays >= 23
    # padding rows (slot -1) wrote nothing: the same KV slots were written as eagerly
    assert torch.equal(written_slots(graphs), written_slots(eager))
    assert graphs.block_manager.num_free_blocks == graphs.block_manager.num_blocks


def test_prefix_cache_chunked_prefill_and_preemption(tiny_llama):
    shared = make_prompts([37], seed=1)[0]
    tails = make_prompts([3, 9, 20], seed=2)
    engine = _engine(tiny_llama)
    _check(engine, tiny_llama, [shared + tails[0]])
    outs = _check(engine, tiny_llama, [shared + t for t in tails[1:]])
    assert [o.num_cached_tokens for o in outs] == [32, 32]
    _check(_engine(tiny_llama, max_num_batched_tokens=7), tiny_llama, make_prompts(MIXED))
    tight = _engine(tiny_llama, block_size=4, num_kv_blocks=16, max_num_batched_tokens=64)
    _check(tight, tiny_llama, make_prompts((20, 18, 22, 9), seed=3),
           SamplingParams(temperature=0.0, max_tokens=20))
    assert tight.scheduler.num_preemptions > 0 and tight.block_manager.num_free_blocks == 16


def test_spliced_image_rows_across_chunks(tiny_llama):
    engine = _engine(tiny_llama, max_num_batched_tokens=7)
    text = make_prompts((40,), seed=30)[0]
    image_ids = torch.tensor(text[5:25], device=engine.runner.device)
    rows = engine.runner.model.embed(image_ids).detach().clone()
    prompt = text[:5] + [IMAGE_PLACEHOLDER] * 20 + text[25:]
    engine.add_request("img", prompt, GREEDY, mm_inputs=MultiModalInputs([ImageRange(5, 20, "h", rows)]))
    final = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            final = out if out.finished else final
    assert final.token_ids == hf_greedy(tiny_llama, text, GREEDY.max_tokens, "cuda")


def test_seeded_sampling_is_reproducible_and_bf16_runs(tiny_llama):
    prompts = make_prompts((9, 30), seed=9)
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, seed=5, max_tokens=10)
    one = [o.token_ids for o in _engine(tiny_llama).generate(prompt_token_ids=prompts, sampling_params=params)]
    two = [o.token_ids for o in _engine(tiny_llama).generate(prompt_token_ids=prompts, sampling_params=params)]
    assert one == two
    outs = _engine(tiny_llama, dtype="bfloat16").generate(prompt_token_ids=prompts, sampling_params=GREEDY)
    assert [len(o.token_ids) for o in outs] == [12, 12]
