"""The C row argmax the sampler takes greedy tokens from equals torch.argmax(dim=-1): the first
index of the largest value, a NaN counting as the largest, on every width around the 16-lane
vector (8 lanes in an AVX2 build, test_avx2_build.py), strided rows, and the rows torch keeps (other dtypes, GPU) going to torch."""

import pytest
import torch

from graft.kernels import argmax, cpu_ops

pytestmark = pytest.mark.skipif(not cpu_ops.available(), reason="the C kernels could not be built")


@pytest.mark.parametrize("width", [1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 100, 49152])
def test_ties_nans_and_infinities_follow_torch(width):
    gen = torch.Generator().manual_seed(width)
    for trial in range(60):
        x = torch.randint(0, 4, (5, width), generator=gen).float()  # many ties
        if trial % 3 == 1:
            x[torch.rand(x.shape, generator=gen) < 0.05] = float("nan")
        if trial % 4 == 2:
            x[torch.rand(x.shape, generator=gen) < 0.5] = -float("inf")
        if trial % 10 == 3:
            x[:] = -float("inf")
        if trial % 10 == 4:
            x[:] = -0.0
            x[:, -1] = 0.0  # -0 == +0: the first one wins
        if trial % 10 == 5:
            x[:, -1] = float("nan")  # a NaN only in the last lane (the vector tail)
        got = cpu_ops.argmax(x)
        assert got.dtype == torch.int64
        assert torch.equal(got, x.argmax(dim=-1)), (trial, x)


def test_strided_rows_and_large_batches():
    x = torch.randn(33, 40000)[:, 3:39000]  # rows 40000 floats apart, not 16-aligned
    assert x.stride(0) == 40000 and not x.is_contiguous()
    assert torch.equal(cpu_ops.argmax(x), x.argmax(dim=-1))
    assert cpu_ops.argmax(torch.empty(0, 7)).shape == (0,)


def test_other_inputs_go_to_torch():
    x = torch.randn(3, 50, dtype=torch.float64)
    assert torch.equal(cpu_ops.argmax(x), x.argmax(dim=-1))
    assert torch.equal(argmax(x.bfloat16()), x.bfloat16().argmax(dim=-1))
    col = torch.randn(50, 3).t()  # values not contiguous within a row
    assert torch.equal(cpu_ops.argmax(col), col.argmax(dim=-1))


def test_reference_mode_uses_torch(monkeypatch):
    monkeypatch.setenv("GRAFT_KERNELS", "reference")
    calls = []
    monkeypatch.setattr(cpu_ops, "argmax", lambda x: calls.append(x))
    x = torch.randn(2, 20)
    assert torch.equal(argmax(x), x.argmax(dim=-1)) and not calls
