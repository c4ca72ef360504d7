"""Module groups and quant.json round trips; the engine's prefill logits used for KL."""

import pytest
import torch

from graft.errors import GraftConfigError
from graft.quantize.groups import module_groups, parse_granularity, to_plan, to_quant_config

NAMES = [f"layers.{i}.{m}" for i in range(5) for m in
         ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")] + ["lm_head"]


def test_granularities():
    assert parse_granularity("auto", 30) == 10 and parse_granularity("layer", 30) == 1
    assert list(module_groups(NAMES, 2))[:3] == ["layers.0-1.self_attn", "layers.0-1.mlp",
                                                 "layers.2-3.self_attn"]
    blocks = module_groups(NAMES, 2)
    assert blocks["layers.4.mlp"] == ["layers.4.mlp.gate_up_proj", "layers.4.mlp.down_proj"]
    assert blocks["lm_head"] == ["lm_head"] and len(module_groups(NAMES, 0)) == len(NAMES)
    with pytest.raises(GraftConfigError, match="--granularity 'block:0' is not valid; use module"):
        parse_granularity("block:0", 30)


def test_quant_config_round_trip():
    from graft.serving.models.quant_config import QuantConfig

    groups = module_groups(NAMES, 1)
    assignment = {g: "int8" for g in groups} | {"lm_head": "fp32", "layers.2.mlp": "int4-g64"}
    config = to_quant_config(assignment, groups, comment="test")
    assert config["default"] == "int8" and config["modules"]["lm_head"] == "fp32"
    shapes = {n: (64, 128) for n in NAMES}
    assert QuantConfig.parse(config).plan(shapes) == to_plan(assignment, groups)


def test_moe_experts_and_shared_experts_are_groups_of_their_own():
    names = ["layers.0.self_attn.qkv_proj", "layers.0.mlp.gate_up_proj"] + [
        f"layers.1.mlp.{e}.{p}" for e in ("experts.0", "experts.1", "shared_experts")
        for p in ("gate_up_proj", "down_proj")] + ["lm_head"]
    by_layer = module_groups(names, 1)
    assert list(by_layer) == ["layers.0.self_attn", "layers.0.mlp", "layers.1.experts",
                              "layers.1.shared_experts", "lm_head"]
    assert by_layer["layers.1.experts"] == names[2:6]
    by_module = module_groups(names, 0)  # one group per module, but never one per expert
    assert by_module["layers.1.experts"] == names[2:6] and "layers.0.mlp.gate_up_proj" in by_module
    assert list(module_groups(names, 2))[2:4] == ["layers.0-1.experts", "layers.0-1.shared_experts"]


def test_a_routed_expert_counts_its_share_of_a_decode_step(tiny_llm_factory):
    from graft.kernels.quant_formats import QuantScheme
    from graft.quantize.engine import QuantEngine

    qe = QuantEngine(tiny_llm_factory("glm4_moe"))  # top-4 of 16 experts
    int8 = QuantScheme.parse("int8")
    expert, shared = "layers.1.mlp.experts.5.down_proj", "layers.1.mlp.shared_experts.down_proj"
    assert qe.shapes[expert] == qe.shapes[shared]
    assert qe.module_bytes(expert, int8) == round(qe.module_bytes(shared, int8) / 4)


@pytest.mark.parametrize("family,scheme", [("qwen2", "fp32"), ("qwen2", "int8"),
                                           ("glm4_moe", "int8")])
def test_prefill_logits_match_hf_on_the_same_weights(tiny_llm_factory, family, scheme):
    from transformers import AutoModelForCausalLM

    from graft.quantize.engine import QuantEngine
    from graft.serving.models.quant_config import QuantConfig, dequantize_hf_model

    model_dir = tiny_llm_factory(family)
    qe = QuantEngine(model_dir)
    plan = QuantConfig.parse(scheme).plan(qe.shapes)
    qe.apply(plan)
    ids = [5, 17, 40, 1, 16, 9, 33, 2, 8, 11] * 3
    got = qe.prefill_logits(ids)
    hf = dequantize_hf_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), plan)
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0]
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mode", ["auto", "reference", "prepacked"])
def test_fp32_weights_are_the_checkpoints_and_loaded_once_where_readable(
        tiny_llm_factory, monkeypatch, mode):
    """auto: the engine's default, on AVX2 and AVX-512 fp32 on the C kernels, read back from
    their layout, elsewhere the model's own linears, which the engine prepacks for oneDNN where
    it can; reference: the torch weights; prepacked: oneDNN's opaque copies, the one layout that
    makes it load the checkpoint again."""
    from graft.kernels import cpu_linear, cpu_quant
    from graft.quantize import engine as engine_module

    if mode != "auto":
        monkeypatch.setenv("GRAFT_KERNELS", "reference")
    model_dir = tiny_llm_factory("qwen2")
    qe = engine_module.QuantEngine(model_dir)
    want = engine_module._load_fp32(qe.engine.model_dir, qe.runner)
    loads = []
    monkeypatch.setattr(engine_module, "_load_fp32", lambda *a: loads.append(1) or want)
    if mode == "prepacked":
        if cpu_linear.unavailable_reason(torch.float32) is not None:
            pytest.skip(f"no oneDNN linears: {cpu_linear.unavailable_reason(torch.float32)}")
        qe.model.prepack_linears()
    got = engine_module._fp32_weights(qe.engine.model_dir, qe.runner, qe.shapes)
    assert set(got) == set(qe.shapes)
    assert all(got[n].dtype == torch.float32 and torch.equal(got[n], want[n]) for n in qe.shapes)
    c_layout = bool(qe.runner.quant_plan)
    assert c_layout == (mode == "auto" and cpu_quant.isa() != "portable")  # default_quantization
    onednn = cpu_linear.unavailable_reason(torch.float32) is None
    opaque = mode == "prepacked" or (mode == "auto" and not c_layout and onednn)
    assert len(loads) == (1 if opaque else 0)
