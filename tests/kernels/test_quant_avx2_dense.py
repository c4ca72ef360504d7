"""The AVX2 fp32 / bf16 linears (kernels/csrc/quant_avx2_cpu.c): tiles of up to 6 rows x one
16-lane block, every row and lane one FMA chain over the columns in order. So a row's output
does not depend on how many rows share the call (decode batches of any size give each sequence
the same numbers), and ragged K (bf16: an odd last column) and N match the reference."""

import pytest
import torch

from graft.kernels import cpu_ops, cpu_quant
from graft.kernels.quant_formats import QuantScheme, quant_linear, quantize

pytestmark = pytest.mark.skipif(
    not (cpu_ops.available() and cpu_quant.ISA_NAMES.index(cpu_quant.isa()) >= cpu_quant.ISA_NAMES.index("avx2")),
    reason="needs the C kernels on a CPU with AVX2 + FMA")


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("scheme,n,k", [("fp32", 40, 130), ("fp32", 17, 7), ("fp32", 96, 576),
                                        ("bf16", 40, 131), ("bf16", 33, 5), ("bf16", 64, 1),
                                        ("bf16", 96, 576)])
def test_rows_do_not_depend_on_the_batch(scheme, n, k, threads):
    g = torch.Generator().manual_seed(n + k)
    qw = quantize(torch.randn(n, k, generator=g) * 0.05, QuantScheme.parse(scheme))
    x, bias = torch.randn(61, k, generator=g), torch.randn(n, generator=g)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with cpu_quant.isa_capped("avx2"):
            together = cpu_quant.quant_linear(x, qw, bias)  # chunks of 48 rows, tiles of 6 and less
            alone = torch.cat([cpu_quant.quant_linear(x[i:i + 1], qw, bias) for i in range(61)])
            sixteen = torch.cat([cpu_quant.quant_linear(x[i:i + 16], qw, bias) for i in range(0, 61, 16)])
    finally:
        torch.set_num_threads(before)
    assert torch.equal(together, alone) and torch.equal(together, sixteen)
    torch.testing.assert_close(together, quant_linear(x, qw, bias), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scheme", ["fp32", "bf16"])
def test_many_pairs_with_the_next_pair_fetched_ahead(scheme):
    """Past a few pairs of blocks each pass also fetches the next pair: the outputs of a wide
    weight (the lm_head's shape, scaled down) are still every lane's own."""
    g = torch.Generator().manual_seed(7)
    qw = quantize(torch.randn(4099, 64, generator=g) * 0.05, QuantScheme.parse(scheme))
    x = torch.randn(16, 64, generator=g)
    with cpu_quant.isa_capped("avx2"):
        got = cpu_quant.quant_linear(x, qw)
    torch.testing.assert_close(got, quant_linear(x, qw), rtol=1e-5, atol=1e-5)
