"""`graft eval --backend engine --quantization`: the run records the scheme, quantized answers
get cache keys of their own, and the HF backend refuses the option."""

import pytest

from graft.errors import GraftConfigError
from graft.evals import run_eval
from graft.evals.cache import ResponseCache

COMMON = dict(tasks=["example_pope"], limit=3, n_boot=20, log=None)


def test_quantized_engine_eval_records_the_scheme_and_never_shares_cache(tiny_run_dir, tmp_path):
    cache = ResponseCache(tmp_path / "cache.sqlite")
    fp32 = run_eval(str(tiny_run_dir), backend="engine", cache=cache, **COMMON)
    int4 = run_eval(str(tiny_run_dir), backend="engine", cache=cache, quantization="int4", **COMMON)
    assert fp32["config"]["quantization"] is None and int4["config"]["quantization"] == "int4"
    assert "+quant:" in int4["config"]["model_identity"]
    assert int4["config"]["model_identity"].startswith(fp32["config"]["model_identity"])
    assert int4["tasks"]["example_pope"]["n_cached"] == 0  # the fp32 answers are not reused
    again = run_eval(str(tiny_run_dir), backend="engine", cache=cache, quantization="int4", **COMMON)
    assert again["tasks"]["example_pope"]["n_cached"] == 3


def test_hf_backend_refuses_quantization(tiny_run_dir):
    with pytest.raises(GraftConfigError, match="needs --backend engine"):
        run_eval(str(tiny_run_dir), backend="hf", cache=False, quantization="int8", **COMMON)


def test_base_llm_reference_runs_under_the_same_quantization(tiny_run_dir, tmp_path):
    """text_only-style tasks ask whether grafting changed text answers: under --quantization
    the reference is the bare LLM with the same weights (identical by construction here)."""
    from graft.evals.runner import _reference_backend
    from graft.evals.backends.engine import EngineBackend

    backend = EngineBackend(tiny_run_dir, quantization="int4")
    ref = _reference_backend({}, backend, None, "cpu")
    assert isinstance(ref, EngineBackend) and ref.quantization == "int4"
    assert ref.engine.runner.quant_plan and "+quant:" in ref.identity
