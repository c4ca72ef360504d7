"""The embedding table held in a weight scheme (a plan rule naming `embed_tokens`): each looked-up
row is the dequantized table's, on the per-op path and in the one-call C decode step, so greedy
tokens equal HF transformers on the same dequantized table and linears; the table itself is
freed unless an unquantized tied head multiplies by it; no pattern or default reaches it. A
tied head held as the table's own values in the C layout serves the lookups instead."""

import json

import pytest
import torch

from graft.errors import GraftConfigError
from graft.kernels import cpu_ops
from graft.kernels.quant_formats import QuantScheme, quantize
from graft.serving import Engine, EngineConfig, SamplingParams
from graft.serving.models.quant_config import EMBEDDING, QuantConfig, dequantize_hf_model
from tests.serving.conftest import fused_then_per_op, make_prompts, three_decodes

GREEDY = SamplingParams(temperature=0.0, max_tokens=10)


def _config(tmp_path, modules: dict, default: str = "int4") -> str:
    path = tmp_path / "quant.json"
    path.write_text(json.dumps({"default": default, "modules": modules}))
    return str(path)


def _hf_greedy(model_dir, plan, prompts):
    from transformers import AutoModelForCausalLM

    hf = dequantize_hf_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval(),
                             plan)
    outs = []
    for p in prompts:
        ids = torch.tensor([p])
        with torch.no_grad():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids),
                              max_new_tokens=GREEDY.max_tokens, do_sample=False)
        outs.append(out[0, len(p):].tolist())
    return outs


@pytest.mark.parametrize("scheme", ["int8", "int8-g16", "int8-g32", "int4-g32", "int4-g64", "bf16", "fp32"])
def test_rows_are_the_dequantized_tables_rows(scheme):
    table = torch.randn(50, 128) * torch.logspace(-3, 2, 50)[:, None]
    held = quantize(table, QuantScheme.parse(scheme))
    ids = torch.tensor([7, 0, 49, 7, 3])
    assert torch.equal(held.rows(ids), held.dequantize()[ids])


@pytest.mark.parametrize("family,embed", [("llama", "int4-g32"), ("qwen2", "int8"), ("qwen3", "bf16"),
                                          ("llama", "int8-g32")])
def test_greedy_tokens_equal_hf_on_the_dequantized_table(tiny_llm_factory, tmp_path, family, embed):
    model_dir = tiny_llm_factory(family)  # llama and qwen3 tie their head to the table
    engine = Engine.from_pretrained(model_dir, EngineConfig(
        num_kv_blocks=64, quantization=_config(tmp_path, {EMBEDDING: embed})))
    model, plan = engine.runner.model, engine.runner.quant_plan
    assert plan[EMBEDDING].name == embed and model.embed_quantized.scheme.name == embed
    assert model.embed_tokens.weight.is_meta  # the head (int4) has its own copy: no table kept
    assert "embedding " + embed in QuantConfig.parse(_config(tmp_path, {EMBEDDING: embed})).describe(plan)
    prompts = make_prompts((5, 17, 40, 1))
    outs = engine.generate(prompt_token_ids=prompts, sampling_params=GREEDY)
    assert [o.token_ids for o in outs] == _hf_greedy(model_dir, plan, prompts)


def test_a_tied_fp32_head_has_its_copy_or_keeps_the_table(tiny_llm_factory, tmp_path):
    """fp32 engine: the head's fp32 copy in the C layout, the table freed; bf16 engine (the
    head multiplies by the table itself): the table kept beside the held one."""
    model_dir = tiny_llm_factory("llama")
    config = _config(tmp_path, {EMBEDDING: "int8", "lm_head": "fp32"})
    engine = Engine.from_pretrained(model_dir, EngineConfig(num_kv_blocks=64, quantization=config))
    model, plan = engine.runner.model, engine.runner.quant_plan
    assert model.embed_tokens.weight.is_meta == (model.head_quantized is not None)
    prompts = make_prompts((9, 23), seed=3)
    outs = engine.generate(prompt_token_ids=prompts, sampling_params=GREEDY)
    assert [o.token_ids for o in outs] == _hf_greedy(model_dir, plan, prompts)
    bf16 = Engine.from_pretrained(model_dir, EngineConfig(num_kv_blocks=64, dtype="bfloat16",
                                                          quantization=config)).runner.model
    assert bf16.head_quantized is None and not bf16.embed_tokens.weight.is_meta
    ids = torch.tensor([3, 300, 3])
    want = quantize(bf16.embed_tokens.weight, QuantScheme.parse("int8")).dequantize()[ids]
    assert torch.equal(bf16.embed(ids), want.bfloat16())


