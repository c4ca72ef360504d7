"""The AMX tile path of the int8, int4 and bf16 C linears (kernels/csrc/quant_amx_cpu.c), taken
by calls of 8 rows or more on a CPU with AMX: int8 and int4 must give the VNNI path's outputs bit
for bit (the same integer digit sums, combined the same way), bf16 the dequantize-then-matmul
reference's within float noise; shapes the tiles do not cover, and rows holding inf or NaN,
must fall back to the vector paths."""

import pytest
import torch

from graft.kernels import cpu_ops, cpu_quant
from graft.kernels.quant_formats import QuantScheme, quant_linear, quantize
from tests.kernels.isa_paths import this_and_capped

pytestmark = pytest.mark.skipif(not cpu_ops.available() or cpu_quant.isa() != "avx512-amx",
                                reason="no AMX path on this machine (cpu_quant.isa() != 'avx512-amx')")


def _weight(n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) * 0.05


def _both(x, qw, bias, threads=None):
    """(AMX path, the vector path of a CPU without AMX), on `threads` torch threads."""
    return this_and_capped(x, qw, bias, "avx512-vnni", threads)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n,k", [(40, 64), (96, 128), (200, 576), (64, 1536)])
@pytest.mark.parametrize("m", [8, 11, 32, 97, 200])  # 3m piece rows: padded tiles, chunks of 96
def test_int8_tiles_equal_the_vnni_path_bit_for_bit(m, n, k, threads):
    qw = quantize(_weight(n, k, seed=k + n), QuantScheme.parse("int8"))
    x, bias = torch.randn(m, k), torch.randn(n)
    x[1] *= 1e-4  # rows with different steps
    x[-1] *= 300.0
    got, vnni = _both(x, qw, bias, threads)
    assert torch.equal(got, vnni)
    # the fixed point's own bound (test_quant_vnni.py): 2^-22 of the row's largest |x| x sum|w|
    bound = 2.0 ** -22 * x.abs().amax(dim=1, keepdim=True) * qw.dequantize().abs().sum(dim=1) + 1e-5
    assert ((got - quant_linear(x, qw, bias)).abs() <= bound).all()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("scheme,n,k", [("int4-g64", 40, 64), ("int4-g64", 200, 576),
                                        ("int4-g128", 96, 1536), ("int4-g128", 64, 640)])
@pytest.mark.parametrize("m", [8, 11, 97, 200])
def test_int4_tiles_equal_the_vnni_path_bit_for_bit(m, scheme, n, k, threads):
    """The same digits per group, folded into fp32 in the VNNI tile's order."""
    qw = quantize(_weight(n, k, seed=k + n), QuantScheme.parse(scheme))
    x, bias = torch.randn(m, k, generator=torch.Generator().manual_seed(m)), torch.randn(n)
    x[-1] *= 300.0
    got, vnni = _both(x, qw, bias, threads)
    assert torch.equal(got, vnni)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n,k", [(40, 32), (96, 128), (200, 576), (64, 1536)])
@pytest.mark.parametrize("m", [8, 11, 32, 97, 200])
def test_bf16_tiles_equal_the_reference(m, n, k, threads):
    """x in three bf16 pieces keeps fp32's accuracy: the error stays at fp32 summation noise,
    also for rows spanning many orders of magnitude."""
    qw = quantize(_weight(n, k, seed=k), QuantScheme.parse("bf16"))
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=g) * torch.logspace(-4, 3, k)[torch.randperm(k, generator=g)]
    bias = torch.randn(n)
    got, fma = _both(x, qw, bias, threads)
    exact = x.double() @ qw.dequantize().double().T + bias.double()
    noise = k * 2.0 ** -24 * (x.abs().double() @ qw.dequantize().abs().double().T + bias.abs().double())
    assert ((got.double() - exact).abs() <= 2 * noise + 1e-30).all()
    assert ((fma.double() - exact).abs() <= 2 * noise + 1e-30).all()


