"""CPU kernels written in C (kernels/csrc): paged decode attention, where composing torch ops
costs several extra passes over the KV cache, and the small per-token ops of a layer (fp32
or bf16 RMSNorm with the residual add, rotary, KV store, silu(gate) * up), where a chain of
torch ops costs more in dispatch than in arithmetic at decode batch sizes. Built once per
machine with the system C compiler (gcc or cc, about a second), cached, and called through
ctypes (which releases the GIL).

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

from graft.kernels.c_signatures import SIGNATURES, bind, check_signatures
from graft.kernels.checks import (check_kv_scales, check_paged_attention_args, check_prefill_args,
                                  check_prefill_chunks, check_rotary_args, check_store_kv_args,
                                  slot_out_of_range)

SOURCES = tuple(Path(__file__).resolve().parent / "csrc" / name
                for name in ("paged_decode_cpu.c", "paged_prefill_cpu.c", "paged_prefill_amx.c",
                             "norm_rope_cpu.c", "quant_linear_cpu.c", "quant_vnni_cpu.c", "quant_amx_cpu.c",
                             "quant_bf16dot_cpu.c", "quant_avx2_cpu.c", "quant_avx2_int_cpu.c",
                             "quant_a8_cpu.c", "quant_int8g_cpu.c", "decode_step_cpu.c", "moe_cpu.c",
                             "argmax_cpu.c"))
HEADERS = tuple(Path(__file__).resolve().parent / "csrc" / name  # part of the build key
                for name in ("fast_exp.h", "bf16.h", "vec16.h", "quant_epilogue.h",
                             "quant_group_sums.h", "decode_types.h", "paged_common.h",
                             "paged_decode_fast.h", "vnni_dot.h", "avx2_store.h", "amx_tiles.h"))
# -march=native: the library is built on the machine that runs it (the cache key names the CPU).
# GRAFT_CPU_MARCH=x86-64-v3 (say) builds what a CPU without AVX-512 would, to test it here.
CFLAGS = ("-O3", f"-march={os.environ.get('GRAFT_CPU_MARCH', '').strip() or 'native'}", "-fopenmp",
          "-std=gnu11", "-shared", "-fPIC")
_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_CACHE_DTYPES = {torch.bfloat16: 1, torch.int8: 3}  # caches the C decode reads under fp32 q
# quant_linear_cpu.c graft_quant_isa levels
ISA_NAMES = ("portable", "avx2", "avx512", "avx512-vnni", "avx512-amx")


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
    """Compile SOURCES into the cache (once per source, flags, compiler, CPU and Python
    declaration of the C functions); return the .so. A declaration that disagrees with the C
    raises SignatureMismatch naming the function, before anything is compiled."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256()
    for part in [*(p.read_bytes() for p in SOURCES + HEADERS), " ".join(CFLAGS).encode(), version.encode(),
                 _cpu_model().encode(), platform.machine().encode(), repr(SIGNATURES).encode()]:
        key.update(part)
    target = cache_dir() / f"graft_cpu_kernels-{key.hexdigest()[:16]}.so"
    if target.is_file():
        return target
    check_signatures(SOURCES + HEADERS)
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
    bind(lib)  # restype/argtypes from kernels/c_signatures.py, checked against the C at build
    cap = os.environ.get("GRAFT_CPU_ISA", "").strip()
    if cap:  # run the fallback paths of a CPU with fewer instructions than this one
        if cap not in ISA_NAMES:
            raise ValueError(f"GRAFT_CPU_ISA={cap!r}: use one of {', '.join(ISA_NAMES)}, or unset it")
        lib.graft_quant_cap_isa(ISA_NAMES.index(cap))
    return lib, None


def available() -> bool:
    return _load()[0] is not None


def unavailable_reason() -> str | None:
    return _load()[1]


def _lib():
    lib, reason = _load()
    if lib is None:
        raise RuntimeError(f"the C CPU kernels are unavailable: {reason}")
    return lib


