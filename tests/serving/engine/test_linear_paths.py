"""An engine's C-layout linears take the path per row bucket that this machine's timings
pick (graft.serving.models.linear_paths), read from an injected timings file, and both paths
give HF's greedy tokens on the same dequantized weights."""

import pytest

from graft.kernels import cpu_ops
from graft.kernels import linear_dispatch as ld
from graft.serving import Engine, EngineConfig
from graft.serving.models.layers import Linear
from graft.serving.models.linear_paths import c_layout_linears, plan_linear_paths
from tests.serving.conftest import make_prompts
from tests.serving.engine.test_quantized_parity import MIXED, _check, _hf_dequantized

pytestmark = pytest.mark.skipif(not cpu_ops.available(), reason="C kernels unavailable")


def _engine(model_dir, scheme, mode="c"):
    return Engine.from_pretrained(model_dir, EngineConfig(num_kv_blocks=64, quantization=scheme,
                                                          linear_dispatch=mode))


def test_cached_timings_decide_each_shape_and_bucket(tiny_llama, tmp_path):
    engine = _engine(tiny_llama, "int8")
    model = engine.runner.model
    groups = c_layout_linears(model)
    assert model.lm_head is None or model.lm_head not in sum(groups.values(), [])
    (fmt, i, o), first = next(iter(groups.items()))
    timings = {ld.Case(f, a, b, r).key: {"c": 1.0, "torch": 2.0}
               for (f, a, b) in groups for r in ld.ROW_BUCKETS}
    timings[ld.Case(fmt, i, o, 512).key] = {"c": 1.0, "torch": 0.5}  # torch wins only there
    ld.save_timings(ld.cache_file(tmp_path, ld.machine()), timings, ld.machine())

    def no_clock():
        raise AssertionError("every case was cached: nothing may be timed")

    summary = plan_linear_paths(model, "cached", engine.runner.dtype, cache_dir=tmp_path,
                                clock=no_clock)
    assert summary["timed_now"] == 0
    assert [k for k, v in summary["choices"].items() if v == "torch"] == [ld.Case(fmt, i, o, 512).key]
    for key, linears in groups.items():
        want = frozenset({512}) if key == (fmt, i, o) else frozenset()
        assert all(lin.torch_buckets == want for lin in linears)
    plan_linear_paths(model, "c", engine.runner.dtype)
    assert all(m.torch_buckets == frozenset() for m in model.modules() if isinstance(m, Linear))


def test_missing_cases_are_timed_and_written_back(tiny_llama, tmp_path):
    engine = _engine(tiny_llama, "int4")
    summary = plan_linear_paths(engine.runner.model, "cached", engine.runner.dtype,
                                cache_dir=tmp_path)
    cases = len(c_layout_linears(engine.runner.model)) * len(ld.ROW_BUCKETS)
    assert summary["timed_now"] == cases == len(summary["choices"])
    assert set(ld.load_timings(ld.cache_file(tmp_path, ld.machine()))) == set(summary["choices"])
    again = plan_linear_paths(engine.runner.model, "cached", engine.runner.dtype,
                              cache_dir=tmp_path)
    assert again["timed_now"] == 0 and again["choices"] == summary["choices"]


@pytest.mark.parametrize("scheme", ["fp32", "int8", "int4"])
def test_both_paths_give_hf_greedy_tokens(tiny_llama, scheme):
    c, via_torch = _engine(tiny_llama, scheme, "c"), _engine(tiny_llama, scheme, "torch")
    assert via_torch.runner.linear_paths["choices"] and all(
        v == "torch" for v in via_torch.runner.linear_paths["choices"].values())
    hf = _hf_dequantized(tiny_llama, c.runner.quant_plan)
    prompts = make_prompts(MIXED)
    assert [o.token_ids for o in _check(c, hf, prompts)] == \
        [o.token_ids for o in _check(via_torch, hf, prompts)]


def test_an_unwritable_cache_keeps_the_timings_in_memory(tiny_llama, tmp_path, caplog):
    engine = _engine(tiny_llama, "int8")
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder would be")
    summary = plan_linear_paths(engine.runner.model, "cached", engine.runner.dtype,
                                cache_dir=blocker / "kernels")
    assert summary["timed_now"] == len(summary["choices"]) > 0
    assert "timings not saved" in caplog.text
