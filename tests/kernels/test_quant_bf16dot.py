"""The AVX512-BF16 path of the bf16 C linear (kernels/csrc/quant_bf16dot_cpu.c), taken when
every activation is a bf16 value (a bf16 engine's): both factors bf16, so each product is exact
and the result must be the FMA path's up to the order of the fp32 sums; any other x must take
the FMA path unchanged."""

import contextlib

import pytest
import torch

from graft.kernels import cpu_ops, cpu_quant
from graft.kernels.quant_formats import QuantScheme, quantize
from tests.kernels.isa_paths import this_and_capped

pytestmark = pytest.mark.skipif(not cpu_ops.available() or not cpu_quant.bf16_dot(),
                                reason="no AVX512-BF16 dot path on this machine")


def _paths(x, qw, bias, threads):
    """(the dot path, the FMA path of a CPU without AVX512-BF16), on `threads` threads; capped
    at VNNI so that an AMX CPU's tiles do not take the rows instead."""
    with cpu_quant.isa_capped("avx512-vnni"):
        return this_and_capped(x, qw, bias, "avx512", threads)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n,k", [(40, 64), (100, 577), (64, 1536)])  # N past 32s, odd K
@pytest.mark.parametrize("m", [1, 2, 5, 6, 7, 97, 200])  # every tile height, chunks of 96
def test_bf16_rows_match_the_fma_path(m, n, k, threads):
    g = torch.Generator().manual_seed(m * k + n)
    qw = quantize(torch.randn(n, k, generator=g) * 0.05, QuantScheme.parse("bf16"))
    x = torch.randn(m, k, generator=g).bfloat16().float()
    x[-1] *= 300.0
    bias = torch.randn(n, generator=g)
    got, fma = _paths(x, qw, bias, threads)
    # exact products; fp32 sums of K terms in another order
    exact = x.double() @ qw.dequantize().double().T + bias.double()
    bound = 2.0 ** -20 * (x.abs().double() @ qw.dequantize().abs().double().T) + 1e-6
    assert ((got.double() - exact).abs() <= bound).all()
    assert ((fma.double() - exact).abs() <= bound).all()


def test_the_dot_path_runs_and_flushes_denormals():
    """VDPBF16PS reads denormal inputs as zero (the FMA path keeps them): a row whose only
    product is a denormal tells the two paths apart."""
    qw = quantize(torch.ones(32, 64), QuantScheme.parse("bf16"))
    x = torch.zeros(3, 64)
    x[:, 0] = 2.0 ** -130  # a bf16 denormal
    got, fma = _paths(x, qw, None, 1)
    assert (fma == 2.0 ** -130).all() and (got == 0).all()


def test_other_activations_take_the_fma_path_unchanged():
    g = torch.Generator().manual_seed(0)
    qw = quantize(torch.randn(96, 128, generator=g) * 0.05, QuantScheme.parse("bf16"))
    x = torch.randn(33, 128, generator=g).bfloat16().float()
    x[20, 5] = 1.0 + 2.0 ** -12  # one value that is not a bf16 (adding 2^-12 to a random one
    # could land on a bf16: -2^-10 * 1.25 + 2^-12 is -2^-10)
    got, fma = _paths(x, qw, None, 2)
    assert torch.equal(got, fma)
    x[20, 5] = float("inf")  # inf is a bf16: the dot path carries it as the FMA path does
    got, fma = _paths(x, qw, None, 2)
    assert torch.equal(got.isinf(), fma.isinf()) and torch.equal(got.isnan(), fma.isnan())


def _io_and_fp32_route(x, qw, bias, cap):
    """(bf16 in and out, x.float() -> the C linear -> .to(bfloat16)), capped at `cap`."""
    with cpu_quant.isa_capped(cap) if cap else contextlib.nullcontext():
        got = cpu_quant.quant_linear(x, qw, bias)
        want = cpu_quant.quant_linear(x.float(), qw, None if bias is None else bias.float())
    assert got.dtype == torch.bfloat16
    return got, want.to(torch.bfloat16)


# the dot products alone, and this CPU's paths: on an AMX CPU its tiles take calls of 8 rows
# or more whose K is a multiple of 32 (the 97- and 200-row calls with K 128 and 64)
@pytest.mark.parametrize("cap", ["avx512-vnni", None])
@pytest.mark.parametrize("k,stride", [(128, 128), (577, 577), (64, 130), (64, 67)])
@pytest.mark.parametrize("m", [1, 7, 97, 200])
def test_bf16_in_bf16_out_is_the_fp32_route_bit_for_bit(m, k, stride, cap):
    """A bf16 engine's call (bf16 rows in, bf16 out, the rows read in place where K and the
    row stride are even) gives x.float() -> the C linear -> .to(bfloat16) exactly, bias too."""
    g = torch.Generator().manual_seed(m + k)
    qw = quantize(torch.randn(72, k, generator=g) * 0.05, QuantScheme.parse("bf16"))
    x = torch.randn(m, stride, generator=g).bfloat16()[:, :k]
    bias = torch.randn(72, generator=g).bfloat16()
    got, want = _io_and_fp32_route(x, qw, bias, cap)
    assert torch.equal(got, want)


@pytest.mark.parametrize("cap", ["avx512-vnni", None])
def test_bf16_in_bf16_out_carries_inf_as_the_fp32_route(cap):
    """inf in a row: the fp32 route leaves AMX's tiles for the dot products (its split cannot
    carry inf); the bf16 route must do the same."""
    g = torch.Generator().manual_seed(1)
    qw = quantize(torch.randn(96, 128, generator=g) * 0.05, QuantScheme.parse("bf16"))
    x = torch.randn(33, 128, generator=g).bfloat16()
    x[20, 5] = float("inf")
    got, want = _io_and_fp32_route(x, qw, None, cap)
    assert got[20].isinf().all() and torch.equal(got.isinf(), want.isinf())
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(), want.nan_to_num())
