"""Swapping a loaded engine's linear weights in place (what `graft quantize` does between
candidates) gives the tokens of an engine loaded with those weights, also through the
one-call decode step, and swapping back restores the original tokens."""

import pytest

from graft.kernels import cpu_ops
from graft.kernels.quant_formats import QuantScheme, quantize
from graft.serving import Engine, EngineConfig, SamplingParams
from graft.serving.models.quant_config import linear_shapes
from tests.serving.conftest import make_prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


def _tokens(engine, prompts):
    return [o.token_ids for o in engine.generate(prompt_token_ids=prompts, sampling_params=GREEDY)]


@pytest.mark.skipif(not cpu_ops.available(), reason="fp32 on the C linears needs the C kernels")
def test_swapped_weights_are_the_ones_that_run(tiny_llm_factory):
    model_dir = tiny_llm_factory("llama")
    prompts = make_prompts((5, 21), seed=9)
    cfg = dict(num_kv_blocks=64, enable_prefix_caching=False)
    engine = Engine.from_pretrained(model_dir, EngineConfig(**cfg, quantization="fp32"))  # C linears
    model = engine.runner.model
    assert model.fused_decode is not None
    base = _tokens(engine, prompts)
    want = _tokens(Engine.from_pretrained(model_dir, EngineConfig(**cfg, quantization="int4")),
                   prompts)
    names = list(linear_shapes(model))
    loaded = {n: model.linear_weight(n) for n in names}
    int4 = QuantScheme.parse("int4")
    model.set_linear_weights({n: quantize(loaded[n].dequantize(), int4) for n in names})
    assert model.fused_decode is not None  # rebuilt over the new weights
    swapped = [model.linear_weight(n).packed["cpu"] for n in names]
    assert all(p.on_huge_pages for p in swapped)  # moved like a loaded engine's
    assert len({p.weight.untyped_storage().data_ptr() for p in swapped}) == 1  # one buffer
    got = _tokens(engine, prompts)
    assert got == want and got != base
    model.set_linear_weights(loaded)
    assert _tokens(engine, prompts) == base
