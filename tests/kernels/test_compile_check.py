"""The Triton kernels compile for an H100/H200 (sm_90) through the real pipeline, no GPU needed."""

import importlib.util
import os
import subprocess
import sys

import pytest

if importlib.util.find_spec("triton") is None:  # not imported here: see test_triton_interpret.py
    pytest.skip("triton is not installed", allow_module_level=True)


def test_kernels_compile_for_sm90_bf16():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "graft.kernels.compile_check", "--arch", "90",
                           "--dtypes", "bf16"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ok ") == 7  # paged attention x3, norm, rotary, store_kv, MoE GEMM


def test_compile_check_refuses_the_interpreter(monkeypatch, capsys):
    from graft.kernels import compile_check

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert compile_check.main(["--dtypes", "fp16"]) == 2
    assert "TRITON_INTERPRET" in capsys.readouterr().err
