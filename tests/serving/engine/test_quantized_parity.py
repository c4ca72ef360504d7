"""A quantized engine's greedy tokens equal HF transformers running the same dequantized
weights (graft.serving.models.quant_config.dequantize_hf_model), alone and in a mixed batch, with
prefix caching and chunked prefill; bad quantization configs fail before any weight loads."""

import json

import pytest
import torch

from graft.errors import GraftConfigError
from graft.kernels import cpu_ops, cpu_quant
from graft.serving import Engine, EngineConfig, SamplingParams
from graft.serving.models.quant_config import QuantConfig, dequantize_hf_model
from tests.serving.conftest import fused_then_per_op, make_prompts, three_decodes

GREEDY = SamplingParams(temperature=0.0, max_tokens=10)
MIXED = (5, 17, 40, 1, 16)


def _hf_dequantized(model_dir, plan):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return dequantize_hf_model(model, plan)


def _hf_greedy(model, prompt, n):
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()


def _check(engine, hf, prompts):
    outs = engine.generate(prompt_token_ids=prompts, sampling_params=GREEDY)
    for i, (p, o) in enumerate(zip(prompts, outs)):
        assert o.token_ids == _hf_greedy(hf, p, GREEDY.max_tokens), f"prompt {i} (len {len(p)})"
    return outs


@pytest.mark.parametrize("kernels", ["auto", "reference"])  # auto: the C linears on CPU
@pytest.mark.parametrize("scheme", ["int8", "int4", "bf16", "int4-a8", "int8-g32"])
def test_every_family_matches_hf_on_dequantized_weights(tiny_llm_any, scheme, kernels, monkeypatch):
    monkeypatch.setenv("GRAFT_KERNELS", kernels)
    engine = Engine.from_pretrained(tiny_llm_any, EngineConfig(num_kv_blocks=64, quantization=scheme))
    assert {s.name for s in engine.runner.quant_plan.values()} == {QuantConfig.parse(scheme).default.name}
    hf = _hf_dequantized(tiny_llm_any, engine.runner.quant_plan)
    free0 = engine.block_manager.num_free_blocks
    _check(engine, hf, make_prompts(MIXED))
    assert engine.block_manager.num_free_blocks == free0


def test_per_module_config_with_prefix_cache_and_chunked_prefill(tiny_llm_factory, tmp_path):
    model_dir = tiny_llm_factory("qwen2")  # untied head: lm_head is a real Linear
    cfg_file = tmp_path / "quant.json"
    cfg_file.write_text(json.dumps({"default": "int8", "modules": {
        "layers.0.mlp.*": "int4-g64", "layers.1.self_attn.o_proj": "fp32", "lm_head": "bf16"}}))
    engine = Engine.from_pretrained(model_dir, EngineConfig(
        quantization=str(cfg_file), max_num_batched_tokens=7, enable_prefix_caching=True))
    plan = engine.runner.quant_plan
    assert plan["layers.0.mlp.gate_up_proj"].name == "int4-g64"
    assert plan["layers.1.self_attn.o_proj"].name == "fp32"
    assert plan["layers.1.mlp.down_proj"].name == "int8" and plan["lm_head"].name == "bf16"
    hf = _hf_dequantized(model_dir, plan)
    shared = make_prompts([37], seed=1)[0]
    _check(engine, hf, [shared + [5, 6]])
    outs = _check(engine, hf, [shared + [9], shared + [3, 4, 7]])
    assert all(o.num_cached_tokens == 32 for o in outs)


def test_same_prompt_alone_and_in_batch(tiny_llm_factory):
    engine = Engine.from_pretrained(tiny_llm_factory("llama"),
                                    EngineConfig(quantization="int4", enable_prefix_caching=False))
    target = make_prompts([23], seed=4)[0]
    alone = engine.generate(prompt_token_ids=[target], sampling_params=GREEDY)[0].token_ids
    batch = make_prompts((8, 40, 3), seed=5)
    inside = engine.generate(prompt_token_ids=batch[:2] + [target] + batch[2:],
                             sampling_params=GREEDY)[2].token_ids
    assert inside == alone


