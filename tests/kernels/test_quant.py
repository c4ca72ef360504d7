"""Weight formats (graft.kernels.quant_formats) and the C weight-only linears (graft.kernels.cpu_quant):
quantize/dequantize round trips, and the C vector and portable paths against the
dequantize-then-matmul reference on ragged shapes, every scheme, 1 and 2 threads."""

import pytest
import torch

from graft.kernels import cpu_ops, cpu_quant
from graft.kernels.quant_formats import (QuantScheme, QuantSchemeError, quant_linear, quantize,
                                 unpack_int4)

needs_c = pytest.mark.skipif(not cpu_ops.available(), reason=str(cpu_ops.unavailable_reason()))
SCHEMES = ["fp32", "bf16", "int8", "int8-g16", "int8-g32", "int4-g32", "int4-g64", "int4-g128"]
# the quantized-linear paths this machine can run: its own and the fallbacks below it
PATHS = (cpu_quant.ISA_NAMES[:cpu_quant.ISA_NAMES.index(cpu_quant.isa()) + 1]
         if cpu_ops.available() else ())


def _weight(n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) * 0.05


def test_scheme_parsing_and_errors():
    assert QuantScheme.parse("int4") == QuantScheme("int4", 32)
    assert QuantScheme.parse(" INT4-g128 ").group_size == 128
    assert QuantScheme.parse("bf16").name == "bf16"
    for bad in ("int3", "int4-g48", "fp8", ""):
        with pytest.raises(QuantSchemeError, match="valid: fp32, bf16, int8, int8-g16, int8-g32, int4"):
            QuantScheme.parse(bad, where="quantization")
    with pytest.raises(QuantSchemeError, match="group size 64 does not divide .* 96; .*int4-g32"):
        QuantScheme.parse("int4-g64").check_shape(8, 96, "layers.0.mlp.down_proj")
    assert QuantScheme.parse("INT8-G16") == QuantScheme("int8", 16) and QuantScheme("int8", 32).name == "int8-g32"
    assert QuantScheme.parse("int8").group_size == 0
    with pytest.raises(QuantSchemeError, match="int8 group size 32 does not divide .* 40; use int8 "):
        QuantScheme.parse("int8-g32").check_shape(8, 40, "layers.0.mlp.down_proj")
    with pytest.raises(QuantSchemeError, match="valid: "):
        QuantScheme.parse("int8-g64")


@pytest.mark.parametrize("scheme", SCHEMES)
def test_quantize_round_trip_error_is_bounded(scheme):
    w = _weight(48, 256)
    qw = quantize(w, QuantScheme.parse(scheme))
    err = (qw.dequantize() - w).abs()
    s = qw.scheme
    if s.kind == "int8":  # half a step of each row's (or group's) scale
        step = qw.scales[:, None] if not s.group_size else qw.scales.repeat_interleave(s.group_size, dim=1)
        assert (err <= step / 2 + 1e-7).all() and qw.scales.dtype == torch.float32
    elif s.kind == "int4":  # half a step of each group's scale (plus the fp16 min's rounding)
        step = qw.scales.float().repeat_interleave(s.group_size, dim=1)
        assert (err <= step / 2 + 1e-3 * w.abs().amax() + 1e-6).all() and err.mean() < step.mean() / 3
        q = unpack_int4(qw.qweight)
        assert q.max() <= 15 and qw.mins.dtype == torch.float16
    elif s.kind == "bf16":
        assert torch.equal(qw.dequantize(), w.to(torch.bfloat16).float())
    else:
        assert torch.equal(qw.dequantize(), w)
    assert qw.shape == (48, 256)
    assert qw.nbytes() <= w.numel() * 4


def test_zero_rows_and_exact_zeros_survive():
    w = _weight(32, 64)
    w[3] = 0.0
    w[5, :32] = 0.0
    for scheme in ("int8", "int4"):
        deq = quantize(w, QuantScheme.parse(scheme)).dequantize()
        assert torch.equal(deq[3], torch.zeros(64))
        assert torch.equal(deq[5, :32], torch.zeros(32))  # a constant group is its min


def test_int4_takes_a_q4_1_grid_back_exactly():
    """Weights already of the form q * d + m per group of 32 (fp16 d and m, as in a Q4_1 GGUF
    dequantized to fp32, like the quickstart's SmolLM2) quantize without loss."""
    g = torch.Generator().manual_seed(3)
    q = torch.randint(0, 16, (48, 128), generator=g).float()
    q[:, ::32] = 0.0
    q[:, 1::32] = 15.0  # every group spans the full range, as a Q4_1 block's min and max do
    d = (torch.rand(48, 4, generator=g) * 0.01 + 1e-3).half().float().repeat_interleave(32, dim=1)
    m = (torch.randn(48, 4, generator=g) * 0.05).half().float().repeat_interleave(32, dim=1)
    w = q * d + m
    torch.testing.assert_close(quantize(w, QuantScheme.parse("int4")).dequantize(), w, rtol=0, atol=1e-6)


