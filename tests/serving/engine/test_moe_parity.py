"""MoE families (Qwen3-MoE, GLM-4.5): greedy tokens equal HF `generate`, alone and batched,
with chunked prefill and prefix caching, in fp32 and with quantized experts against HF on the
same dequantized weights; the MoE block runs each active expert once and reads no other."""

import pytest
import torch

from graft.kernels import cpu_decode
from graft.serving import Engine, EngineConfig, SamplingParams
from graft.serving.models.moe import MoEBlock, MoeDecoderLayer, TopKRouter
from graft.serving.models.quant_config import dequantize_hf_model
from tests.serving.conftest import fused_then_per_op, hf_greedy, make_prompts, three_decodes
from tests.tiny_llm import MOE_FAMILIES

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
MIXED = (5, 17, 40, 33, 1, 16)


@pytest.fixture(scope="module", params=MOE_FAMILIES)
def tiny_moe(request, tiny_llm_factory):
    return tiny_llm_factory(request.param)


def _greedy(model, prompt, n):
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                             do_sample=False)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("kernels", ["auto", "reference"])  # auto: the C linears on CPU
def test_mixed_batch_matches_hf(tiny_moe, kernels, monkeypatch):
    monkeypatch.setenv("GRAFT_KERNELS", kernels)
    engine = Engine.from_pretrained(tiny_moe, EngineConfig(num_kv_blocks=64))
    layers = engine.runner.model.layers
    assert any(isinstance(layer, MoeDecoderLayer) for layer in layers)
    free0 = engine.block_manager.num_free_blocks
    prompts = make_prompts(MIXED)
    outs = engine.generate(prompt_token_ids=prompts, sampling_params=GREEDY)
    for i, (p, o) in enumerate(zip(prompts, outs)):
        assert o.token_ids == hf_greedy(tiny_moe, p, GREEDY.max_tokens), f"prompt {i} (len {len(p)})"
    assert engine.block_manager.num_free_blocks == free0


def test_alone_equals_batched_with_chunks_and_prefix_cache(tiny_moe):
    """Batch invariance: a prompt's tokens do not depend on what shares its steps (its rows
    meet other tokens' rows inside the same expert matmuls)."""
    engine = Engine.from_pretrained(tiny_moe, EngineConfig(max_num_batched_tokens=9,
                                                           enable_prefix_caching=True))
    target = make_prompts([37], seed=4)[0]
    alone = engine.generate(prompt_token_ids=[target], sampling_params=GREEDY)[0].token_ids
    batch = make_prompts((8, 40, 3), seed=5)
    outs = engine.generate(prompt_token_ids=batch[:2] + [target] + batch[2:],
                           sampling_params=GREEDY)
    assert alone == outs[2].token_ids == hf_greedy(tiny_moe, target, GREEDY.max_tokens)
    assert outs[2].num_cached_tokens == 32  # two full blocks of the first run reused


@pytest.mark.parametrize("scheme", ["int8", "int4", "bf16", "int8-g16"])
def test_quantized_experts_match_hf_on_dequantized_weights(tiny_moe, scheme):
    from transformers import AutoModelForCausalLM

    engine = Engine.from_pretrained(tiny_moe, EngineConfig(num_kv_blocks=64, quantization=scheme))
    plan = engine.runner.quant_plan
    assert plan["layers.1.mlp.experts.3.gate_up_proj"].name == plan["layers.1.mlp.experts.3.down_proj"].name
    assert not any(name.endswith(".gate") for name in plan)  # the router is not a planned linear
    router = engine.runner.model.layers[1].mlp.gate
    assert router.weight.dtype == torch.float32
    hf = dequantize_hf_model(AutoModelForCausalLM.from_pretrained(
        tiny_moe, dtype=torch.float32).eval(), plan)
    prompts = make_prompts((5, 17, 40, 1))
    outs = engine.generate(prompt_token_ids=prompts, sampling_params=GREEDY)
    for i, (p, o) in enumerate(zip(prompts, outs)):
        assert o.token_ids == _greedy(hf, p, GREEDY.max_tokens), f"prompt {i} (len {len(p)})"