def test_quantized_weights_are_what_the_engine_holds(tiny_llm_factory):
    engine = Engine.from_pretrained(tiny_llm_factory("llama"), EngineConfig(quantization="int8"))
    model = engine.runner.model
    attn = model.layers[0].self_attn.qkv_proj
    assert attn.weight.is_meta and attn.quantized is not None and attn.prepacked is None
    assert model.head_quantized is not None  # tied head: a quantized copy, the table stays fp32
    assert model.embed_tokens.weight.dtype == torch.float32
    fp32 = Engine.from_pretrained(tiny_llm_factory("llama"), EngineConfig()).runner.model
    assert model.weight_bytes_per_token() < fp32.weight_bytes_per_token() / 3


@pytest.mark.parametrize("value,message", [
    ("int3", "quantization='int3' is neither a scheme"),
    ("int4-g128", "group size 128 does not divide the layer's input width 64"),
    ({"default": "int8", "modules": {"layers.*.mlp.nope": "int4"}}, "matches no linear of this model"),
    ({"default": "int9"}, "default='int9' is not a weight scheme; valid: fp32, bf16, int8"),
    ({"default": "int8", "module": {}}, "unknown key"),
    ("missing.json", "does not exist"),
])
def test_bad_configs_fail_before_weights_load(tiny_llm_factory, monkeypatch, value, message):
    from graft.serving.models import loader

    def no_load(*args, **kwargs):
        raise AssertionError("weights were loaded before the config was checked")

    monkeypatch.setattr("graft.serving.engine.model_runner.load_weights", no_load)
    with pytest.raises(GraftConfigError, match=message):
        Engine.from_pretrained(tiny_llm_factory("llama"), EngineConfig(quantization=value))
    assert loader.load_weights is not no_load


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("kv", ["auto", "bfloat16", "int8"])
def test_fused_decode_step_is_the_per_op_path(tiny_llm_factory, family, kv):
    """The one-call C decode step (ids to logits: embedding, layers, final norm, head) gives
    the per-op path's logits and KV cache bit for bit (same C functions in the same order):
    mixed schemes, sequences of different lengths, fp32 / bf16 / int8 KV caches (int8: the
    scales too)."""
    model_dir = tiny_llm_factory(family)
    config = {"default": "int4", "modules": {"layers.0.*": "int8", "layers.1.mlp.down_proj": "fp32",
                                             "layers.1.self_attn.*": "bf16"}}
    engine = Engine.from_pretrained(model_dir, EngineConfig(quantization=config, kv_cache_dtype=kv))
    model = engine.runner.model
    assert model.fused_decode is not None
    params = SamplingParams(temperature=0.0, max_tokens=6)
    batch = three_decodes(engine, params)
    steps = []
    whole_step = model.fused_decode.step
    model.fused_decode.step = lambda *args: steps.append(args) or whole_step(*args)
    fused_logits, per_op_logits, fused, before = fused_then_per_op(engine, batch)
    assert len(steps) == 1  # the whole step, not the layers alone
    assert torch.equal(fused_logits, per_op_logits)
    assert not torch.equal(fused[0], before[0])  # the step stored this token's K/V


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_bf16_fused_decode_step_is_the_per_op_path(tiny_llm_factory, family):
    """A bf16 engine's one-call decode step (bf16 rows between the ops, each linear's fp32
    product rounded to bf16) gives its per-op path's logits and bf16 KV cache bit for bit:
    Qwen2's qkv bias (added in fp32 before the rounding) and Qwen3's q/k norms included."""
    model_dir = tiny_llm_factory(family)
    config = {"default": "int4", "modules": {"layers.0.*": "int8", "layers.1.self_attn.*": "bf16"}}
    engine = Engine.from_pretrained(model_dir, EngineConfig(dtype="bfloat16", quantization=config))
    model = engine.runner.model
    assert model.fused_decode is not None and engine.runner.kv_cache.dtype == torch.bfloat16
    batch = three_decodes(engine, SamplingParams(temperature=0.0, max_tokens=6))
    steps = []
    whole_step = model.fused_decode.step
    model.fused_decode.step = lambda *args: steps.append(args) or whole_step(*args)
    fused_logits, per_op_logits, fused, before = fused_then_per_op(engine, batch)
    assert len(steps) == 1
    assert torch.equal(fused_logits, per_op_logits)
    assert torch.equal(fused_logits, fused_logits.bfloat16().float())  # the head's bf16 rounding
    assert not torch.equal(fused[0], before[0])


