"""The Triton weight-only linears (graft.kernels.triton_quant) vs graft.kernels.quant_formats.quant_linear.

On CPU under TRITON_INTERPRET=1: in this process while Triton can still be put in interpreter
mode (or already is), else in a fresh process, as test_triton_interpret.py does for the other
kernels. TRITON_INTERPRET=0 runs the same cases, and the CUDA-only ones, on a GPU.
"""

import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from graft.kernels import quant_formats as quant  # noqa: E402

# Triton decides interpreter or compiled when kernels are defined, from TRITON_INTERPRET
IN_PROCESS = (os.environ.get("TRITON_INTERPRET") == "0" or "triton" not in sys.modules
              or bool(sys.modules["triton"].knobs.runtime.interpret))
if IN_PROCESS:
    os.environ.setdefault("TRITON_INTERPRET", "1")

SCHEMES = ["int8", "int8-g16", "int8-g32", "int4-g32", "int4-g64", "int4-g128", "bf16", "int4-g32-a8"]
N = 40  # not a multiple of any block_n


@pytest.fixture(scope="module")
def tq():
    if not IN_PROCESS:
        pytest.skip("triton was imported before interpreter mode could be set: "
                    "test_cases_in_fresh_interpreter_process runs these")
    mod = importlib.import_module("graft.kernels.triton_quant")
    if not mod.INTERPRET and not torch.cuda.is_available():
        pytest.skip("graft.kernels.triton_quant was imported without TRITON_INTERPRET=1 and there is no GPU")
    return mod


@pytest.fixture(scope="module")
def device(tq):
    return torch.device("cpu" if tq.INTERPRET else "cuda")