def test_int4_a8_experts_give_the_reference_kernels_tokens(tiny_moe, monkeypatch):
    """8-bit activations in the experts: the C path (the MoE block's one call, the a8 kernel)
    gives the greedy tokens of the reference linears (the rounding in torch). HF's fused
    experts take no input hook, so the HF reference says so instead of comparing wrongly."""
    from transformers import AutoModelForCausalLM

    from graft.errors import GraftConfigError

    prompts, tokens = make_prompts((5, 17, 40, 1)), {}
    for kernels in ("auto", "reference"):
        monkeypatch.setenv("GRAFT_KERNELS", kernels)
        engine = Engine.from_pretrained(tiny_moe, EngineConfig(num_kv_blocks=64, quantization="int4-a8"))
        tokens[kernels] = [o.token_ids for o in engine.generate(prompt_token_ids=prompts, sampling_params=GREEDY)]
    assert tokens["auto"] == tokens["reference"]
    hf = AutoModelForCausalLM.from_pretrained(tiny_moe, dtype=torch.float32)
    if any(isinstance(getattr(m, "gate_up_proj", None), torch.nn.Parameter) for m in hf.modules()):
        with pytest.raises(GraftConfigError, match="fused experts"):
            dequantize_hf_model(hf, engine.runner.quant_plan)


def test_router_stays_fp32_in_a_bf16_engine(tiny_llm_factory):
    engine = Engine.from_pretrained(tiny_llm_factory("glm4_moe"),
                                    EngineConfig(dtype="bfloat16", num_kv_blocks=32))
    block = engine.runner.model.layers[1].mlp
    assert block.experts[0].down_proj.weight.dtype == torch.bfloat16
    assert block.gate.weight.dtype == block.gate.e_score_correction_bias.dtype == torch.float32
    out = engine.generate(prompt_token_ids=make_prompts([9]), sampling_params=GREEDY)[0]
    assert len(out.token_ids) == GREEDY.max_tokens


def _block(scoring="softmax", num_experts=8, top_k=2, num_shared=0, **router):
    torch.manual_seed(0)
    block = MoEBlock(16, 32, "silu", TopKRouter(16, num_experts, top_k, scoring, True, **router),
                     num_shared)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.3)
    return block


def test_each_active_expert_runs_once_on_its_rows():
    block = _block()
    calls = {}
    for e, expert in enumerate(block.experts):
        expert.register_forward_hook(lambda m, args, out, e=e: calls.setdefault(e, []).append(args[0].shape[0]))
    x = torch.randn(11, 16)
    out = block(x)
    _, ids = block.gate(x)
    chosen = torch.bincount(ids.flatten(), minlength=8)
    assert calls == {e: [int(n)] for e, n in enumerate(chosen.tolist()) if n}
    # the same sums one token at a time (slot order), as HF's experts forward makes them
    weights, ids = block.gate(x)
    want = torch.stack([sum(block.experts[int(e)](x[t:t + 1])[0] * w for e, w in zip(ids[t], weights[t]))
                        for t in range(11)])
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_token_path_equals_its_row_in_a_batch(dtype):
    """Batch 1 runs its k experts directly (no sort / scatter): the same sums as the grouped
    path gives that token in a batch, fp32 and bf16 (torch's own matmul is not row-invariant
    at the last bit; the engine's is test_alone_equals_batched_with_chunks_and_prefix_cache)."""
    block = _block(num_experts=8, top_k=3).to(dtype)
    x = torch.randn(5, 16, dtype=dtype)
    with torch.inference_mode():
        batched = block(x)
        alone = torch.cat([block(x[t:t + 1]) for t in range(5)])
    assert alone.dtype == dtype
    torch.testing.assert_close(alone, batched)


