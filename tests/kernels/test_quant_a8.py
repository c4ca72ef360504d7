"""The -a8 schemes (int4 weights, x rounded to int8 per 32 columns): the rounding itself, the
integer AVX2 and VNNI kernels (kernels/csrc/quant_a8_cpu.c) and the portable loop against the
reference (the dequantized weight times the rounded x), rows independent of their batch,
inf/NaN rows, and the torch path of the linear dispatch."""

import pytest
import torch

from graft.kernels import cpu_ops, cpu_quant, linear_dispatch
from graft.kernels.quant_formats import (QuantScheme, QuantSchemeError, quant_linear, quantize,
                                         round_activations)
from graft.serving.models.quant_config import QuantConfig

needs_c = pytest.mark.skipif(not cpu_ops.available(), reason=str(cpu_ops.unavailable_reason()))
needs_avx2 = pytest.mark.skipif(
    not (cpu_ops.available() and cpu_quant.ISA_NAMES.index(cpu_quant.isa()) >= cpu_quant.ISA_NAMES.index("avx2")),
    reason="needs the C kernels on a CPU with AVX2 + FMA")


def test_scheme_names():
    assert QuantScheme.parse("int4-a8") == QuantScheme("int4", 32, True)
    assert QuantScheme.parse("INT4-G64-A8").name == "int4-g64-a8"
    assert QuantScheme.parse("int4-g64").act8 is False
    assert QuantConfig.parse("int4-g128-a8").default == QuantScheme("int4", 128, True)
    for bad in ("int8-a8", "bf16-a8", "int4-g16-a8", "int4-a4"):
        with pytest.raises(QuantSchemeError, match="int4-g32-a8"):
            QuantScheme.parse(bad)
    with pytest.raises(QuantSchemeError, match=r"\(int4-g32-a8, int4-g64-a8\)"):
        QuantScheme.parse("int4-g128-a8").check_shape(8, 576, "layer")


def test_rounding_is_int8_per_block_of_32():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 96, generator=g) * torch.tensor([1e-3, 1.0, 1e3])[:, None]
    x[2, 32:64] = 0.0
    got = round_activations(x)
    blocks, want = x.reshape(3, 3, 32), got.reshape(3, 3, 32)
    d = blocks.abs().amax(-1, keepdim=True) / 127.0
    q = want / torch.where(d > 0, d, torch.ones_like(d))
    assert (q - q.round()).abs().max() < 1e-4 and q.round().abs().max() == 127  # max: +-127 d
    assert torch.equal(want[2, 1], torch.zeros(32))
    assert ((want - blocks).abs() <= d / 2 * (1 + 1e-6)).all()  # to nearest
    tiny = torch.full((1, 32), 1e-40)  # d subnormal: 1 / d would overflow
    assert torch.equal(round_activations(tiny), torch.zeros(1, 32))
    with pytest.raises(QuantSchemeError, match="multiple of 32"):
        round_activations(torch.ones(2, 40))


def test_inf_or_nan_blocks_round_to_nan():
    x = torch.ones(2, 64)
    x[0, 3], x[1, 40] = float("inf"), float("nan")
    got = round_activations(x)
    assert torch.isnan(got[0, :32]).all() and torch.equal(got[0, 32:], torch.ones(32))
    assert torch.isnan(got[1, 32:]).all() and torch.equal(got[1, :32], torch.ones(32))


def _case(n, k, group, seed):
    g = torch.Generator().manual_seed(seed)
    qw = quantize(torch.randn(n, k, generator=g) * 0.05, QuantScheme("int4", group, True))
    return qw, torch.randn(11, k, generator=g) * 3, torch.randn(n, generator=g)


def _exact(x, qw, bias):
    """The reference's numbers in float64: no fp32 summation in the way."""
    return round_activations(x).double() @ qw.dequantize().double().T + bias.double()


@needs_avx2
@pytest.mark.parametrize("n,k,group", [(40, 96, 32), (17, 512, 64), (64, 256, 128), (96, 1536, 32),
                                       (33, 64, 32)])
