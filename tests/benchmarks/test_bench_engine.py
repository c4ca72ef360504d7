"""`graft bench engine` runs end to end on a tiny checkpoint and writes its JSON."""

import json

import pytest
import torch

from graft.cli import main
from graft.kernels import cpu_ops
from graft.serving import EngineConfig
from graft.serving.engine.model_runner import default_quantization


def test_bench_engine_cli(tiny_llama, tmp_path):
    out = tmp_path / "bench.json"
    rc = main(["bench", "engine", str(tiny_llama), "--num-requests", "5", "--concurrency", "4",
               "--input-len", "8", "40", "--output-len", "2", "9", "--kv-cache-dtype", "int8",
               "--linear-dispatch", "torch", "--out", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["kv_cache_dtype"] == "int8"
    if default_quantization(EngineConfig(), torch.device("cpu")) == "fp32":
        # fp32 in the C layout by default (an AVX2 or AVX-512 CPU): the flag's path is recorded
        dispatch = result["linear_dispatch"]
        assert dispatch["mode"] == "torch" and set(dispatch["choices"].values()) == {"torch"}
    engine, hf = result["engine"], result["hf"]
    assert engine["output_tokens"] == hf["output_tokens"] > 0
    assert result["throughput_ratio"] > 0 and 0 < result["engine_roofline_fraction"]
    assert result["roofline_flops_per_s"]["m512"] > 0 and engine["flops"] > 0


def test_bench_engine_formats(tiny_llama, tmp_path, capsys):
    out = tmp_path / "formats.json"
    rc = main(["bench", "engine", str(tiny_llama), "--quantization", "none,fp32,int8,int4",
               "--decode-tokens", "6", "--bandwidth-mb", "64", "--out", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    assert list(result["formats"]) == ["none", "fp32", "int8", "int4"] and result["read_bandwidth_bytes_per_s"] > 0
    fp32, int8, int4 = (result["formats"][k] for k in ("fp32", "int8", "int4"))
    assert int8["linears"] == {"int8": 9} and fp32["linears"] == {"fp32": 9}  # 2 layers x 4 + the head
    assert int4["weight_bytes_per_decode_step"] < int8["weight_bytes_per_decode_step"] \
        < fp32["weight_bytes_per_decode_step"] / 3
    for f in (fp32, int8, int4):
        assert f["batch1_decode_tokens_per_s"] > 0 and f["batch32_decode_tokens_per_s"] > 0
        assert f["prefill_tokens"] == 511 and 0 < f["batch1_roofline_fraction"]
        passes = sorted(f["prefill_pass_seconds"])  # 3 fresh prompts after a warm-up: the median
        assert len(passes) == 3 and f["prefill512_tokens_per_s"] == pytest.approx(511 / passes[1])
        assert f["batch1_roofline_fraction"] == pytest.approx(
            f["batch1_decode_tokens_per_s"] * f["weight_bytes_per_decode_step"]
            / f["read_bandwidth_bytes_per_s"])  # against the bandwidth read around its own run
    assert int8["batch1_decode_vs_base"] > 0 and result["formats"]["none"]["linears"] == {}
    assert result["formats"]["none"]["linear_dispatch"] is None  # no C-layout linears
    if cpu_ops.available():
        assert int8["linear_dispatch"]["mode"] == "c"  # tests pin GRAFT_LINEAR_DISPATCH=c
    assert "int4" in capsys.readouterr().out


def test_bench_engine_formats_long_context(tiny_llama, tmp_path, capsys):
    out = tmp_path / "formats.json"
    rc = main(["bench", "engine", str(tiny_llama), "--quantization", "int8", "--context", "150",
               "--decode-tokens", "4", "--bandwidth-mb", "16", "--out", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["batch1_context"] == 150 and result["formats"]["int8"]["batch1_decode_tokens_per_s"] > 0
    capsys.readouterr()
    assert main(["bench", "engine", str(tiny_llama), "--quantization", "int8", "--context", "100000"]) == 2
    assert "error: --context 100000: use 1 to" in capsys.readouterr().err
    assert main(["bench", "engine", str(tiny_llama), "--quantization", "int8", "--context", "0"]) == 2
    assert "error: argument --context: 0 is out of range: use >= 1" in capsys.readouterr().err


def test_bench_engine_on_an_moe_model(tiny_llm_factory, tmp_path):
    """An MoE checkpoint: the workload's FLOPs count active experts only; the formats' roofline
    reads the top-k experts per token at batch 1 and more distinct experts at batch 32."""
    model_dir = tiny_llm_factory("qwen3_moe")
    out = tmp_path / "moe.json"
    assert main(["bench", "engine", str(model_dir), "--num-requests", "3", "--concurrency", "2",
                 "--input-len", "8", "20", "--output-len", "2", "5", "--skip-hf",
                 "--out", str(out)]) == 0
    assert json.loads(out.read_text())["engine"]["flops"] > 0
    assert main(["bench", "engine", str(model_dir), "--quantization", "int8", "--decode-tokens", "4",
                 "--bandwidth-mb", "64", "--out", str(out)]) == 0
    int8 = json.loads(out.read_text())["formats"]["int8"]
    # 2 layers x (qkv, o, 8 experts x 2) + the head
    assert int8["linears"] == {"int8": 2 * (2 + 8 * 2) + 1}
    assert int8["weight_bytes_per_decode_step"] < int8["weight_bytes_per_batch32_step"]
    assert int8["batch32_roofline_tokens_per_s"] > 0 and int8["batch1_decode_tokens_per_s"] > 0