def _c_block(scheme, scoring="softmax", num_shared=0, **router):
    """_block with its experts (and shared experts) in the C layout of `scheme`."""
    from graft.kernels import cpu_ops
    from graft.kernels.quant_formats import QuantScheme

    if not cpu_ops.available():
        pytest.skip("the C kernels did not build here")
    block = _block(scoring, **router, num_shared=num_shared)
    mlps = [*block.experts, *([block.shared_experts] if num_shared else [])]
    for lin in (lin for m in mlps for lin in (m.gate_up_proj, m.down_proj)):
        lin.quantize(QuantScheme.parse(scheme))
    return block


ROUTERS = [dict(num_experts=8, top_k=3),  # Qwen3-MoE: softmax, renormalised top-k
           dict(scoring="sigmoid", num_experts=16, top_k=4, n_group=4, topk_group=2,
                routed_scaling_factor=2.5, num_shared=1)]  # GLM-4.5: grouped, shared expert


@pytest.mark.parametrize("router", ROUTERS, ids=["softmax", "sigmoid-grouped-shared"])
@pytest.mark.parametrize("scheme", ["int8", "fp32", "bf16", "int8-g16"])
@pytest.mark.parametrize("tokens", [1, 7])
def test_the_block_in_one_c_call_equals_the_per_expert_path(router, scheme, tokens, monkeypatch):
    """Quantized experts: router, experts, slot sum and shared experts in one C call
    (graft_moe_block), close to each expert's own C linears from Python behind torch's router
    (another summation order and exp in the router: last-bit differences only)."""
    block = _c_block(scheme, **router)
    if router.get("scoring") == "sigmoid":
        with torch.no_grad():
            block.gate.e_score_correction_bias.normal_(0.0, 0.1)
    x = torch.randn(tokens, 16)
    calls = []
    real = cpu_decode.moe_block
    monkeypatch.setattr(cpu_decode, "moe_block", lambda *a: calls.append(a[1].shape) or real(*a))
    with torch.inference_mode():
        got = block(x)
        assert calls == [x.shape]
        monkeypatch.setenv("GRAFT_KERNELS", "reference")  # the C path stands aside for it
        reference = block(x)
        monkeypatch.delenv("GRAFT_KERNELS")
        monkeypatch.setattr(block, "c_desc", lambda: None)
        want = block(x)
    assert len(calls) == 1
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(reference, want, rtol=2e-5, atol=1e-5)


@pytest.mark.parametrize("router", ROUTERS, ids=["softmax", "sigmoid-grouped-shared"])
def test_the_c_block_gives_a_row_the_same_bits_alone_and_in_a_batch(router):
    block = _c_block("int8", **router)
    x = torch.randn(9, 16)
    with torch.inference_mode():
        batched = block(x)
        alone = torch.cat([block(x[t:t + 1]) for t in range(9)])
    assert torch.equal(alone, batched)


def test_grouped_router_only_picks_from_the_best_groups():
    block = _block("sigmoid", num_experts=16, top_k=4, n_group=4, topk_group=2,
                   routed_scaling_factor=2.5)
    with torch.no_grad():
        block.gate.e_score_correction_bias.zero_()
        block.gate.e_score_correction_bias[12:] = 10.0  # steers every token into group 3
    weights, ids = block.gate(torch.randn(7, 16))
    groups = ids // 4
    assert (groups == 3).any(dim=1).all()
    assert all(len(set(row.tolist())) <= 2 for row in groups)  # at most topk_group groups
    torch.testing.assert_close(weights.sum(dim=1), torch.full((7,), 2.5))  # normed, then scaled