def test_the_avx2_kernel_is_the_reference_and_rows_do_not_depend_on_the_batch(n, k, group):
    qw, x, bias = _case(n, k, group, seed=n + k)
    with cpu_quant.isa_capped("avx2"):
        together = cpu_quant.quant_linear(x, qw, bias)  # tiles of 4, 4, then 3 rows
        alone = torch.cat([cpu_quant.quant_linear(x[i:i + 1], qw, bias) for i in range(11)])
        pairs = torch.cat([cpu_quant.quant_linear(x[i:i + 2], qw, bias) for i in range(0, 11, 2)])
    assert torch.equal(together, alone) and torch.equal(together, pairs)
    want = _exact(x, qw, bias)
    assert ((together.double() - want).abs().max() / want.abs().max()) < 1e-5
    torch.testing.assert_close(together, quant_linear(x, qw, bias), rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not cpu_ops.available() or cpu_quant.isa() not in ("avx512-vnni", "avx512-amx"),
                    reason="needs the C kernels on a CPU with AVX-512 VNNI")
@pytest.mark.parametrize("n,k,group", [(40, 96, 32), (17, 512, 64), (64, 256, 128), (96, 1536, 32)])
def test_the_vnni_path_gives_the_avx2_paths_bits(n, k, group):
    """vpdpbusd sums in int32 what vpmaddubsw sums in int16 then int32: the same integers, then
    the same fp32 steps per block and lane, so the two paths agree bit for bit."""
    qw, x, bias = _case(n, k, group, seed=3 * n + k)
    vnni = cpu_quant.quant_linear(x, qw, bias)
    alone = torch.cat([cpu_quant.quant_linear(x[i:i + 1], qw, bias) for i in range(11)])
    with cpu_quant.isa_capped("avx512"):  # int8/int4 on AVX2 below VNNI
        avx2 = cpu_quant.quant_linear(x, qw, bias)
    assert torch.equal(vnni, avx2) and torch.equal(vnni, alone)


@needs_c
@pytest.mark.parametrize("n,k,group", [(40, 96, 32), (17, 512, 64), (64, 256, 128)])
def test_the_portable_loop_is_the_reference(n, k, group):
    qw, x, bias = _case(n, k, group, seed=7 * n + k)
    got = cpu_quant.quant_linear(x, qw, bias, portable=True)
    want = _exact(x, qw, bias)
    assert ((got.double() - want).abs().max() / want.abs().max()) < 1e-5
    with cpu_quant.isa_capped("portable"):  # the dispatcher's level 0 takes the same loop
        assert torch.equal(cpu_quant.quant_linear(x, qw, bias), got)


@needs_c
@pytest.mark.parametrize("isa", ["avx2", "portable"])
def test_a_row_with_inf_or_nan_is_nan_and_leaves_the_others_alone(isa):
    if isa == "avx2" and cpu_quant.ISA_NAMES.index(cpu_quant.isa()) < cpu_quant.ISA_NAMES.index("avx2"):
        pytest.skip("no AVX2 here")
    qw, x, bias = _case(48, 128, 32, seed=3)
    x = x[:6].clone()
    x[1] *= 1e30  # large and tiny rows round like any other
    x[2] *= 1e-30
    x[3, 7], x[4, 100] = float("inf"), float("nan")
    with cpu_quant.isa_capped(isa):
        got = cpu_quant.quant_linear(x, qw, bias)
    assert torch.isnan(got[3]).all() and torch.isnan(got[4]).all()
    assert torch.isnan(quant_linear(x, qw, bias)[3:5]).all()  # as the reference has it
    keep = [0, 1, 2, 5]
    want = _exact(x[keep], qw, bias)
    err = (got[keep].double() - want).abs().amax(1) / want.abs().amax(1)
    assert torch.isfinite(got[keep]).all() and (err < 1e-5).all(), err


def test_the_torch_path_rounds_too():
    qw, x, bias = _case(24, 64, 32, seed=5)
    torch.testing.assert_close(linear_dispatch.torch_linear(x, qw, bias), quant_linear(x, qw, bias))
    unrounded = torch.nn.functional.linear(x, qw.dequantize(), bias)
    assert not torch.allclose(linear_dispatch.torch_linear(x, qw, bias), unrounded, rtol=1e-4, atol=1e-4)