def test_bf16_fused_decode_is_off_for_an_int8_cache(tiny_llm_factory):
    engine = Engine.from_pretrained(tiny_llm_factory("llama"), EngineConfig(
        dtype="bfloat16", quantization="int8", kv_cache_dtype="int8"))
    assert engine.runner.model.fused_decode is None


def test_fused_decode_turned_off_by_env_gives_the_same_tokens(tiny_llm_factory, monkeypatch):
    """GRAFT_FUSED_DECODE=0 (for profiling a decode step op by op) keeps every step on the
    per-op path, which gives the one-call step's tokens."""
    model_dir = tiny_llm_factory("llama")
    prompts = make_prompts([5, 9], seed=4)
    want = Engine.from_pretrained(model_dir, EngineConfig(quantization="int8")).generate(
        prompt_token_ids=prompts, sampling_params=GREEDY)
    monkeypatch.setenv("GRAFT_FUSED_DECODE", "0")
    engine = Engine.from_pretrained(model_dir, EngineConfig(quantization="int8"))
    assert engine.runner.model.fused_decode is None
    got = engine.generate(prompt_token_ids=prompts, sampling_params=GREEDY)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]


def test_whole_decode_step_only_for_sampled_one_token_rows(tiny_llm_factory):
    """A one-token chunk that is not a prompt's last token is a decode row without logits:
    such steps run the layers alone (not ids to logits), and the tokens are the same as with
    larger chunks."""
    model_dir = tiny_llm_factory("llama")
    prompt = make_prompts([6], seed=3)[0]
    want = Engine.from_pretrained(model_dir, EngineConfig(quantization="int8")).generate(
        prompt_token_ids=[prompt], sampling_params=GREEDY)[0].token_ids
    engine = Engine.from_pretrained(model_dir, EngineConfig(quantization="int8",
                                                            max_num_batched_tokens=1))
    fused = engine.runner.model.fused_decode
    whole_step, rows = fused.step, []
    fused.step = lambda ids, *rest: rows.append(len(ids)) or whole_step(ids, *rest)
    assert engine.generate(prompt_token_ids=[prompt], sampling_params=GREEDY)[0].token_ids == want
    # the prompt's last token and each fed-back token; the 5 before ran the layers alone
    assert rows == [1] * GREEDY.max_tokens


def test_whole_decode_step_rejects_bad_ids_and_positions(tiny_llm_factory):
    engine = Engine.from_pretrained(tiny_llm_factory("llama"), EngineConfig(quantization="int8"))
    runner = engine.runner
    fused = runner.model.fused_decode
    table = list(range(2))
    ok = ([5], [3], [3], [table], [4])
    assert fused.step(*ok, runner.cos_table, runner.sin_table).shape == (1, runner.vocab_size)
    with pytest.raises(ValueError, match=r"token ids \[-1\] are outside the embedding"):
        fused.step([-1], *ok[1:], runner.cos_table, runner.sin_table)
    with pytest.raises(ValueError, match=r"token ids \[\d+\] are outside the embedding"):
        fused.step([runner.vocab_size], *ok[1:], runner.cos_table, runner.sin_table)
    far = runner.cos_table.shape[0]
    with pytest.raises(ValueError, match=rf"positions \[{far}\] are outside the RoPE tables"):
        fused.step([5], [far], *ok[2:], runner.cos_table, runner.sin_table)
    with pytest.raises(ValueError, match="slot"):
        fused.step([5], [3], [10 ** 9], *ok[3:], runner.cos_table, runner.sin_table)