def test_decode_roofline_counts_active_experts(tiny_llm_factory):
    engine = Engine.from_pretrained(tiny_llm_factory("qwen3_moe"), EngineConfig(num_kv_blocks=16))
    model = engine.runner.model
    experts = sum(b.expert_read_bytes(model.linear_read_bytes) for b in model.moe_blocks())
    dense = model.weight_bytes_per_token(batch_size=10**6)  # every expert active
    assert model.weight_bytes_per_token() == pytest.approx(dense - experts * (1 - 2 / 8), abs=2)
    assert model.weight_bytes_per_token() < model.weight_bytes_per_token(32) <= dense


def test_a_grouped_router_that_cannot_work_is_refused_by_name():
    from transformers import AutoConfig

    from graft.serving.models.glm4_moe import glm4_moe_flags

    cfg = AutoConfig.for_model("glm4_moe", n_routed_experts=16, n_group=3, topk_group=1,
                               num_experts_per_tok=4)
    with pytest.raises(ValueError, match="n_group=3.*n_group must divide the experts"):
        glm4_moe_flags(cfg)
    cfg.n_group, cfg.topk_group = 4, 1  # one group of 4 experts cannot hold top-6
    cfg.num_experts_per_tok = 6
    with pytest.raises(ValueError, match="num_experts_per_tok=6"):
        glm4_moe_flags(cfg)


def test_the_fused_expert_layout_loads_the_same_model(tiny_llm_factory, tmp_path):
    """save_pretrained(save_original_format=False) writes transformers' in-memory layout: one
    [E, 2I, H] gate_up_proj and one [E, H, I] down_proj per layer for all experts."""
    import shutil

    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    src = tiny_llm_factory("glm4_moe")
    fused = tmp_path / "fused"
    shutil.copytree(src, fused)
    AutoModelForCausalLM.from_pretrained(src).save_pretrained(fused, save_original_format=False)
    with safe_open(str(fused / "model.safetensors"), "pt") as f:
        assert f.get_slice("model.layers.1.mlp.experts.gate_up_proj").get_shape() == [16, 128, 64]
    prompts = make_prompts((5, 17))
    want = Engine.from_pretrained(src, EngineConfig(num_kv_blocks=32)).generate(
        prompt_token_ids=prompts, sampling_params=GREEDY)
    got = Engine.from_pretrained(fused, EngineConfig(num_kv_blocks=32)).generate(
        prompt_token_ids=prompts, sampling_params=GREEDY)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]


@pytest.mark.parametrize("kv", ["auto", "int8"])
def test_the_decode_step_in_one_c_call_is_the_per_op_path(tiny_moe, kv):
    """A quantized MoE engine runs an all-decode step in one C call, ids to logits (attention,
    routers, experts, shared experts, GLM's dense first layer, head): the per-op path's logits
    and KV cache bit for bit, for mixed schemes and context lengths."""
    config = {"default": "int8", "modules": {"layers.0.self_attn.*": "int4", "layers.1.self_attn.o_proj": "bf16",
                                             "layers.1.mlp.experts.2.*": "int4"}}
    engine = Engine.from_pretrained(tiny_moe, EngineConfig(quantization=config, kv_cache_dtype=kv,
                                                           num_kv_blocks=64))
    model = engine.runner.model
    fused = model.fused_decode
    assert fused is not None and fused.moes is not None and fused.step_applies(3, 3)
    batch = three_decodes(engine, GREEDY)
    calls = []
    step, block = cpu_decode.decode_step, cpu_decode.moe_block
    cpu_decode.decode_step = lambda *args: calls.append("step") or step(*args)
    cpu_decode.moe_block = lambda *args: calls.append("block") or block(*args)
    try:
        fused_logits, per_op_logits, fused_pools, before = fused_then_per_op(engine, batch)
    finally:
        cpu_decode.decode_step, cpu_decode.moe_block = step, block
    sparse = len(model.moe_blocks())
    assert calls == ["step"] + ["block"] * sparse  # one C call, then each MoE block op by op
    assert torch.equal(fused_logits, per_op_logits)
    assert not torch.equal(fused_pools[0], before[0])  # the step stored this token's K/V
