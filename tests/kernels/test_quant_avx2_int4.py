"""int4 on AVX2 with integer activation digits (kernels/csrc/quant_avx2_int4_cpu.c): the VNNI
path's arithmetic with vpmaddubsw, so its outputs equal the VNNI path's bit for bit, a row's
outputs do not depend on the rows beside it (1-row and 3-row tiles, 96-row chunks), and rows
the fixed point cannot hold (inf, NaN, tiny) take the fp32 path."""

import os

import pytest
import torch

from graft.kernels import cpu_ops, cpu_quant
from graft.kernels.quant_formats import QuantScheme, quant_linear, quantize

pytestmark = pytest.mark.skipif(
    not (cpu_ops.available() and cpu_quant.ISA_NAMES.index(cpu_quant.isa()) >= cpu_quant.ISA_NAMES.index("avx2")),
    reason="needs the C kernels on a CPU with AVX2 + FMA")


def _case(n, k, m, scheme, seed):
    g = torch.Generator().manual_seed(seed)
    qw = quantize(torch.randn(n, k, generator=g) * 0.05, QuantScheme.parse(scheme))
    return qw, torch.randn(m, k, generator=g), torch.randn(n, generator=g)


@pytest.mark.skipif(cpu_quant.isa() not in ("avx512-vnni", "avx512-amx")
                    or bool(os.environ.get("GRAFT_CPU_MARCH", "").strip()),
                    reason="needs this CPU's own AVX-512 VNNI build to compare with")
@pytest.mark.parametrize("scheme,n,k,m", [("int4-g32", 40, 96, 11), ("int4-g32", 1536, 576, 4),
                                          ("int4-g64", 17, 512, 7), ("int4-g128", 64, 256, 2)])
def test_equals_the_vnni_path_bit_for_bit(scheme, n, k, m):
    qw, x, bias = _case(n, k, m, scheme, seed=n + k)
    vnni = cpu_quant.quant_linear(x, qw, bias)
    with cpu_quant.isa_capped("avx2"):
        digits = cpu_quant.quant_linear(x, qw, bias)
    assert torch.equal(digits, vnni)


@pytest.mark.parametrize("m", [1, 4, 5, 7, 100])  # 5: 3 + two 1-row tiles; 100: 96, then 3 + 1
def test_rows_do_not_depend_on_the_batch(m):
    qw, x, bias = _case(72, 128, m, "int4-g32", seed=m)
    with cpu_quant.isa_capped("avx2"):
        together = cpu_quant.quant_linear(x, qw, bias)
        alone = torch.cat([cpu_quant.quant_linear(x[i:i + 1], qw, bias) for i in range(m)])
    assert torch.equal(together, alone)
    torch.testing.assert_close(together, quant_linear(x, qw, bias), rtol=1e-5, atol=1e-5)


def test_wide_rows_stay_within_the_fixed_point_bound():
    """The only rounding is x -> s * X, s = max|x| / (127 * 2^16): about 2^-24 of the row's
    largest |x| per element, so one outlier sets the error of its whole row."""
    qw, x, _ = _case(64, 256, 5, "int4-g32", seed=1)
    x = x * torch.logspace(-6, 3, 256)
    x[2, 7] = 5e4
    exact = x.double() @ qw.dequantize().double().T
    w_abs = qw.dequantize().abs().double()
    bound = 2.0 ** -22 * x.abs().amax(dim=1, keepdim=True).double() * w_abs.sum(dim=1) \
        + 256 * 2.0 ** -24 * (x.abs().double() @ w_abs.T) + 1e-6
    with cpu_quant.isa_capped("avx2"):
        got = cpu_quant.quant_linear(x, qw).double()
    assert ((got - exact).abs() <= bound).all()


@pytest.mark.parametrize("isa", ["own", "avx2"])
@pytest.mark.parametrize("scheme", ["int8", "int4-g32"])
def test_a_nan_row_gives_nan_and_a_tiny_row_its_products(isa, scheme):
    """A NaN among finite values of a row used to vanish from the VNNI path's max (the later
    values replaced it) and the row came out finite; the fixed point cannot hold a NaN row
    nor a row whose 1/step overflows, so both take the fp32 path."""
    qw, x, bias = _case(48, 64, 3, scheme, seed=5)
    x[0, 3] = float("nan")  # early in its row: later lanes meet it in max
    x[1] *= 1e-33
    with cpu_quant.isa_capped(cpu_quant.isa() if isa == "own" else "avx2"):
        got = cpu_quant.quant_linear(x, qw, bias)
    assert got[0].isnan().all()
    torch.testing.assert_close(got[1:], quant_linear(x[1:], qw, bias), rtol=1e-5, atol=1e-5)
