"""Steps with prompt chunks on the one-call C path (graft.serving.models.fused_decode): every
layer in one C call, with the same C functions in the per-op path's order, so the logits and
the KV cache are the per-op path's bit for bit."""

import pytest
import torch

from graft.kernels import cpu_decode, cpu_ops
from graft.kernels.linear_dispatch import bucket
from graft.serving import Engine, EngineConfig, SamplingParams
from tests.serving.conftest import fused_then_per_op, make_prompts, three_decodes

pytestmark = pytest.mark.skipif(
    not cpu_ops.available() or not cpu_ops._lib().graft_paged_prefill_built(),
    reason="no C prefill attention in this build (the C kernels unbuilt, or not built by GCC)")

PARAMS = SamplingParams(temperature=0.0, max_tokens=6)
MIXED_SCHEMES = {"default": "int4", "modules": {"layers.0.*": "int8",
                                                "layers.1.mlp.down_proj": "fp32",
                                                "layers.1.self_attn.*": "bf16"}}
# the C kernel for every linear at every row count: the timed choice (graft.kernels.
# linear_dispatch) could send a tiny model's linears to torch and these steps op by op
C_LINEARS = {"linear_dispatch": "c"}


def _mixed_batch(engine):
    """Three sequences decoding, then prompts of 3, 30 and 70 tokens: the step's budget (64
    tokens) holds the decodes, the short prompts whole and the first rows of the long one."""
    three_decodes(engine, PARAMS)
    for i, p in enumerate(make_prompts((3, 30, 70), seed=11)):
        engine.add_request(f"p{i}", prompt_token_ids=p, sampling_params=PARAMS)
    batch, _ = engine.scheduler.schedule()
    assert batch.num_decodes == 3 and len(batch.seqs) == 6
    return batch


def _count_layer_calls(monkeypatch) -> list:
    calls, real = [], cpu_decode.decode_layers
    monkeypatch.setattr(cpu_decode, "decode_layers",
                        lambda *a, **k: calls.append(a[3].shape[0]) or real(*a, **k))
    return calls


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("kv", ["auto", "bfloat16", "int8"])
def test_a_step_of_decodes_and_prompt_chunks_is_the_per_op_path(tiny_llm_factory, family, kv,
                                                                 monkeypatch):
    """Decodes, whole prompts and a long prompt's first chunk in one step: one C call for
    the layers, the per-op logits and KV pools (int8: the scales too) bit for bit, over mixed
    schemes, Qwen2's qkv bias and Qwen3's q/k norms."""
    engine = Engine.from_pretrained(tiny_llm_factory(family), EngineConfig(
        quantization=MIXED_SCHEMES, kv_cache_dtype=kv, max_num_batched_tokens=64, **C_LINEARS))
    batch = _mixed_batch(engine)
    calls = _count_layer_calls(monkeypatch)
    fused_logits, per_op_logits, fused, before = fused_then_per_op(engine, batch)
    assert calls == [64]
    assert torch.equal(fused_logits, per_op_logits)
    assert not torch.equal(fused[0], before[0])


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_bf16_engine_prefills_in_one_call(tiny_llm_factory, family, monkeypatch):
    """A bf16 engine (bf16 rows between the ops, bf16 KV cache): a chunk after a cached
    prefix and a whole prompt, the per-op path's bits."""
    schemes = {"default": "int4", "modules": {"layers.0.*": "int8", "layers.1.self_attn.*": "bf16"}}
    engine = Engine.from_pretrained(tiny_llm_factory(family), EngineConfig(
        dtype="bfloat16", quantization=schemes, max_num_batched_tokens=48, **C_LINEARS))
    assert engine.runner.model.fused_decode is not None
    long, short = make_prompts([80, 9], seed=5)
    engine.add_request("long", prompt_token_ids=long, sampling_params=PARAMS)
    engine.step()  # its first 48 tokens
    engine.add_request("short", prompt_token_ids=short, sampling_params=PARAMS)
    batch, _ = engine.scheduler.schedule()
    assert batch.num_decodes == 0 and batch.num_tokens == [32, 9]
    calls = _count_layer_calls(monkeypatch)
    fused_logits, per_op_logits, _, _ = fused_then_per_op(engine, batch)
    assert calls == [41] and torch.equal(fused_logits, per_op_logits)


