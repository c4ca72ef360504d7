"""`graft bench engine` runs end to end on a tiny checkpoint and writes its JSON."""

import json

from graft.cli import main


def test_bench_engine_cli(tiny_llama, tmp_path):
    out = tmp_path / "bench.json"
    rc = main(["bench", "engine", str(tiny_llama), "--num-requests", "5", "--concurrency", "4",
               "--input-len", "8", "40", "--output-len", "2", "9", "--out", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    engine, hf = result["engine"], result["hf"]
    assert engine["output_tokens"] == hf["output_tokens"] > 0
    assert result["throughput_ratio"] > 0 and 0 < result["engine_roofline_fraction"]
    assert result["roofline_flops_per_s"]["m512"] > 0 and engine["flops"] > 0
