"""`graft bench load` starts the engine on each model in fresh processes: seconds, peak and
resident memory, the model's tensor bytes, ratios to the first model; a GGUF file's Q4
linears are held in int4 straight from the file."""

import json

import pytest

from graft.cli import main
from tests.gguf_files import write_gguf
from tests.tiny_llm import build_llm

pytest.importorskip("gguf")
Q4 = {k: "Q4_0" for k in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")}


def test_loads_each_model_and_compares_to_the_first(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GRAFT_GGUF_CACHE", str(tmp_path / "cache"))
    llm = build_llm(tmp_path / "hf", "qwen2")
    gguf = write_gguf(llm, tmp_path / "tiny.Q4_0.gguf", Q4)
    out = tmp_path / "load.json"
    assert main(["bench", "load", str(gguf), str(llm), str(llm), "--quantization", ",,int4-g32",
                 "--runs", "1", "--kv-blocks", "8", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert list(result["models"]) == [str(gguf), str(llm), f"{llm} (int4-g32)"]
    from_file, dense, quantized = result["models"].values()
    assert from_file["plan"] == ["fp32", "int4-g32"]  # the Q4 linears; the F32 head
    assert dense["plan"] == ["fp32"] and quantized["plan"] == ["int4-g32"]
    for entry in result["models"].values():
        assert len(entry["runs"]) == 1 and entry["load_s"]["min"] > 0
        assert entry["peak_rss_bytes"]["median"] >= entry["resident_bytes"]["median"] > 0
    assert from_file["vs_first"] == {"load_s": 1.0, "peak_rss_bytes": 1.0}
    assert from_file["tensor_bytes"]["median"] < dense["tensor_bytes"]["median"]
    assert str(gguf) in result["gguf_dir_ready_s"]
    assert "vs the first" in capsys.readouterr().out


def test_one_scheme_per_model_and_a_failed_load_is_one_line(tmp_path, capsys):
    llm = build_llm(tmp_path / "hf", "qwen2")
    assert main(["bench", "load", str(llm), "--quantization", "int8,int4", "--runs", "1"]) == 2
    assert "--quantization names 2 schemes for 1 models" in capsys.readouterr().err
    assert main(["bench", "load", str(llm), "--quantization", "int4-g48", "--runs", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "the engine failed to load" in err and "int4-g48" in err