def test_fused_decode_is_off_where_it_does_not_apply(tiny_llm_factory):
    glm = Engine.from_pretrained(tiny_llm_factory("glm4"), EngineConfig(quantization="int8"))
    assert glm.runner.model.fused_decode is None  # GLM4's extra norms: op by op
    plain = Engine.from_pretrained(tiny_llm_factory("llama"), EngineConfig(quantization="none"))
    assert plain.runner.model.fused_decode is None and plain.runner.quant_plan == {}  # torch linears


@pytest.mark.skipif(not cpu_ops.available() or cpu_quant.isa() == "portable",
                    reason="the fp32 default is the C linears on AVX2 and AVX-512 CPUs only (the "
                    "test below covers the others)")
def test_the_cpu_fp32_default_is_the_c_linears(tiny_llm_factory):
    """quantization=None on CPU in fp32: every linear fp32 on the C kernels, decode in one call."""
    engine = Engine.from_pretrained(tiny_llm_factory("llama"), EngineConfig())
    plan = engine.runner.quant_plan
    assert plan and {s.kind for s in plan.values()} == {"fp32"}
    assert engine.runner.model.fused_decode is not None
    bf16 = Engine.from_pretrained(tiny_llm_factory("llama"), EngineConfig(dtype="bfloat16"))
    if cpu_quant.bf16_dot() or cpu_quant.isa() == "avx2":
        assert {s.kind for s in bf16.runner.quant_plan.values()} == {"bf16"}
        assert bf16.runner.model.fused_decode is not None
    else:  # elsewhere bf16 keeps the model's own linears
        assert bf16.runner.quant_plan == {}
    fp16 = Engine.from_pretrained(tiny_llm_factory("llama"), EngineConfig(dtype="float16"))
    assert fp16.runner.quant_plan == {}


@pytest.mark.skipif(not cpu_ops.available(), reason="the C kernels could not be built")
def test_defaults_per_isa(tiny_llm_factory, monkeypatch):
    """On an AVX2 CPU (no AVX-512) and on AVX512-BF16 CPUs with or without AMX, fp32 and bf16
    engines default to the C linears in their dtype; on AVX-512 without BF16 dot products a
    bf16 engine keeps torch's linears; without AVX2 both stay on the model's own linears;
    asking for a format still gets it."""
    from graft.kernels import cpu_quant
    from graft.serving.engine.model_runner import default_quantization

    model_dir = tiny_llm_factory("llama")
    monkeypatch.setattr(cpu_quant, "isa", lambda: "avx2")  # paths every x86 build of these has
    for dtype, kind in (("float32", "fp32"), ("bfloat16", "bf16")):
        plan = Engine.from_pretrained(model_dir, EngineConfig(dtype=dtype)).runner.quant_plan
        assert plan and {s.kind for s in plan.values()} == {kind}
    # the choice alone where this machine might not run what it names (no engine built)
    monkeypatch.setattr(cpu_quant, "_bf16_dot_built", lambda: True)
    for isa, want in (("avx512-vnni", ("fp32", "bf16")), ("avx512-amx", ("fp32", "bf16")),
                      ("avx512", ("fp32", None))):
        monkeypatch.setattr(cpu_quant, "isa", lambda isa=isa: isa)
        got = tuple(default_quantization(EngineConfig(dtype=d), torch.device("cpu"))
                    for d in ("float32", "bfloat16"))
        assert got == want, isa
    monkeypatch.setattr(cpu_quant, "isa", lambda: "portable")
    for dtype in ("float32", "bfloat16"):
        assert Engine.from_pretrained(model_dir, EngineConfig(dtype=dtype)).runner.quant_plan == {}
    asked = Engine.from_pretrained(tiny_llm_factory("llama"), EngineConfig(quantization="int8"))
    assert {s.kind for s in asked.runner.quant_plan.values()} == {"int8"}


def test_the_load_log_says_which_paths_run(tiny_llm_factory, caplog):
    from graft.kernels import cpu_quant

    with caplog.at_level("INFO", logger="graft.serving"):
        Engine.from_pretrained(tiny_llm_factory("llama"), EngineConfig(quantization="int4-g64"))
    text = caplog.text
    assert "weights: int4-g64 x 9 (int4-g64; quantized linears on the C kernels" in text
    assert f"({cpu_quant.isa()} path: " in text and "decode steps: one C call per step" in text
