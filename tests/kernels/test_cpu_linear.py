"""oneDNN-prepacked linears (graft.kernels.cpu_linear) equal F.linear, and the engine uses them
on CPU unless the kernels are switched off."""

import pytest
import torch
import torch.nn.functional as F

from graft.kernels import cpu_linear

needs_onednn = pytest.mark.skipif(cpu_linear.unavailable_reason(torch.float32) is not None,
                                  reason=str(cpu_linear.unavailable_reason(torch.float32)))


@needs_onednn
@pytest.mark.parametrize("rows", [0, 1, 7, 32, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_equals_f_linear(rows, bias):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 72, generator=g)
    b = torch.randn(96, generator=g) if bias else None
    x = torch.randn(rows, 72, generator=g)
    got = cpu_linear.packed_linear(x, cpu_linear.pack_weight(w), b)
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    strided = torch.randn(2 * rows, 72, generator=g)[::2]  # a non-contiguous input
    torch.testing.assert_close(cpu_linear.packed_linear(strided, cpu_linear.pack_weight(w), b),
                               F.linear(strided, w, b), rtol=1e-5, atol=1e-5)


def test_unsupported_dtype_and_switches(monkeypatch):
    assert "float16" in cpu_linear.unavailable_reason(torch.float16)
    assert not cpu_linear.enabled(torch.float16)
    monkeypatch.setenv("GRAFT_KERNELS", "reference")
    assert not cpu_linear.enabled(torch.float32)
    monkeypatch.setenv("GRAFT_KERNELS", "auto")
    monkeypatch.setenv("GRAFT_CPU_KERNELS", "0")
    assert not cpu_linear.enabled(torch.float32)


@needs_onednn
@pytest.mark.parametrize("kernels", ["auto", "reference"])
def test_engine_prepacks_on_cpu(tiny_llm_factory, kernels, monkeypatch):
    from graft.serving import Engine, EngineConfig, SamplingParams
    from graft.serving.models.layers import Linear
    from tests.serving.conftest import hf_greedy, make_prompts

    monkeypatch.setenv("GRAFT_KERNELS", kernels)
    model_dir = tiny_llm_factory("qwen2")  # qkv bias goes through the packed path too
    engine = Engine.from_pretrained(model_dir, EngineConfig(quantization="none"))  # torch linears
    linears = [m for m in engine.runner.model.modules() if isinstance(m, Linear)]
    assert linears and all((m.prepacked is not None) == (kernels == "auto") for m in linears)
    if kernels == "auto":  # the plain copies are released: only their shapes stay
        assert all(m.weight.is_meta for m in linears)
    prompt = make_prompts([21], seed=11)[0]
    out = engine.generate(prompt_token_ids=[prompt], sampling_params=SamplingParams(temperature=0.0, max_tokens=10))
    assert out[0].token_ids == hf_greedy(model_dir, prompt, 10)
