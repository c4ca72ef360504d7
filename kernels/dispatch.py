"""Pick the implementation of each op: Triton on CUDA tensors; on CPU the C kernels of
graft.kernels.cpu_ops where one exists (paged decode and prefill attention; fp32/bf16 RMSNorm,
rotary, KV store, silu * up) and the PyTorch reference for the rest; the reference wherever
autograd needs a backward.

GRAFT_KERNELS=auto (default) | reference (always the reference) | triton (always Triton,
e.g. on CPU tensors under TRITON_INTERPRET=1) | cpu (the C kernels wherever they apply, an
error if they cannot be built). Read at every call so tests can switch it.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from types import ModuleType

import torch

from graft.errors import GraftConfigError
from graft.kernels import cpu_ops, cpu_quant, quant_formats, reference

_MODES = ("auto", "reference", "triton", "cpu")


@functools.cache
def triton_available() -> bool:
    # find_spec, not import: importing triton early would lock it out of interpreter mode
    return importlib.util.find_spec("triton") is not None


def _triton_ops() -> ModuleType:
    # imported lazily: Triton reads TRITON_INTERPRET when the kernels are defined
    return importlib.import_module("graft.kernels.triton_ops")


def kernels_mode() -> str:
    """GRAFT_KERNELS, validated."""
    mode = os.environ.get("GRAFT_KERNELS", "auto").strip().lower() or "auto"
    if mode not in _MODES:
        raise GraftConfigError(f"GRAFT_KERNELS={mode!r} is not one of {', '.join(_MODES)}")
    return mode


def implementation(t: torch.Tensor) -> ModuleType:
    """The module (reference or triton_ops) that runs an op whose main input is t."""
    mode = kernels_mode()
    if mode in ("reference", "cpu"):
        return reference
    if mode == "triton":
        if not triton_available():
            raise GraftConfigError("GRAFT_KERNELS=triton but triton is not importable; "
                                   "install triton or unset GRAFT_KERNELS")
        return _triton_ops()
    if t.requires_grad and torch.is_grad_enabled():
        return reference  # the Triton kernels have no backward: keep autograd working
    if t.is_cuda and triton_available():
        return _triton_ops()
    return reference


def _decode_implementation(q: torch.Tensor, k_cache: torch.Tensor) -> ModuleType:
    """Like implementation(), plus the C kernel for CPU tensors in auto and cpu modes."""
    mode = kernels_mode()
    if mode == "cpu":
        if not cpu_ops.available():
            raise GraftConfigError(f"GRAFT_KERNELS=cpu but {cpu_ops.unavailable_reason()}")
        if not cpu_ops.supports_decode(q, k_cache):
            raise GraftConfigError(f"GRAFT_KERNELS=cpu: the C paged decode takes contiguous CPU "
                                   f"tensors of one float dtype, got q {q.dtype} on {q.device}, "
                                   f"cache {k_cache.dtype} on {k_cache.device}")
        return cpu_ops
    return _c_where_it_applies(implementation(q), q, cpu_ops.supports_decode(q, k_cache))


def _c_where_it_applies(impl: ModuleType, q: torch.Tensor, supported: bool) -> ModuleType:
    """cpu_ops in place of the reference where the C kernel takes these tensors and no
    backward is needed (auto and cpu modes; GRAFT_KERNELS=cpu without a built library is an
    error)."""
    mode = kernels_mode()
    if mode == "cpu" and not cpu_ops.available():
        raise GraftConfigError(f"GRAFT_KERNELS=cpu but {cpu_ops.unavailable_reason()}")
    if (mode in ("auto", "cpu") and impl is reference and supported
            and not (q.requires_grad and torch.is_grad_enabled())):
        return cpu_ops
    return impl


def backend_name(t: torch.Tensor) -> str:
    """'triton', 'cpu' (C decode attention + reference) or 'reference': what the engine's
    decode on tensors like t would run (for logs and benchmarks)."""
    impl = _decode_implementation(t, t.new_empty((1, 1, 1, 1)))
    return {reference: "reference", cpu_ops: "cpu"}.get(impl, "triton")


def _rows_implementation(x: torch.Tensor, *others: torch.Tensor | None) -> ModuleType:
    """Like implementation(), plus the C per-token ops for fp32 or bf16 CPU rows in auto and
    cpu modes (other dtypes, e.g. fp16, keep the reference, also in cpu mode: "wherever they
    apply")."""
    mode = kernels_mode()
    if mode == "cpu" and not cpu_ops.available():
        raise GraftConfigError(f"GRAFT_KERNELS=cpu but {cpu_ops.unavailable_reason()}")
    if mode in ("auto", "cpu") and not (x.requires_grad and torch.is_grad_enabled()) \
            and cpu_ops.supports_rows(x, *others):
        return cpu_ops
    return implementation(x)


def _cache_implementation(impl: ModuleType, q: torch.Tensor, k_cache: torch.Tensor) -> ModuleType:
    """impl, unless the cache holds another dtype than q: then the C kernels or the reference
    (the Triton kernels read a cache of q's dtype only)."""
    if k_cache.dtype == q.dtype or impl in (cpu_ops, reference):
        return impl
    if kernels_mode() == "triton":
        raise GraftConfigError(f"GRAFT_KERNELS=triton: the Triton kernels read a KV cache of the "
                               f"activations' dtype ({q.dtype}), not {k_cache.dtype}")
    return reference


def _scales(k_scale, v_scale) -> dict:
    return {} if k_scale is None and v_scale is None else {"k_scale": k_scale, "v_scale": v_scale}


def store_kv(k, v, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None) -> None:
    impl = _cache_implementation(_rows_implementation(k, v), k, k_cache)
    impl.store_kv(k, v, k_cache, v_cache, slot_mapping, **_scales(k_scale, v_scale))


def paged_attention_decode(q, k_cache, v_cache, block_tables, context_lens, scale,
                           k_scale=None, v_scale=None):
    impl = _cache_implementation(_decode_implementation(q, k_cache), q, k_cache)
    return impl.paged_attention_decode(q, k_cache, v_cache, block_tables, context_lens, scale,
                                       **_scales(k_scale, v_scale))


def paged_attention_prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale,
                            k_scale=None, v_scale=None):
    impl = _c_where_it_applies(implementation(q), q, cpu_ops.supports_prefill(q, k_cache))
    impl = _cache_implementation(impl, q, k_cache)
    return impl.paged_attention_prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q,
                                        context_lens, scale, **_scales(k_scale, v_scale))


