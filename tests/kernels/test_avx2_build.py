"""The C kernels built as for a CPU without AVX-512 (GRAFT_CPU_MARCH=x86-64-v3), on a machine
that has it. Their AVX2-only code (the attention's 8-lane fast paths in paged_decode_fast.h
and paged_prefill_cpu.c, the 16-lane compares and stores of vec16.h, argmax's 8-lane passes)
is compiled only in such a build, so the attention (fp32, bf16 and int8 caches), row-op,
argmax and int4-a8 tests run again against one, in a fresh process. On an AVX2 machine the tests run it natively."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from graft.kernels import cpu_ops

_FLAGS = set(Path("/proc/cpuinfo").read_text().split()) if Path("/proc/cpuinfo").exists() else set()


@pytest.mark.skipif(not cpu_ops.available(), reason=str(cpu_ops.unavailable_reason()))
@pytest.mark.skipif(not {"avx512f", "avx2", "fma", "f16c"} <= _FLAGS, reason="this CPU's own build is the AVX2 one (or has no AVX2)")
@pytest.mark.skipif(bool(os.environ.get("GRAFT_CPU_MARCH", "").strip()), reason="GRAFT_CPU_MARCH already picks the build")
def test_the_avx2_build_passes_the_attention_row_op_and_argmax_tests():
    root = Path(__file__).resolve().parents[2]
    tests = [str(root / "tests" / "kernels" / name)
             for name in ("test_cpu_ops.py", "test_cpu_prefill.py", "test_cpu_row_ops.py", "test_argmax.py", "test_quant_a8.py")]
    tests.append(str(root / "tests" / "serving" / "engine" / "test_kv_cache_dtype.py")
                 + "::test_c_decode_reads_bf16_and_int8_caches_like_the_reference")
    env = dict(os.environ, GRAFT_CPU_MARCH="x86-64-v3")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                          env=env, capture_output=True, text=True, timeout=900, cwd=root)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout
