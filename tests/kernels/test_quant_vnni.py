"""The int8/int4 C linears' integer path (kernels/csrc/quant_vnni_cpu.c): activations as 24-bit
fixed point in three signed digits. Checked against the dequantize-then-matmul reference
where that representation is at its edges: K not a multiple of 4, K past one int32
accumulation chunk, rows whose values span many orders of magnitude, zero rows, and rows
the fixed point cannot hold (inf, NaN, tiny), which must take a fallback path. Also odd
widths of the bf16 pair layout, and the capped (smaller-CPU) paths."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from graft.kernels import cpu_ops, cpu_quant
from graft.kernels.quant_formats import QuantScheme, quant_linear, quantize

needs_c = pytest.mark.skipif(not cpu_ops.available(), reason=str(cpu_ops.unavailable_reason()))


def _weight(n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) * 0.05


def _fixed_point_bound(x: torch.Tensor, qw) -> torch.Tensor:
    """|error| the fixed point may add per output: about 2^-23 of each row's largest |x| times
    the output's sum of |w| (float32 noise on top)."""
    w = qw.dequantize().abs().sum(dim=1)
    return 2.0 ** -22 * x.abs().amax(dim=1, keepdim=True) * w + 1e-6


@needs_c
@pytest.mark.parametrize("scheme", ["int8", "bf16", "fp32"])
@pytest.mark.parametrize("k", [5, 90, 577])  # int8 pads K to a multiple of 4, bf16 to even
def test_any_width_on_every_path(scheme, k):
    qw = quantize(_weight(40, k, seed=k), QuantScheme.parse(scheme))
    x = torch.randn(7, k)
    bias = torch.randn(40)
    want = quant_linear(x, qw, bias)
    for path in cpu_quant.ISA_NAMES[:cpu_quant.ISA_NAMES.index(cpu_quant.isa()) + 1]:
        with cpu_quant.isa_capped(path):
            torch.testing.assert_close(cpu_quant.quant_linear(x, qw, bias), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cpu_quant.quant_linear(x, qw, bias, portable=True), want, rtol=1e-5, atol=1e-5)


@needs_c
@pytest.mark.parametrize("scheme,m", [("int8", 3), ("int8", 12), ("int4-g64", 3), ("int4-g64", 12)])
def test_past_one_accumulation_chunk(scheme, m):
    """int8: the int32 sums are folded into fp32 per 32768 columns (so these rows stay off the
    AMX tiles, which fold once); int4 folds per group and keeps no such sums."""
    k = 40000 - 40000 % 64  # > 32768 columns
    qw = quantize(_weight(32, k, seed=3), QuantScheme.parse(scheme))
    x = torch.randn(m, k)
    got, want = cpu_quant.quant_linear(x, qw), quant_linear(x, qw)
    assert ((got - want).abs() <= _fixed_point_bound(x, qw)).all()


@needs_c
@pytest.mark.parametrize("scheme", ["int8", "int4-g32", "int4-g128"])
def test_wide_dynamic_range_stays_within_the_fixed_point_bound(scheme):
    g = torch.Generator().manual_seed(1)
    k = 256
    x = torch.randn(5, k, generator=g) * torch.logspace(-6, 3, k)[torch.randperm(k, generator=g)]
    x[2, 7] = 5e4  # one outlier sets the step of its row
    qw = quantize(_weight(64, k), QuantScheme.parse(scheme))
    exact = x.double() @ qw.dequantize().double().T
    fp32_noise = k * 2.0 ** -24 * (x.abs().double() @ qw.dequantize().abs().double().T)
    err = (cpu_quant.quant_linear(x, qw).double() - exact).abs()
    assert (err <= _fixed_point_bound(x, qw).double() + fp32_noise).all()


@needs_c
@pytest.mark.parametrize("scheme", ["int8", "int4-g32"])
def test_zero_tiny_and_non_finite_rows(scheme):
    qw = quantize(_weight(48, 64), QuantScheme.parse(scheme))
    bias = torch.randn(48)
    x = torch.randn(4, 64)
    x[1] = 0.0
    zero = cpu_quant.quant_linear(x, qw, bias)
    torch.testing.assert_close(zero[1], bias)  # a zero row gives exactly the bias
    torch.testing.assert_close(zero, quant_linear(x, qw, bias), rtol=1e-5, atol=1e-5)
    x[2] = 1e-33 * torch.randn(64)  # 1/step would overflow: the call takes a fallback path
    torch.testing.assert_close(cpu_quant.quant_linear(x, qw, bias),
                               cpu_quant.quant_linear(x, qw, bias, portable=True))
    x[3, 5] = float("inf")
    x[0, 9] = float("nan")
    got = cpu_quant.quant_linear(x, qw, bias)
    torch.testing.assert_close(got, cpu_quant.quant_linear(x, qw, bias, portable=True), equal_nan=True)
    assert got[0].isnan().all() and not got[3].isfinite().any() and got[1:3].isfinite().all()