def test_cases_in_fresh_interpreter_process():
    if IN_PROCESS:
        pytest.skip("the cases run in this process")
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__,
                           "-k", "not compile_for_sm90"],  # that one runs here
                          env=env, capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_kernels_compile_for_sm90():
    # the interpreter accepts code the GPU compiler rejects: build the default launches for real
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = ("from graft.kernels import compile_check, triton_quant\n"
            "for dt in ('bf16', 'fp32'):\n"
            "    for name, fn, pointers, floats, consts in triton_quant.compile_specs(dt):\n"
            "        compile_check._compile(fn, pointers, floats, consts, 90)\n"
            "        print('ok', name, dt)\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.count("ok ") == 14, proc.stdout + proc.stderr[-3000:]


def _weight(scheme: str, device, n: int = N, groups: int = 3, k: int = 200) -> quant.QuantizedWeight:
    """A quantized random weight on `device`: int4 and int8-gG K = `groups` groups (odd by
    default), else K = k (200: not a multiple of any block_k)."""
    sc = quant.QuantScheme.parse(scheme)
    k = groups * sc.group_size if sc.group_size else k
    gen = torch.Generator().manual_seed(n + k)
    w = quant.quantize(torch.randn(n, k, generator=gen) * 0.1, sc)
    return quant.QuantizedWeight(w.scheme, *(t.to(device) for t in w.tensors()))


def _check(got, x, weight, bias=None):
    expect = quant.quant_linear(x, weight, bias)
    assert got.dtype == x.dtype and got.shape == expect.shape
    tol = dict(atol=1e-4, rtol=1e-4) if x.dtype == torch.float32 else dict(atol=1e-3, rtol=1.6e-2)
    torch.testing.assert_close(got, expect, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("m", [1, 3, 17, 64])  # GEMV (1, 3) and GEMM (17, 64) rows
@pytest.mark.parametrize("scheme", SCHEMES)
def test_matches_reference(tq, device, scheme, m, dtype):
    weight = _weight(scheme, device)
    x = torch.randn(m, weight.shape[1], device=device).to(dtype)
    bias = torch.randn(N, device=device) if m in (1, 17) else None  # bias on each path, not each case
    _check(tq.quant_linear(x, weight, bias), x, weight, bias)


@pytest.mark.parametrize("scheme", ["int8", "int8-g32", "int4-g32", "int4-g128"])
@pytest.mark.parametrize("m,tuning", [(1, dict(split_k=3, block_n=16, block_k=32)),  # 3 uneven splits
                                      (2, dict(split_k=4)),
                                      (3, dict(split_k=2, block_k=32)),
                                      (20, dict(split_k=2, block_m=16, block_n=16, block_k=32))])
def test_split_k_and_small_tiles(tq, device, scheme, m, tuning):
    weight = _weight(scheme, device, groups=5 if scheme == "int4-g32" else 3)
    x = torch.randn(m, weight.shape[1], device=device)
    bias = torch.randn(N, device=device)
    assert tq.launch_config(m, N, weight.shape[1], weight.scheme, x.dtype, device, **tuning)["split_k"] > 1
    _check(tq.quant_linear(x, weight, bias, **tuning), x, weight, bias)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_leading_dims_strided_x_and_half_bias(tq, device, dtype):
    weight = _weight("int4-g64", device)
    k = weight.shape[1]
    x = torch.randn(2, 3, 2 * k, device=device).to(dtype)[..., ::2]  # [2, 3, K], column stride 2
    bias = torch.randn(N, device=device).to(dtype)
    _check(tq.quant_linear(x, weight, bias), x, weight, bias)


def test_fp32_weights_and_cpu_weight_cached_on_device(tq, device):
    fp32 = _weight("int8", device)
    fp32 = quant.QuantizedWeight(quant.QuantScheme("fp32"), fp32.dequantize())
    x = torch.randn(5, 200, device=device)
    _check(tq.quant_linear(x, fp32), x, fp32)
    if device.type == "cuda":  # canonical tensors left on the CPU: copied once, kept in packed
        cpu = quant.quantize(torch.randn(N, 96), quant.QuantScheme.parse("int4-g32"))
        xc = torch.randn(3, 96, device=device)
        _check(tq.quant_linear(xc, cpu), xc, cpu)
        assert cpu.packed["triton"][0] == xc.device  # cuda:0, where the fixture's device is "cuda"


def test_empty_rows_and_bad_input(tq, device):
    weight = _weight("int8", device)
    assert tq.quant_linear(torch.randn(0, 200, device=device), weight).shape == (0, N)
    with pytest.raises(ValueError, match="input features"):
        tq.quant_linear(torch.randn(2, 199, device=device), weight)
    with pytest.raises(ValueError, match="bias shape"):
        tq.quant_linear(torch.randn(2, 200, device=device), weight, torch.zeros(N + 1, device=device))
    with pytest.raises(ValueError, match="float64"):
        tq.quant_linear(torch.randn(2, 200, device=device, dtype=torch.float64), weight)
    with pytest.raises(ValueError, match="unknown tuning"):
        tq.quant_linear(torch.randn(2, 200, device=device), weight, blockk=32)
    with pytest.raises(ValueError, match="must divide the int4 group"):
        g32 = _weight("int4-g32", device)
        tq.quant_linear(torch.randn(2, 96, device=device), g32, block_k=64)


def test_dispatch_runs_triton_when_forced(tq, device, monkeypatch):
    from graft import kernels

    monkeypatch.setenv("GRAFT_KERNELS", "triton")
    weight = _weight("int4-g32", device)
    x = torch.randn(3, weight.shape[1], device=device).to(torch.bfloat16)
    assert torch.equal(kernels.quant_linear(x, weight), tq.quant_linear(x, weight))


def test_bench_runs_on_tiny_shapes(tq, device, monkeypatch):
    from graft.benchmarks import kernels as bench

    monkeypatch.setattr(bench, "QUANT_GEMV_SWEEP", [dict(block_n=16, block_k=32, num_warps=4),
                                                    dict(block_n=16, block_k=64, num_warps=4)])
    monkeypatch.setattr(bench, "QUANT_GEMM_SWEEP", [dict(block_m=16, block_n=16, block_k=32, num_warps=4)])
    cfg = bench.BenchConfig(dtype="float32", quant_schemes="int8,int4-g32", quant_rows="1,17", quant_n=N,
                            quant_k=64, iters=1, sweep=True)
    rows = bench.bench_quant_linear(cfg, device)
    assert [(r["scheme"], r["rows"], len(r["sweep"])) for r in rows] == [
        ("int8", 1, 2), ("int8", 17, 1), ("int4-g32", 1, 1), ("int4-g32", 17, 1)]  # block_k 64 > group 32: skipped
    assert all(r["max_abs_diff_vs_reference"] < 1e-4 and r["gb_per_s"] > 0 and r["sweep"][0]["ms"] for r in rows)


cuda_only = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "0",
                               reason="compiled Triton on a GPU (TRITON_INTERPRET=0)")


@cuda_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_cuda_model_sized_shapes(tq, device, scheme, dtype):
    # SmolLM2-135M's MLP down projection (K = 1536), N = 576 + 8 (ragged), decode to prefill rows
    sc = quant.QuantScheme.parse(scheme)
    weight = _weight(scheme, device, n=584, groups=1536 // max(sc.group_size, 1), k=1536)
    bias = torch.randn(584, device=device)
    for m in (1, 4, 5, 64, 512):
        x = torch.randn(m, weight.shape[1], device=device).to(dtype)
        out = tq.quant_linear(x, weight, bias)
        _check(out, x, weight, bias)
        assert torch.equal(out, tq.quant_linear(x, weight, bias)), m  # deterministic, split-K included
