"""The kernel benchmark on a machine without CUDA: a message and exit status 0, nothing written."""

import argparse

import pytest
import torch

from graft.benchmarks import kernels as bench


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU this would run the full benchmark")
def test_bench_without_cuda_says_so_and_exits_0(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    out = tmp_path / "bench.json"
    assert bench.run(parser.parse_args(["--out", str(out)])) == 0
    assert "needs a CUDA GPU" in capsys.readouterr().out
    assert not out.exists()


def test_bench_is_a_graft_subcommand():
    from graft.cli import COMMANDS

    assert COMMANDS["bench kernels"][0] == "graft.benchmarks.kernels"


def test_no_gpu_is_known_from_device_files_before_torch_loads():
    nothing = lambda path: False  # noqa: E731
    nvidia = lambda path: path == "/dev/nvidiactl"  # noqa: E731
    assert bench.no_gpu_visible({}, nothing)
    assert not bench.no_gpu_visible({}, nvidia)
    assert not bench.no_gpu_visible({"CUDA_VISIBLE_DEVICES": "0"}, nvidia)
    assert bench.no_gpu_visible({"CUDA_VISIBLE_DEVICES": ""}, nvidia)


@pytest.mark.skipif(not bench.no_gpu_visible(), reason="a GPU driver is visible here")
def test_bench_kernels_without_a_gpu_never_imports_torch():
    import subprocess
    import sys

    code = ("import sys; from graft.cli import main; rc = main(['bench', 'kernels']); "
            "print(rc, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[-1] == "0 False"