def test_an_moe_model_prefills_in_one_call(tiny_llm_factory, monkeypatch):
    engine = Engine.from_pretrained(tiny_llm_factory("qwen3_moe"), EngineConfig(
        quantization="int8", num_kv_blocks=64, max_num_batched_tokens=64, **C_LINEARS))
    batch = _mixed_batch(engine)
    calls = _count_layer_calls(monkeypatch)
    fused_logits, per_op_logits, _, _ = fused_then_per_op(engine, batch)
    assert calls == [64] and torch.equal(fused_logits, per_op_logits)


def test_a_prompt_with_image_rows_prefills_in_one_call(tiny_llm_factory, monkeypatch):
    """Spliced image rows are embeddings like any other: the layers take them in one call."""
    from tests.serving.engine.test_mm_seam import _image_request

    engine = Engine.from_pretrained(tiny_llm_factory("llama"), EngineConfig(
        quantization="int8", **C_LINEARS))
    _, prompt, mm = _image_request(engine, seed=12)
    engine.add_request("img", prompt, PARAMS, mm_inputs=mm)
    batch, _ = engine.scheduler.schedule()
    calls = _count_layer_calls(monkeypatch)
    fused_logits, per_op_logits, _, _ = fused_then_per_op(engine, batch)
    assert calls == [len(prompt)] and torch.equal(fused_logits, per_op_logits)


def test_a_linear_measured_faster_on_torch_keeps_prompt_steps_op_by_op(tiny_llm_factory):
    """graft.kernels.linear_dispatch's choice holds for prompt rows: where one linear runs on
    torch at the step's row bucket, that step goes op by op; all-decode steps stay in C."""
    engine = Engine.from_pretrained(tiny_llm_factory("llama"),
                                    EngineConfig(quantization="int8", **C_LINEARS))
    model = engine.runner.model
    fused, hidden = model.fused_decode, model.config.hidden_size
    prompts, decodes = (type("Meta", (), {"num_decodes": n})() for n in (3, 64))
    rows = torch.empty((64, hidden))
    assert fused.applies(prompts, rows) and fused.applies(decodes, rows)
    model.layers[1].mlp.down_proj.torch_buckets = frozenset({bucket(64)})
    assert not fused.applies(prompts, rows) and fused.applies(decodes, rows)
    assert bucket(512) != bucket(64) and fused.applies(prompts, torch.empty((512, hidden)))


def test_bad_prompt_chunks_are_refused_before_the_c_call(tiny_llm_factory):
    from graft.serving.models.layers import AttentionMetadata

    engine = Engine.from_pretrained(tiny_llm_factory("llama"), EngineConfig(quantization="int8"))
    runner = engine.runner
    fused, hidden = runner.model.fused_decode, runner.model.config.hidden_size
    cos, sin = runner.cos_table[:4], runner.sin_table[:4]
    meta = AttentionMetadata(
        slot_mapping=torch.arange(4), num_decodes=0, decode_block_tables=None,
        decode_context_lens=None, prefill_block_tables=torch.zeros((1, 1), dtype=torch.int32),
        prefill_cu_seqlens=torch.tensor([0, 4], dtype=torch.int32),
        prefill_context_lens=torch.tensor([2], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"sequence 0 has 4 queries but context_lens\[0\]=2"):
        fused(torch.zeros((4, hidden)), cos, sin, meta)
    meta.prefill_cu_seqlens = torch.tensor([0, 9], dtype=torch.int32)
    meta.prefill_context_lens = torch.tensor([9], dtype=torch.int32)
    with pytest.raises(ValueError, match="must be non-decreasing offsets into q's 4 rows"):
        fused(torch.zeros((4, hidden)), cos, sin, meta)
    meta.prefill_cu_seqlens = torch.tensor([0, 4], dtype=torch.int32)
    meta.prefill_context_lens = torch.tensor([4], dtype=torch.int32)
    meta.prefill_block_tables = torch.tensor([[10 ** 6]], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"paged attention \(layer 0\): a block_tables row holds"):
        fused(torch.zeros((4, hidden)), cos, sin, meta)