@needs_c
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("n,k", [(40, 128), (96, 256), (17, 384)])  # N not a multiple of 32
def test_c_linear_equals_reference(scheme, n, k, threads):
    qw = quantize(_weight(n, k, seed=n), QuantScheme.parse(scheme))
    bias = torch.randn(n)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for rows in (1, 2, 3, 4, 5, 6, 7, 13, 100):  # every tile height and the M chunking
            x = torch.randn(rows, k)
            want = quant_linear(x, qw, bias)
            for path in PATHS:  # this CPU's path and every fallback below it
                with cpu_quant.isa_capped(path):
                    got = cpu_quant.quant_linear(x, qw, bias)
                    no_bias = cpu_quant.quant_linear(x, qw)
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=lambda m: f"{path}: {m}")
                torch.testing.assert_close(no_bias, quant_linear(x, qw), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(cpu_quant.quant_linear(x, qw, bias, portable=True), want,
                                       rtol=1e-5, atol=1e-5)
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif("avx512" not in PATHS, reason="the widened bf16 path is AVX-512F's")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n,k", [(40, 577), (96, 256)])  # N past 32s, odd K
@pytest.mark.parametrize("m", [127, 128, 200, 301])  # below, at and past the widening rows
def test_bf16_prefill_rows_are_the_fp32_path_on_the_dequantized_weight(m, n, k, threads):
    """From 128 fp32 rows the bf16 linear widens each pair of weight blocks once and runs the
    fp32 tiles on it: bit for bit the fp32 linear of the dequantized weight; below, its own
    tiles (equal up to the order of the sums)."""
    g = torch.Generator().manual_seed(m + k)
    qw = quantize(torch.randn(n, k, generator=g) * 0.05, QuantScheme.parse("bf16"))
    fp32 = quantize(qw.dequantize(), QuantScheme.parse("fp32"))
    x, bias = torch.randn(m, k, generator=g), torch.randn(n, generator=g)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with cpu_quant.isa_capped("avx512-vnni"):  # an AMX CPU's bf16 tiles would take the rows
            got, want = cpu_quant.quant_linear(x, qw, bias), cpu_quant.quant_linear(x, fp32, bias)
    finally:
        torch.set_num_threads(before)
    if m >= 128:
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, quant_linear(x, qw, bias), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif("avx512" not in PATHS, reason="the widened int8-gG path is AVX-512F's")
@pytest.mark.parametrize("scheme", ["int8-g16", "int8-g32"])
@pytest.mark.parametrize("m", [12, 33])
def test_int8_group_rows_are_the_fp32_path_on_the_dequantized_weight(scheme, m):
    """From 12 rows an int8-gG linear widens each pair of blocks to fl(q * s) once and runs the
    fp32 tiles on it: bit for bit the fp32 linear of the dequantized weight."""
    g = torch.Generator().manual_seed(m)
    qw = quantize(torch.randn(40, 160, generator=g) * 0.05, QuantScheme.parse(scheme))
    fp32 = quantize(qw.dequantize(), QuantScheme.parse("fp32"))
    x, bias = torch.randn(m, 160, generator=g), torch.randn(40, generator=g)
    with cpu_quant.isa_capped("avx512-vnni"):
        assert torch.equal(cpu_quant.quant_linear(x, qw, bias), cpu_quant.quant_linear(x, fp32, bias))


@needs_c
def test_c_linear_takes_leading_dims_and_strided_rows():
    qw = quantize(_weight(64, 128), QuantScheme.parse("int8"))
    x = torch.randn(3, 5, 256)[..., :128]  # rows 256 floats apart
    torch.testing.assert_close(cpu_quant.quant_linear(x, qw), quant_linear(x, qw), rtol=1e-5, atol=1e-5)
    assert cpu_quant.quant_linear(torch.empty(0, 128), qw).shape == (0, 64)
    with pytest.raises(ValueError, match="x has 64 input features, the weight takes 128"):
        cpu_quant.quant_linear(torch.randn(2, 64), qw)


@needs_c
def test_bf16_activations_are_upcast_and_rounded_back():
    qw = quantize(_weight(32, 64), QuantScheme.parse("int4"))
    x = torch.randn(2, 64).to(torch.bfloat16)
    assert cpu_quant.supports(x, qw)
    out = cpu_quant.quant_linear(x, qw, torch.randn(32).to(torch.bfloat16))
    assert out.dtype == torch.bfloat16
    assert not cpu_quant.supports(x.half(), qw)  # fp16 rows: the reference
    torch.testing.assert_close(cpu_quant.quant_linear(x.half(), qw), quant_linear(x.half(), qw))


@needs_c
def test_isa_is_reported():
    assert cpu_quant.isa() in cpu_quant.ISA_NAMES


@needs_c
@pytest.mark.parametrize("n,k", [(40, 128), (67, 33), (3, 1000), (96, 576)])  # ragged pairs, K
@pytest.mark.parametrize("threads", [1, 2])
def test_fp32_weight_comes_back_from_the_c_layout_in_one_c_copy(n, k, threads):
    """The torch path of an fp32 linear rebuilds [N, K] from the pairs of 16-row blocks on each
    call (graft_quant_unpack_fp32): every element in its place."""
    w = torch.randn(n, k)
    qw = quantize(w, QuantScheme.parse("fp32"))
    cpu_quant.pack_only(qw)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = cpu_quant.unpack(qw)[0]
    finally:
        torch.set_num_threads(before)
    assert got.shape == (n, k) and got.is_contiguous() and torch.equal(got, w)


@needs_c
@pytest.mark.parametrize("scheme", SCHEMES)
def test_dropped_canonical_tensors_are_rebuilt_from_the_c_layout(scheme):
    qw = quantize(_weight(40, 128), QuantScheme.parse(scheme))
    want = [t.clone() for t in (qw.qweight, qw.scales, qw.mins) if t is not None]
    x = torch.randn(3, 128)
    before = cpu_quant.quant_linear(x, qw)
    cpu_quant.pack_only(qw)
    assert qw.tensors() == []  # one copy in memory: the C layout
    assert torch.equal(cpu_quant.quant_linear(x, qw), before)
    got = [t for t in (qw.qweight, qw.scales, qw.mins) if t is not None]  # rebuilt on use
    assert len(got) == len(want) and all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(got, want))
    assert qw.shape == (40, 128)