@pytest.mark.skipif(not cpu_ops.available(), reason="the one-call decode step needs the C kernels")
@pytest.mark.parametrize("dtype,embed", [("float32", "int4-g32"), ("float32", "int8"),
                                         ("float32", "bf16"), ("bfloat16", "int4-g64"),
                                         ("float32", "int8-g16"), ("bfloat16", "int8-g32")])
def test_the_c_step_looks_rows_up_as_the_per_op_path(tiny_llm_factory, tmp_path, dtype, embed):
    engine = Engine.from_pretrained(tiny_llm_factory("llama"), EngineConfig(
        num_kv_blocks=64, dtype=dtype, quantization=_config(tmp_path, {EMBEDDING: embed})))
    model = engine.runner.model
    assert model.fused_decode is not None and model.fused_decode.step_desc.embed_kind >= 0
    fused, per_op, _, _ = fused_then_per_op(engine, three_decodes(engine, GREEDY))  # fused: ids in
    assert torch.equal(fused, per_op)


@pytest.mark.skipif(not cpu_ops.available(), reason="the C layout needs the C kernels")
@pytest.mark.parametrize("scheme,n,k", [(s, n, k) for s in ("fp32", "bf16", "int8")
                                        for n, k in ((50, 64), (33, 7), (100, 130))]
                         + [(s, n, k) for s in ("int8-g16", "int8-g32", "int4-g32", "int4-g64")
                            for n, k in ((50, 64), (100, 192))])
def test_rows_read_from_the_c_layout(scheme, n, k):
    """Once packed, a weight's rows come from its C layout (pairs of 16-row blocks; bf16
    column pairs, 4 int8 or 8 int4 columns a lane word, the layout's scales; rows and columns
    padded), its canonical copy gone: dequantize()'s rows, bit for bit."""
    from graft.kernels import cpu_quant

    held = quantize(torch.randn(n, k), QuantScheme.parse(scheme))
    full = held.dequantize()
    cpu_quant.pack_only(held)
    ids = torch.tensor([0, n - 1, 17, 31, 32, 5, 0])
    assert torch.equal(held.rows(ids), full[ids]) and not held.tensors()


@pytest.mark.skipif(not cpu_ops.available(), reason="the C layout needs the C kernels")
@pytest.mark.parametrize("dtype,scheme,kind", [("float32", "fp32", 4), ("bfloat16", "bf16", 5)])
def test_a_tied_heads_c_layout_copy_serves_the_lookups(tiny_llm_factory, dtype, scheme, kind):
    """A tied head held as the table's own values (fp32 in fp32, bf16 in bf16: the defaults on
    a CPU with the C kernels) is the one copy of the table the engine keeps."""
    from transformers import AutoModelForCausalLM

    model_dir = tiny_llm_factory("qwen3")
    engine = Engine.from_pretrained(model_dir, EngineConfig(num_kv_blocks=64, dtype=dtype,
                                                            quantization=scheme))
    model = engine.runner.model
    assert model.embed_tokens.weight.is_meta and model.embed_quantized is model.head_quantized
    assert model.fused_decode.step_desc.embed_kind == kind
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    ids = torch.tensor([3, 383, 40, 3])
    assert torch.equal(model.embed(ids), hf.get_input_embeddings()(ids))
    fused, per_op, _, _ = fused_then_per_op(engine, three_decodes(engine, GREEDY))
    assert torch.equal(fused, per_op)
    if dtype == "float32":
        prompts = make_prompts((6, 30), seed=2)
        outs = engine.generate(prompt_token_ids=prompts, sampling_params=GREEDY)
        assert [o.token_ids for o in outs] == _hf_greedy(model_dir, engine.runner.quant_plan, prompts)


def test_no_pattern_or_default_reaches_the_table(tiny_llm_factory, tmp_path):
    engine = Engine.from_pretrained(tiny_llm_factory("qwen2"), EngineConfig(
        num_kv_blocks=16, quantization=_config(tmp_path, {"*": "int8"})))
    assert EMBEDDING not in engine.runner.quant_plan
    assert engine.runner.model.embed_quantized is None
    assert not engine.runner.model.embed_tokens.weight.is_meta


@pytest.mark.parametrize("embed,words", [("int4-g32-a8", "rounds a linear's input"),
                                         ("int4-g128", "does not divide")])
def test_bad_table_schemes_fail_before_loading(tiny_llm_factory, tmp_path, embed, words):
    with pytest.raises(GraftConfigError, match=words):  # hidden 64: no 128-column group
        Engine.from_pretrained(tiny_llm_factory("qwen2"), EngineConfig(
            quantization=_config(tmp_path, {EMBEDDING: embed})))