# Calls the tiles cut (quant_amx_cpu.c plan_call): several passes of rows (the pass keeps 1 MB
# of piece rows), several blocks of pairs (512 KB of W each), K in blocks (over 256 piece rows
# x 1 MB); m, n, k chosen to cross each cut on 1 and 2 threads.
CUT_SHAPES = [(300, 1024, 576),  # bf16: 2 passes of 288 rows (3 pieces), pairs in blocks of 14
              (200, 96, 2560)]   # bf16: K in 2 blocks of 1280, 2 passes of 128 rows


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m,n,k", CUT_SHAPES)
def test_bf16_tiles_cut_in_blocks_equal_the_reference(m, n, k, threads):
    """Each row's sums are the same whatever the call around it (its pass, its K blocks'
    partial sums stored and reloaded whole), and within fp32 noise of the reference."""
    qw = quantize(_weight(n, k, seed=k), QuantScheme.parse("bf16"))
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    bias = torch.randn(n)
    got, _ = _both(x, qw, bias, threads)
    exact = x.double() @ qw.dequantize().double().T + bias.double()
    noise = k * 2.0 ** -24 * (x.abs().double() @ qw.dequantize().abs().double().T + bias.abs().double())
    assert ((got.double() - exact).abs() <= 2 * noise).all()
    alone = torch.cat([cpu_quant.quant_linear(x[i:i + 32], qw, bias) for i in range(0, m - 8, 32)])
    assert torch.equal(got[:len(alone)], alone)
    # bf16 rows in and out (one piece a row: passes of 384 rows at K 2560): the fp32 route's
    # numbers rounded, bit for bit
    xb, bb = x.bfloat16(), bias.bfloat16()
    want = cpu_quant.quant_linear(xb.float(), qw, bb.float()).to(torch.bfloat16)
    assert torch.equal(cpu_quant.quant_linear(torch.cat([xb, xb]), qw, bb), torch.cat([want, want]))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m,n,k", [(200, 2048, 576),  # pairs in blocks of 28
                                   (200, 64, 4608)])  # K in 2 blocks of 2304, passes of 128 rows
def test_int8_tiles_cut_in_blocks_equal_the_vnni_path_bit_for_bit(m, n, k, threads):
    """Partial int32 sums stored between K blocks and reloaded are the same integers."""
    qw = quantize(_weight(n, k, seed=k + n), QuantScheme.parse("int8"))
    x, bias = torch.randn(m, k, generator=torch.Generator().manual_seed(m)), torch.randn(n)
    got, vnni = _both(x, qw, bias, threads)
    assert torch.equal(got, vnni)


@pytest.mark.parametrize("scheme,k", [("int8", 96), ("bf16", 48), ("int8", 577), ("int4-g32", 96),
                                      ("int4-g32", 576)])
def test_widths_the_tiles_do_not_cover_run_the_vector_path(scheme, k):
    """int8 and int4 need K a multiple of 64, bf16 of 32, and int4 groups of 64 or 128 (groups
    of 32 ran no faster on the tiles): the rest take the vector path whole."""
    qw = quantize(_weight(48, k), QuantScheme.parse(scheme))
    x, bias = torch.randn(16, k), torch.randn(48)
    got, vector = _both(x, qw, bias)
    assert torch.equal(got, vector)


@pytest.mark.parametrize("scheme", ["int8", "bf16"])
def test_rows_with_inf_or_nan_fall_back(scheme):
    qw = quantize(_weight(64, 128), QuantScheme.parse(scheme))
    x = torch.randn(12, 128)
    x[3, 5] = float("inf")
    x[7, 9] = float("nan")
    got, vector = _both(x, qw, None)
    torch.testing.assert_close(got, vector, equal_nan=True)
    assert got[7].isnan().all() and not got[3].isfinite().any()
    assert got[[0, 1, 2, 4, 5, 6, 8, 9, 10, 11]].isfinite().all()


def test_few_rows_stay_on_the_vector_path():
    """Below 8 rows the tiles would mostly hold padding: the vector paths run (bit-identical
    for bf16 too, which the tiles are not)."""
    qw = quantize(_weight(64, 128), QuantScheme.parse("bf16"))
    x = torch.randn(7, 128)
    got, vector = _both(x, qw, None)
    assert torch.equal(got, vector)


@pytest.mark.parametrize("m", [8, 40, 200])
def test_bf16_valued_activations_take_one_piece(m):
    """x that is bf16 already (a bf16 engine's activations, upcast) needs no mid and lo
    pieces: one tile pass, the same sums the three would give (they add zeros)."""
    qw = quantize(_weight(96, 576, seed=m), QuantScheme.parse("bf16"))
    x = torch.randn(m, 576, generator=torch.Generator().manual_seed(m)).bfloat16()
    # bf16 in, bf16 out: within one bf16 rounding of the reference
    torch.testing.assert_close(cpu_quant.quant_linear(x, qw), quant_linear(x, qw), rtol=2 ** -7, atol=1e-6)
    got, fma = _both(x.float(), qw, None)
    exact = x.double() @ qw.dequantize().double().T
    noise = 576 * 2.0 ** -24 * (x.abs().double() @ qw.dequantize().abs().double().T)
    assert ((got.double() - exact).abs() <= 2 * noise).all()
    x2 = x.float()
    x2[-1, 3] += 1e-3  # one value off the bf16 grid: all rows take three pieces again
    got2, _ = _both(x2, qw, None)
    assert ((got2[:-1].double() - exact[:-1]).abs() <= 2 * noise[:-1]).all()
