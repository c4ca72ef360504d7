"""`graft eval --backend engine` takes every engine option; the ones that change the answers
(activation dtype, KV cache dtype) also change the backend's identity, so the response cache
never serves an answer computed under other numbers."""

from graft.evals.backends.engine import EngineBackend
from graft.serving import EngineConfig


def test_precision_options_get_their_own_cache_keys(tiny_llama):
    base = EngineBackend(tiny_llama, config=EngineConfig(num_kv_blocks=16))
    same = EngineBackend(tiny_llama, config=EngineConfig(num_kv_blocks=32,
                                                         kv_cache_dtype="float32"))
    int8 = EngineBackend(tiny_llama, config=EngineConfig(num_kv_blocks=16, kv_cache_dtype="int8"))
    bf16 = EngineBackend(tiny_llama, config=EngineConfig(num_kv_blocks=16, dtype="bfloat16"))
    assert base.identity == same.identity and "+" not in base.identity
    assert int8.identity == base.identity + "+kv:int8"
    assert bf16.identity == base.identity + "+bfloat16"


def test_results_record_the_engine_options(tiny_run_dir):
    from graft.evals import run_eval

    results = run_eval(str(tiny_run_dir), tasks=["example_pope"], backend="engine", limit=2,
                       cache=False, n_boot=10, log=None,
                       engine_config=EngineConfig(num_kv_blocks=16, kv_cache_dtype="int8"))
    engine = results["config"]["engine"]
    assert engine["kv_cache_dtype"] == "int8" and engine["num_kv_blocks"] == 16
    assert results["config"]["model_identity"].endswith("+kv:int8")
