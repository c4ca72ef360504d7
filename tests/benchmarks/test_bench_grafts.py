"""`graft bench grafts` end to end on a tiny LLM: one engine vs separate engines in
subprocesses, JSON with bytes, RSS, tokens/s and TTFT percentiles; the shared LLM counted once."""

import json

import pytest

from graft.cli import main
from graft.errors import GraftConfigError
from graft.benchmarks.grafts import make_synthetic_grafts, workload
from graft.benchmarks.grafts_worker import resident_bytes, run_workload


def test_workload_is_seeded_and_round_robin():
    a = workload(["x", "y"], 6, 0.5, 4.0, seed=3)
    assert a == workload(["x", "y"], 6, 0.5, 4.0, seed=3)
    assert [r["graft"] for r in a] == ["x", "y"] * 3
    assert all(r2["at"] >= r1["at"] for r1, r2 in zip(a, a[1:]))
    assert all(r["at"] == 0.0 for r in workload(["x"], 3, 1.0, None, 0))


def test_shared_engine_holds_the_llm_once(tiny_llama, tmp_path):
    from graft.serving import Engine, EngineConfig

    runs = make_synthetic_grafts(tiny_llama, 2, tmp_path, shared_encoder=True, image_size=32)
    cfg = EngineConfig(num_kv_blocks=32)
    both = Engine.from_grafts(runs, cfg)
    one = Engine.from_grafts({"graft0": runs["graft0"]}, cfg)
    b2, b1 = resident_bytes(both), resident_bytes(one)
    assert b2["llm_params"] == b1["llm_params"] and b2["kv_cache"] == b1["kv_cache"]
    # every checkpoint tensor once, packed or plain: the tied head's packed copy of the
    # embedding table is what the lookups read too (CausalLM.read_table_from_head)
    from safetensors import safe_open

    with safe_open(f"{tiny_llama}/model.safetensors", "pt") as f:
        ckpt = sum(f.get_tensor(k).numel() * 4 for k in f.keys())
    assert one.runner.hf_config.tie_word_embeddings and b1["llm_params"] == ckpt
    assert b2["encoder_params"] == b1["encoder_params"]  # --shared-encoder: loaded once
    assert b2["projector_params"] == 2 * b1["projector_params"]
    out = run_workload(both, workload(list(runs), 4, 0.5, None, 0), 32, 2)
    assert out["requests"] == 4 and out["output_tokens"] == 8 and len(out["ttft_s"]) == 4
    assert both.grafts.cache.pinned_bytes == 0


def test_bench_grafts_command(tiny_llama, tmp_path):
    out = tmp_path / "bench.json"
    assert main(["bench", "grafts", "--llm", str(tiny_llama), "--synthetic", "2",
                 "--num-requests", "4", "--max-tokens", "2", "--image-size", "32",
                 "--num-kv-blocks", "32", "--cores", "1", "--out", str(out),
                 "--work-dir", str(tmp_path / "new" / "work")]) == 0  # made, parents too
    assert (tmp_path / "new" / "work").is_dir()
    r = json.loads(out.read_text())
    assert r["shared"]["processes"] == 1 and r["separate"]["processes"] == 2
    for setup in ("shared", "separate"):
        assert r[setup]["requests"] == 4 and r[setup]["output_tokens"] == 8
        assert r[setup]["rss_loaded"] > 0 and r[setup]["ttft_p99_s"] >= r[setup]["ttft_p50_s"]
    # two LLM copies and two KV pools against one
    assert r["separate"]["bytes"]["llm_params"] == 2 * r["shared"]["bytes"]["llm_params"]
    assert r["separate"]["bytes"]["kv_cache"] == 2 * r["shared"]["bytes"]["kv_cache"]
    assert r["shared_kv_blocks"] == 32 and len(r["cpus"]) == 1
    assert set(r["ratios"]) == {"bytes_resident", "rss_loaded", "tokens_per_s", "ttft_p50",
                                "ttft_p99"}


def test_bench_grafts_bad_input(tmp_path, tiny_llama):
    from graft.benchmarks import grafts as bench_multigraft

    with pytest.raises(GraftConfigError, match="config.json"):
        bench_multigraft.run(_args(["--llm", str(tmp_path)]))
    with pytest.raises(GraftConfigError, match="image-ratio"):
        bench_multigraft.run(_args(["--image-ratio", "2"]))
    (tmp_path / "a_file").write_text("")
    with pytest.raises(GraftConfigError, match="--work-dir .*a_file: cannot be used as a folder"):
        bench_multigraft.run(_args(["--llm", str(tiny_llama), "--work-dir", str(tmp_path / "a_file")]))
    with pytest.raises(GraftConfigError, match="--cores 999"):
        bench_multigraft.run(_args(["--llm", str(tiny_llama), "--cores", "999"]))


def _args(argv):
    import argparse

    from graft.benchmarks import grafts as bench_multigraft

    parser = argparse.ArgumentParser()
    bench_multigraft.add_arguments(parser)
    return parser.parse_args(argv)
