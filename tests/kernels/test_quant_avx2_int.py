"""The AVX2 int8 / int4 linears (kernels/csrc/quant_avx2_int_cpu.c): 4-row one-block tiles
and 1-3 row pair tiles, each row one FMA chain over the columns in order (int4: per group,
two groups side by side at 1 and 2 rows). So a row's output does not depend on how many rows
share the call, and ragged K (int8: padded to 4 columns) and N (padded to 32 lanes) match the
dequantized reference."""

import pytest
import torch

from graft.kernels import cpu_ops, cpu_quant
from graft.kernels.quant_formats import QuantScheme, quant_linear, quantize

pytestmark = pytest.mark.skipif(
    not (cpu_ops.available() and cpu_quant.ISA_NAMES.index(cpu_quant.isa()) >= cpu_quant.ISA_NAMES.index("avx2")),
    reason="needs the C kernels on a CPU with AVX2 + FMA")


def _quantized(n, k, seed, scheme="int8"):
    g = torch.Generator().manual_seed(seed)
    return quantize(torch.randn(n, k, generator=g) * 0.05, QuantScheme.parse(scheme)), g


@pytest.mark.parametrize("scheme,n,k", [("int8", 40, 130), ("int8", 17, 7), ("int8", 64, 1024),
                                        ("int8", 33, 5), ("int8", 9, 3), ("int8", 35, 12),
                                        ("int4-g32", 40, 96), ("int4-g64", 17, 512),
                                        ("int4-g128", 64, 256)])
def test_rows_do_not_depend_on_the_batch(scheme, n, k):
    qw, g = _quantized(n, k, seed=n + k, scheme=scheme)
    x, bias = torch.randn(11, k, generator=g), torch.randn(n, generator=g)
    with cpu_quant.isa_capped("avx2"):
        together = cpu_quant.quant_linear(x, qw, bias)  # tiles of 4, 4, then 3 rows
        alone = torch.cat([cpu_quant.quant_linear(x[i:i + 1], qw, bias) for i in range(11)])
        pairs = torch.cat([cpu_quant.quant_linear(x[i:i + 2], qw, bias) for i in range(0, 11, 2)])
        # a 4-row tile, then 1, 2 or 3 rows left over (int4: two groups at a time at 1 and 2)
        leftovers = [cpu_quant.quant_linear(x[:m], qw, bias) for m in (5, 6, 7)]
    assert torch.equal(together, alone) and torch.equal(together, pairs)
    assert all(torch.equal(got, alone[:len(got)]) for got in leftovers)
    torch.testing.assert_close(together, quant_linear(x, qw, bias), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scheme", ["int8", "int4-g32"])
def test_large_tiny_and_inf_activations(scheme):
    """x is scaled by 2^-24 (int4: 2^-24 at most) inside, the weights carry the power of 2:
    large rows must not overflow, and int8 rows with an inf give what the reference gives (int4
    folds min * sum(x) in after the products: inf - inf there, as before this kernel)."""
    qw, g = _quantized(48, 96, seed=3, scheme=scheme)
    x = torch.randn(5, 96, generator=g)
    x[1] *= 1e30
    x[2] *= 1e-30
    with cpu_quant.isa_capped("avx2"):
        got = cpu_quant.quant_linear(x, qw)
        x[4, 7] = float("inf")
        with_inf = cpu_quant.quant_linear(x, qw)
    want = quant_linear(x, qw)
    row_error = (got[:4] - want[:4]).abs().amax(dim=1) / want[:4].abs().amax(dim=1)
    assert torch.isfinite(got[:4]).all() and (row_error < 1e-5).all(), row_error
    if scheme == "int8":
        torch.testing.assert_close(with_inf[4], want[4], rtol=1e-5, atol=1e-5, equal_nan=True)
