"""The Triton implementation of every op, with the reference's signatures and input checks.

Import it only after deciding about TRITON_INTERPRET (Triton reads it when kernels are defined);
graft.kernels.dispatch does so lazily. On CPU tensors it runs only under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import torch

from graft.kernels import norm_rope, paged_attention
from graft.kernels.checks import (check_paged_attention_args, check_prefill_args, check_rotary_args,
                                  check_store_kv_args)
from graft.kernels.reference import rope_cos_sin

INTERPRET = paged_attention.INTERPRET

__all__ = ["apply_rotary", "paged_attention_decode", "paged_attention_prefill", "rms_norm",
           "rope_cos_sin", "store_kv", "INTERPRET"]


def _check_device(op: str, *tensors: torch.Tensor) -> None:
    if INTERPRET:
        return
    for t in tensors:
        if not t.is_cuda:
            raise ValueError(f"{op} (triton): tensors must be on CUDA (got {t.device}); use the "
                             f"reference (GRAFT_KERNELS=reference) or set TRITON_INTERPRET=1 before "
                             f"graft.kernels.triton_ops is first imported")


def store_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    check_store_kv_args(k, v, k_cache, v_cache, slot_mapping)
    _check_device("store_kv", k, v, k_cache, v_cache, slot_mapping)
    norm_rope.store_kv(k, v, k_cache, v_cache, slot_mapping)


def paged_attention_decode(q, k_cache, v_cache, block_tables, context_lens, scale, **tuning):
    """tuning: max_context_len (default block_tables width * block_size; a tighter value, >= every
    context, saves empty programs), partition_size (split-KV tokens, 512), tile_n (64), num_warps,
    num_stages."""
    check_paged_attention_args(q, k_cache, v_cache, block_tables, context_lens, "context_lens")
    _check_device("paged_attention_decode", q, k_cache, v_cache, block_tables, context_lens)
    return paged_attention.decode(q, k_cache, v_cache, block_tables, context_lens, scale, **tuning)


def paged_attention_prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, **tuning):
    """tuning: max_q_len (saves a host sync), block_m (query tile, 64), tile_n (64), num_warps,
    num_stages."""
    check_prefill_args(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens)
    _check_device("paged_attention_prefill", q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens)
    return paged_attention.prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale,
                                   **tuning)


def rms_norm(x, weight, eps, residual=None):
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"rms_norm: weight shape {tuple(weight.shape)} must be ({x.shape[-1]},), "
                         f"the last dim of x {tuple(x.shape)}")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"rms_norm: residual shape {tuple(residual.shape)} must equal x shape {tuple(x.shape)}")
    _check_device("rms_norm", x, weight, *([] if residual is None else [residual]))
    return norm_rope.rms_norm(x, weight, eps, residual)


def apply_rotary(x, cos, sin, interleaved=False):
    check_rotary_args(x, cos, sin)
    _check_device("apply_rotary", x, cos, sin)
    return norm_rope.apply_rotary(x, cos, sin, interleaved)