def rms_norm(x, weight, eps, residual=None):
    return _rows_implementation(x, residual).rms_norm(x, weight, eps, residual)


def silu_mul(gate_up, intermediate):
    # no Triton version: on a GPU the reference's two ops are fine (and CUDA graphs fuse launches)
    impl = _rows_implementation(gate_up)
    return (impl if impl is cpu_ops else reference).silu_mul(gate_up, intermediate)


def apply_rotary(x, cos, sin, interleaved=False):
    return _rows_implementation(x).apply_rotary(x, cos, sin, interleaved)


def rope_cos_sin(positions, inv_freq):
    # a handful of elementwise ops on [T, R/2]: the PyTorch version is the fast one everywhere
    return reference.rope_cos_sin(positions, inv_freq)


def quant_linear(x, weight, bias=None):
    """x @ dequantize(weight).T + bias (graft.kernels.quant_formats): Triton on CUDA, the C linears for
    CPU rows in auto and cpu modes, else the dequantize-then-matmul reference."""
    impl = implementation(x)
    if impl is not reference:
        return importlib.import_module("graft.kernels.triton_quant").quant_linear(x, weight, bias)
    mode = kernels_mode()
    if mode == "cpu" and not cpu_ops.available():
        raise GraftConfigError(f"GRAFT_KERNELS=cpu but {cpu_ops.unavailable_reason()}")
    if mode in ("auto", "cpu") and cpu_quant.supports(x, weight):
        return cpu_quant.quant_linear(x, weight, bias)
    return quant_formats.quant_linear(x, weight, bias)


def moe_grouped_gemm(x, w, expert_offsets):
    """Expert e's rows expert_offsets[e]:[e + 1] of x [S, K] times w[e] [N, K]^T: Triton on
    CUDA, else the reference (on CPU the MoE layer runs each expert's own linears instead)."""
    impl = implementation(x)
    if impl is not reference:
        return importlib.import_module("graft.kernels.triton_moe").moe_grouped_gemm(x, w, expert_offsets)
    return reference.moe_grouped_gemm(x, w, expert_offsets)


def argmax(logits):
    """logits.argmax(dim=-1) of [B, V] rows: the C scan for fp32 CPU rows in auto and cpu
    modes (torch's rules: first index of the largest value, NaN largest), else torch."""
    if kernels_mode() in ("auto", "cpu") and logits.is_cpu:
        return cpu_ops.argmax(logits)
    return logits.argmax(dim=-1)
