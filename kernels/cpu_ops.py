"""CPU kernels written in C (kernels/csrc), for ops where composing torch ops costs several
extra passes over the KV cache. Built once per machine with the system C compiler (gcc or
cc, about a second), cached, and called through ctypes (which releases the GIL).

If no compiler is found or the build fails, `available()` is False with the reason in
`unavailable_reason()`, and graft.kernels.dispatch keeps using the torch reference.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from graft.kernels.checks import check_paged_attention_args

SOURCES = (Path(__file__).resolve().parent / "csrc" / "paged_decode_cpu.c",)
# -march=native: the library is built on the machine that runs it (the cache key names the CPU)
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-std=gnu11", "-shared", "-fPIC")
_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def cache_dir() -> Path:
    """Where built libraries live: $GRAFT_KERNEL_CACHE, else ~/.cache/graft/kernels."""
    env = os.environ.get("GRAFT_KERNEL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "graft" / "kernels"


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def _cpu_model() -> str:
    """The first core's model name and feature flags: -march=native code is only valid on a
    CPU with the same flags (VMs of one model can expose different ones)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    found = {}
    for line in lines:
        key = line.split(":", 1)[0].strip()
        if key in ("model name", "flags") and key not in found:
            found[key] = line
    return "\n".join(found.values()) or platform.processor()


def _build(cc: str) -> Path:
    """Compile SOURCES into the cache (once per source, flags, compiler and CPU); return the .so."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256()
    for part in [*(p.read_bytes() for p in SOURCES), " ".join(CFLAGS).encode(), version.encode(),
                 _cpu_model().encode(), platform.machine().encode()]:
        key.update(part)
    target = cache_dir() / f"graft_cpu_kernels-{key.hexdigest()[:16]}.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
    os.close(fd)
    try:
        proc = subprocess.run([cc, *CFLAGS, *map(str, SOURCES), "-o", tmp, "-lm"],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed: {proc.stderr.strip()[-2000:]}")
        os.replace(tmp, target)  # atomic: a concurrent build or a crash never leaves a half .so
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def disabled_by_env() -> bool:
    """GRAFT_CPU_KERNELS=0: no C kernels and no oneDNN-prepacked linears."""
    return os.environ.get("GRAFT_CPU_KERNELS", "1").strip() == "0"


@functools.cache
def _load() -> tuple[ctypes.CDLL | None, str | None]:
    if disabled_by_env():
        return None, "disabled by GRAFT_CPU_KERNELS=0"
    cc = _compiler()
    if cc is None:
        return None, "no C compiler (gcc or cc) on PATH; set CC to build the CPU kernels"
    try:
        lib = ctypes.CDLL(str(_build(cc)))
    except (OSError, RuntimeError, subprocess.SubprocessError) as err:
        return None, f"building the CPU kernels failed: {err}"
    fn = lib.graft_paged_decode
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 7 + [ctypes.c_float, ctypes.c_int,
                                                                     ctypes.c_int]
    return lib, None


def available() -> bool:
    return _load()[0] is not None


def unavailable_reason() -> str | None:
    return _load()[1]


def supports_decode(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether paged_attention_decode below can take these tensors (else use the reference)."""
    return (q.device.type == "cpu" and k_cache.device.type == "cpu" and q.dtype == k_cache.dtype
            and q.dtype in _DTYPES and k_cache.is_contiguous() and available())


def paged_attention_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           scale: float) -> torch.Tensor:
    """Same contract as graft.kernels.reference.paged_attention_decode (CPU, contiguous caches)."""
    check_paged_attention_args(q, k_cache, v_cache, block_tables, context_lens, "context_lens")
    lib, reason = _load()
    if lib is None:
        raise RuntimeError(f"the C paged_attention_decode is unavailable: {reason}")
    if not (q.dtype == k_cache.dtype == v_cache.dtype and q.dtype in _DTYPES):
        raise ValueError(f"paged_attention_decode (C): q, k_cache and v_cache must share one of "
                         f"float32/bfloat16/float16, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("paged_attention_decode (C): k_cache and v_cache must be contiguous")
    q = q.contiguous()
    tables = block_tables.to(torch.int32).contiguous()
    lens = context_lens.to(torch.int32).contiguous()
    out = torch.empty_like(q)
    num_seqs, num_q_heads, head_dim = q.shape
    if num_seqs == 0:
        return out
    num_blocks, block_size, num_kv_heads, _ = k_cache.shape
    bad = lib.graft_paged_decode(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(), lens.data_ptr(),
        out.data_ptr(), num_seqs, num_q_heads, num_kv_heads, head_dim, block_size,
        tables.shape[1], num_blocks, float(scale), _DTYPES[q.dtype], torch.get_num_threads())
    if bad < 0:
        raise MemoryError(f"paged_attention_decode (C): no memory for the scratch buffers "
                          f"({num_q_heads} heads x {int(lens.max())} tokens per thread)")
    if bad:
        raise ValueError(f"paged attention: block_tables row {bad - 1} holds block ids outside "
                         f"[0, {num_blocks}) (or too few columns) within context_lens[{bad - 1}]="
                         f"{int(lens[bad - 1])}; fix the block table")
    return out
