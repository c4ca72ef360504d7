"""Weights on llama.cpp's Q4_0 and Q4_1 grids (a GGUF's blocks, dequantized) come back exact
through int4-g32: Q4_1 by min-max rounding, Q4_0 kept as (d, -8d) even where no code 15 is
used, with a negative scale when d < 0; every C path takes those scales."""

import numpy as np
import pytest
import torch

from graft.kernels import cpu_ops, cpu_quant
from graft.kernels.quant_formats import QuantScheme, quant_linear, quantize

gguf = pytest.importorskip("gguf")


def _on_grid(kind: str, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((48, 256)).astype(np.float32) * 0.05
    w[0] = 0.0  # an all-zero row: d = 0
    w[1, :32] = 1e-6  # a block of one value
    w[2, :32] = np.abs(w[2, :32])  # a block whose peak is positive: d < 0 under Q4_0
    qtype = gguf.GGMLQuantizationType[kind]
    return torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype).copy())


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
@pytest.mark.parametrize("scheme", ["int4-g32", "int4-g32-a8"])
def test_a_gguf_grid_comes_back_exact(kind, scheme):
    w = _on_grid(kind)
    qw = quantize(w, QuantScheme.parse(scheme))
    assert torch.equal(qw.dequantize(), w)
    if kind == "Q4_0":
        assert (qw.scales.float() < 0).any()  # the case the kernels below must take


def test_weights_off_any_grid_round_as_before():
    w = torch.randn(16, 64) * 0.05
    qw = quantize(w, QuantScheme.parse("int4-g32"))
    lo = w.reshape(16, 2, 32).amin(dim=2).half().float()
    assert torch.equal(qw.mins.float(), lo) and (qw.scales.float() > 0).all()


@pytest.mark.skipif(not cpu_ops.available(), reason=str(cpu_ops.unavailable_reason()))
@pytest.mark.parametrize("scheme", ["int4-g32", "int4-g32-a8"])
def test_every_c_path_takes_negative_scales(scheme):
    qw = quantize(_on_grid("Q4_0"), QuantScheme.parse(scheme))
    caps = cpu_quant.ISA_NAMES[:cpu_quant.ISA_NAMES.index(cpu_quant.isa()) + 1]
    for cap in caps:
        for rows in (1, 3, 16):
            x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows))
            with cpu_quant.isa_capped(cap):
                got = cpu_quant.quant_linear(x, qw)
            torch.testing.assert_close(got, quant_linear(x, qw), rtol=1e-5, atol=1e-5,
                                       msg=lambda m: f"{cap}, {rows} rows: {m}")
