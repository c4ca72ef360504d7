"""Pick the implementation of each op: Triton on CUDA tensors, the PyTorch reference elsewhere
(and wherever autograd needs a backward).

GRAFT_KERNELS=auto (default) | reference (always the reference) | triton (always Triton,
e.g. on CPU tensors under TRITON_INTERPRET=1). Read at every call so tests can switch it.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from types import ModuleType

import torch

from graft.errors import GraftConfigError
from graft.kernels import reference

_MODES = ("auto", "reference", "triton")


@functools.cache
def triton_available() -> bool:
    # find_spec, not import: importing triton early would lock it out of interpreter mode
    return importlib.util.find_spec("triton") is not None


def _triton_ops() -> ModuleType:
    # imported lazily: Triton reads TRITON_INTERPRET when the kernels are defined
    return importlib.import_module("graft.kernels.triton_ops")


def implementation(t: torch.Tensor) -> ModuleType:
    """The module (reference or triton_ops) that runs an op whose main input is t."""
    mode = os.environ.get("GRAFT_KERNELS", "auto").strip().lower() or "auto"
    if mode not in _MODES:
        raise GraftConfigError(f"GRAFT_KERNELS={mode!r} is not one of {', '.join(_MODES)}")
    if mode == "reference":
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


def backend_name(t: torch.Tensor) -> str:
    """'triton' or 'reference': what an op on t would run (for logs and benchmarks)."""
    return "reference" if implementation(t) is reference else "triton"


def store_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    implementation(k).store_kv(k, v, k_cache, v_cache, slot_mapping)


def paged_attention_decode(q, k_cache, v_cache, block_tables, context_lens, scale):
    return implementation(q).paged_attention_decode(q, k_cache, v_cache, block_tables, context_lens, scale)


def paged_attention_prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale):
    return implementation(q).paged_attention_prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q,
                                                     context_lens, scale)


def rms_norm(x, weight, eps, residual=None):
    return implementation(x).rms_norm(x, weight, eps, residual)


def apply_rotary(x, cos, sin, interleaved=False):
    return implementation(x).apply_rotary(x, cos, sin, interleaved)


def rope_cos_sin(positions, inv_freq):
    # a handful of elementwise ops on [T, R/2]: the PyTorch version is the fast one everywhere
    return reference.rope_cos_sin(positions, inv_freq)