def _cache_ok(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """The cache dtypes the C decode reads beside q's: q's own, or bf16 / int8 under fp32 q."""
    return k_cache.dtype == q.dtype or (q.dtype == torch.float32 and k_cache.dtype in _CACHE_DTYPES)


def supports_decode(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether paged_attention_decode below can take these tensors (else use the reference)."""
    return (q.device.type == "cpu" and k_cache.device.type == "cpu" and q.dtype in _DTYPES
            and _cache_ok(q, k_cache) and k_cache.is_contiguous() and available())


def supports_prefill(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether paged_attention_prefill below can take these tensors: as decode, with a head
    size that is a multiple of 4 up to 1024, in a GCC build (else use the reference)."""
    return (supports_decode(q, k_cache) and q.shape[-1] % 4 == 0 and q.shape[-1] <= 1024
            and bool(_lib().graft_paged_prefill_built()))


def _paged_operands(op: str, q, k_cache, v_cache, block_tables, k_scale, v_scale):
    """The checked, contiguous operands of a C paged attention call:
    (lib, q, tables, k_scale, v_scale, cache code)."""
    check_kv_scales(op, k_cache, k_scale, v_scale)
    lib = _lib()
    if not (q.dtype in _DTYPES and k_cache.dtype == v_cache.dtype and _cache_ok(q, k_cache)):
        raise ValueError(f"{op} (C): q must be float32/bfloat16/float16 and the "
                         f"caches q's dtype (or bf16/int8 under fp32 q), got {q.dtype}, "
                         f"{k_cache.dtype}, {v_cache.dtype}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError(f"{op} (C): k_cache and v_cache must be contiguous")
    if k_scale is not None:
        k_scale, v_scale = k_scale.contiguous(), v_scale.contiguous()
    return (lib, q.contiguous(), block_tables.to(torch.int32).contiguous(), k_scale, v_scale,
            _CACHE_DTYPES.get(k_cache.dtype, _DTYPES.get(k_cache.dtype)))


def _ptr(t: torch.Tensor | None):
    return None if t is None else t.data_ptr()


def _bad_table(bad: int, num_blocks: int, lens: torch.Tensor) -> ValueError:
    return ValueError(f"paged attention: block_tables row {bad - 1} holds block ids outside "
                      f"[0, {num_blocks}) (or too few columns) within context_lens[{bad - 1}]="
                      f"{int(lens[bad - 1])}; fix the block table")


def paged_attention_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           scale: float, k_scale: torch.Tensor | None = None,
                           v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as graft.kernels.reference.paged_attention_decode (CPU, contiguous caches
    of q's dtype, or bf16 / int8 + scales under fp32 q)."""
    check_paged_attention_args(q, k_cache, v_cache, block_tables, context_lens, "context_lens")
    lib, q, tables, k_scale, v_scale, cache_code = _paged_operands(
        "paged_attention_decode", q, k_cache, v_cache, block_tables, k_scale, v_scale)
    lens = context_lens.to(torch.int32).contiguous()
    out = torch.empty_like(q)
    num_seqs, num_q_heads, head_dim = q.shape
    if num_seqs == 0:
        return out
    num_blocks, block_size, num_kv_heads, _ = k_cache.shape
    bad = lib.graft_paged_decode(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(), lens.data_ptr(),
        out.data_ptr(), num_seqs, num_q_heads, num_kv_heads, head_dim, block_size,
        tables.shape[1], num_blocks, float(scale), _ptr(k_scale), _ptr(v_scale), _DTYPES[q.dtype],
        cache_code, torch.get_num_threads())
    if bad < 0:
        raise MemoryError(f"paged_attention_decode (C): no memory for the scratch buffers "
                          f"({num_q_heads} heads x {int(lens.max())} tokens per thread)")
    if bad:
        raise _bad_table(bad, num_blocks, lens)
    return out


def paged_attention_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, cu_seqlens_q: torch.Tensor,
                            context_lens: torch.Tensor, scale: float,
                            k_scale: torch.Tensor | None = None,
                            v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as graft.kernels.reference.paged_attention_prefill (CPU, the caches
    paged_attention_decode takes, head_dim a multiple of 4 up to 1024)."""
    check_prefill_args(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens)
    lib, q, tables, k_scale, v_scale, cache_code = _paged_operands(
        "paged_attention_prefill", q, k_cache, v_cache, block_tables, k_scale, v_scale)
    cu = cu_seqlens_q.to(torch.int32).contiguous()
    lens = context_lens.to(torch.int32).contiguous()
    check_prefill_chunks(cu, lens, q.shape[0])
    out = torch.empty_like(q)
    lo, hi = int(cu[0]), int(cu[-1])
    out[:lo].zero_()  # rows of no sequence are zeros (as in the reference); the kernel writes
    out[hi:].zero_()  # every other row
    num_blocks, block_size, num_kv_heads, _ = k_cache.shape
    num_seqs, (_, num_q_heads, head_dim) = lens.shape[0], q.shape
    if hi == lo:
        return out
    bad = lib.graft_paged_prefill(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(), cu.data_ptr(),
        lens.data_ptr(), out.data_ptr(), num_seqs, num_q_heads, num_kv_heads, head_dim,
        block_size, tables.shape[1], num_blocks, float(scale), _ptr(k_scale), _ptr(v_scale),
        _DTYPES[q.dtype], cache_code, torch.get_num_threads())
    if bad == -2:
        raise RuntimeError("paged_attention_prefill (C): this build of the CPU kernels has no "
                           "prefill kernel (built by a compiler other than GCC)")
    if bad < 0:
        raise MemoryError("paged_attention_prefill (C): no memory for the scratch buffers")
    if bad:
        raise _bad_table(bad, num_blocks, lens)
    return out


# ---- per-token ops (fp32 or bf16) -----------------------------------------------------------
_ROW_DTYPES = {torch.float32: 0, torch.bfloat16: 1}  # what norm_rope_cpu.c takes (_DTYPES codes)


def _rows_ok(t: torch.Tensor) -> bool:
    """A 2-D or 3-D fp32/bf16 CPU tensor whose rows (dim 0) may be strided but are contiguous
    inside. Checked twice per op call (dispatch, then the op), ~120 ops per batch-1 decode
    step: is_cpu and one stride() tuple are cheaper than device.type and stride(i) calls."""
    if not t.is_cpu or t.dtype not in _ROW_DTYPES or t.requires_grad:
        return False
    shape, stride = t.shape, t.stride()
    if len(shape) == 2:
        return stride[1] == 1 or shape[1] == 1
    return len(shape) == 3 and (stride[2] == 1 or shape[2] == 1) and (stride[1] == shape[2] or shape[1] == 1)


def _operand_ok(t: torch.Tensor) -> bool:
    """A weight, cos/sin table or cache the C ops can read (made contiguous where needed)."""
    return t.device.type == "cpu" and t.dtype in _ROW_DTYPES


def supports_rows(*tensors: torch.Tensor | None) -> bool:
    """Whether rms_norm / apply_rotary / store_kv / silu_mul below take these tensors (CPU rows
    of one dtype, fp32 or bf16, no autograd) and the library is built; else
    graft.kernels.dispatch uses the reference. Row strides go to C as they are (a single
    row's is never used, so any works)."""
    given = [t for t in tensors if t is not None]
    return all(map(_rows_ok, given)) and len({t.dtype for t in given}) <= 1 and available()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """Same contract and bits as graft.kernels.reference.rms_norm, for fp32/bf16 [T, D] CPU rows
    (weight fp32 or bf16), and [T, H, D] heads without a residual (Qwen3's q/k norms)."""
    from graft.kernels import reference

    if x.dim() == 3 and residual is None and weight.shape == x.shape[-1:]:
        # the heads are the rows; q/k views of the fused qkv whose tokens are not H * D apart
        # (T > 1) are copied into [T * H, D] first: one copy against the reference's op chain
        return rms_norm(x.reshape(-1, x.shape[-1]), weight, eps).view(x.shape)
    if (x.dim() != 2 or weight.shape != x.shape[-1:] or (residual is not None and residual.shape != x.shape)
            or not supports_rows(x, residual) or not _operand_ok(weight)):
        return reference.rms_norm(x, weight, eps, residual)  # the reference names the bad shape
    rows, d = x.shape
    out = torch.empty((rows, d), dtype=x.dtype)
    total = torch.empty((rows, d), dtype=x.dtype) if residual is not None else None
    if rows:
        _lib().graft_rms_norm(
            x.data_ptr(), x.stride(0), None if residual is None else residual.data_ptr(),
            0 if residual is None else residual.stride(0), weight.contiguous().data_ptr(),
            out.data_ptr(), None if total is None else total.data_ptr(), rows, d, float(eps),
            _ROW_DTYPES[x.dtype], _ROW_DTYPES[weight.dtype], torch.get_num_threads())
    return out if residual is None else (out, total)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 interleaved: bool = False) -> torch.Tensor:
    """Same contract and bits as graft.kernels.reference.apply_rotary, for fp32/bf16 x [T, H, D]
    and fp32/bf16 cos/sin (one dtype)."""
    from graft.kernels import reference

    rot = check_rotary_args(x, cos, sin)
    if not (supports_rows(x) and _operand_ok(cos) and sin.dtype == cos.dtype and sin.device == cos.device):
        return reference.apply_rotary(x, cos, sin, interleaved)
    tokens, heads, d = x.shape
    out = torch.empty((tokens, heads, d), dtype=x.dtype)
    if tokens:
        _lib().graft_rotary(x.data_ptr(), x.stride(0), cos.contiguous().data_ptr(),
                            sin.contiguous().data_ptr(), out.data_ptr(), tokens, heads, d, rot,
                            int(bool(interleaved)), _ROW_DTYPES[x.dtype], _ROW_DTYPES[cos.dtype],
                            torch.get_num_threads())
    return out


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, k_scale: torch.Tensor | None = None,
             v_scale: torch.Tensor | None = None) -> None:
    """Same contract as graft.kernels.reference.store_kv, for fp32/bf16 rows and caches (rows
    are converted to the caches' dtype, rounding to nearest even like .to()); fp32 rows into
    an int8 cache are quantized with its scales exactly as the reference does."""
    from graft.kernels import reference

    check_store_kv_args(k, v, k_cache, v_cache, slot_mapping)
    if k_cache.dtype == torch.int8 or k_scale is not None:
        check_kv_scales("store_kv", k_cache, k_scale, v_scale)
        if not (supports_rows(k, v) and k.dtype == torch.float32 and k_cache.device.type == "cpu"
                and all(t.is_contiguous() for t in (k_cache, v_cache, k_scale, v_scale))):
            return reference.store_kv(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
        return _store_i8(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    if not (supports_rows(k, v) and _operand_ok(k_cache) and k_cache.dtype == v_cache.dtype
            and k_cache.is_contiguous() and v_cache.is_contiguous() and v_cache.device.type == "cpu"):
        return reference.store_kv(k, v, k_cache, v_cache, slot_mapping)
    slots = slot_mapping.to(torch.int64).contiguous()
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    width = k_cache.shape[2] * k_cache.shape[3]
    bad = _lib().graft_store_kv(k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0),
                                k_cache.data_ptr(), v_cache.data_ptr(), slots.data_ptr(),
                                k.shape[0], width, num_slots, _ROW_DTYPES[k.dtype],
                                _ROW_DTYPES[k_cache.dtype])
    if bad:
        raise slot_out_of_range(int(slots[bad - 1]), num_slots)


def _store_i8(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale) -> None:
    slots = slot_mapping.to(torch.int64).contiguous()
    num_slots, heads, d = k_cache.shape[0] * k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    bad = _lib().graft_store_kv_i8(k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0),
                                   k_cache.data_ptr(), v_cache.data_ptr(), k_scale.data_ptr(),
                                   v_scale.data_ptr(), slots.data_ptr(), k.shape[0], heads, d,
                                   num_slots)
    if bad:
        raise slot_out_of_range(int(slots[bad - 1]), num_slots)


def silu_mul(gate_up: torch.Tensor, intermediate: int) -> torch.Tensor:
    """Same contract as graft.kernels.reference.silu_mul, for fp32/bf16 [T, 2 * intermediate]
    rows (within a few fp32 ulp, or 1 bf16 ulp, of torch's silu: another exp)."""
    from graft.kernels import reference

    if not (supports_rows(gate_up) and gate_up.dim() == 2 and gate_up.shape[1] == 2 * intermediate):
        return reference.silu_mul(gate_up, intermediate)
    rows = gate_up.shape[0]
    out = torch.empty((rows, intermediate), dtype=gate_up.dtype)
    if rows:
        _lib().graft_silu_mul(gate_up.data_ptr(), gate_up.stride(0), out.data_ptr(), rows,
                              intermediate, _ROW_DTYPES[gate_up.dtype], torch.get_num_threads())
    return out


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """torch.argmax(logits, dim=-1) for fp32 CPU rows [B, V] (contiguous inside a row), int64
    [B]: the first index of each row's largest value, a NaN counting as the largest."""
    if not (logits.dim() == 2 and logits.dtype == torch.float32 and logits.is_cpu
            and logits.shape[1] > 0 and (logits.stride(1) == 1 or logits.shape[1] == 1)
            and not logits.requires_grad and available()):
        return logits.argmax(dim=-1)
    out = torch.empty(logits.shape[0], dtype=torch.int64)
    if logits.shape[0]:
        _lib().graft_argmax_rows(logits.data_ptr(), logits.stride(0), logits.shape[0],
                                 logits.shape[1], out.data_ptr(), torch.get_num_threads())
    return out