@needs_c
@pytest.mark.parametrize("scheme", ["int8", "int4-g32"])
def test_a_nan_alone_in_its_row_gives_nan(scheme):
    """The vector max over |x| drops a NaN once a later value meets it in its lane: found apart,
    the row takes the fallback path, and comes out NaN as the reference's does (int8 rows came
    out finite before), the other rows as before."""
    qw = quantize(_weight(48, 64), QuantScheme.parse(scheme))
    x = torch.randn(3, 64)
    x[0, 3] = float("nan")  # early in the row: columns 19, 35, 51 meet it in the max
    got = cpu_quant.quant_linear(x, qw)
    assert got[0].isnan().all()
    torch.testing.assert_close(got[1:], quant_linear(x[1:], qw), rtol=1e-5, atol=1e-5)


@needs_c
@pytest.mark.skipif(bool(os.environ.get("GRAFT_CPU_MARCH", "").strip()) or bool(os.environ.get("GRAFT_CPU_ISA")),
                    reason="the build or its path is not this CPU's own (GRAFT_CPU_MARCH / GRAFT_CPU_ISA)")
def test_isa_names_the_integer_path():
    name = cpu_quant.isa()
    flags = set(Path("/proc/cpuinfo").read_text().split()) if Path("/proc/cpuinfo").exists() else set()
    if {"avx512_vnni", "avx512bw", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"} <= flags:
        assert name == "avx512-amx"  # Linux >= 5.16 grants the tile state (arch_prctl)
    elif {"avx512_vnni", "avx512bw"} <= flags:
        assert name == "avx512-vnni"
    elif "avx512f" in flags:
        assert name == "avx512"
    elif {"avx2", "fma", "f16c"} <= flags:
        assert name == "avx2"
    else:
        assert name == "portable"


@needs_c
@pytest.mark.parametrize("cap,says", [("avx512-vnni", "int8/int4 on AVX-512 VNNI"),
                                      ("avx512", "int8/int4 on AVX2 + FMA"),
                                      ("avx2", "every format on AVX2 + FMA"),
                                      ("portable", "every format on the portable loop")])
def test_a_smaller_cpu_runs_its_fallback(cap, says):
    """GRAFT_CPU_ISA lowers the path as on a CPU without AMX, VNNI, AVX-512 or AVX2: isa() and the
    description the engine logs say so, and the results are still the reference's."""
    if cpu_quant.ISA_NAMES.index(cap) > cpu_quant.ISA_NAMES.index(cpu_quant.isa()):
        pytest.skip(f"this CPU has no {cap}")
    code = (
        "import torch\n"
        "from graft.kernels import cpu_quant\n"
        "from graft.kernels.quant_formats import QuantScheme, quant_linear, quantize\n"
        "print(cpu_quant.isa())\n"
        "print(cpu_quant.isa_description())\n"
        "for s in ('int8', 'int4-g32', 'bf16', 'fp32'):\n"
        "    qw = quantize(torch.randn(40, 128) * 0.05, QuantScheme.parse(s))\n"
        "    x = torch.randn(3, 128)\n"
        "    torch.testing.assert_close(cpu_quant.quant_linear(x, qw), quant_linear(x, qw), rtol=1e-5, atol=1e-5)\n")
    env = {**os.environ, "GRAFT_CPU_ISA": cap}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    name, description = out.stdout.splitlines()[:2]
    assert name == cap and says in description
    bad = subprocess.run([sys.executable, "-c", "from graft.kernels import cpu_ops; cpu_ops.available()"],
                         env={**env, "GRAFT_CPU_ISA": "sse"}, capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "GRAFT_CPU_ISA='sse': use one of portable, avx2, avx512, avx512-vnni, avx512-amx" in bad.stderr
