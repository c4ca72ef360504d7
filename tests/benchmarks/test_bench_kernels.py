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
