"""Shape and dtype checks shared by the reference and Triton ops (no device syncs but
check_prefill_chunks', which reads values)."""

from __future__ import annotations

import torch

_INT_DTYPES = (torch.int32, torch.int64)


def _shape(t: torch.Tensor) -> tuple:
    return tuple(t.shape)


def _check_cache(op: str, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    if k_cache.dim() != 4:
        raise ValueError(f"{op}: k_cache must be [num_blocks, block_size, num_kv_heads, head_dim], "
                         f"got shape {_shape(k_cache)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"{op}: v_cache shape {_shape(v_cache)} must equal k_cache shape {_shape(k_cache)}")


def _check_int(op: str, name: str, t: torch.Tensor, dims: int) -> None:
    if t.dtype not in _INT_DTYPES or t.dim() != dims:
        raise ValueError(f"{op}: {name} must be a {dims}-D int32/int64 tensor, "
                         f"got {t.dtype} of shape {_shape(t)}")


def check_kv_scales(op: str, k_cache, k_scale, v_scale) -> None:
    """An int8 cache needs fp32 scales [num_blocks, block_size, Hkv] for K and V; a float
    cache takes none."""
    if k_cache.dtype != torch.int8:
        if k_scale is not None or v_scale is not None:
            raise ValueError(f"{op}: k_scale/v_scale belong to an int8 cache; this one is "
                             f"{k_cache.dtype}")
        return
    want = tuple(k_cache.shape[:3])
    for name, sc in (("k_scale", k_scale), ("v_scale", v_scale)):
        if sc is None or sc.dtype != torch.float32 or tuple(sc.shape) != want:
            got = "None" if sc is None else f"{sc.dtype} of shape {_shape(sc)}"
            raise ValueError(f"{op}: an int8 KV cache needs {name} as float32 {want} "
                             f"(one scale per cached token and KV head), got {got}")


def check_store_kv_args(k, v, k_cache, v_cache, slot_mapping) -> None:
    op = "store_kv"
    _check_cache(op, k_cache, v_cache)
    if k.dim() != 3 or v.shape != k.shape or k.shape[1:] != k_cache.shape[2:]:
        raise ValueError(f"{op}: k and v must both be [T, num_kv_heads, head_dim] = [T, "
                         f"{k_cache.shape[2]}, {k_cache.shape[3]}] to match the cache, got k "
                         f"{_shape(k)} and v {_shape(v)}")
    _check_int(op, "slot_mapping", slot_mapping, 1)
    if slot_mapping.shape[0] != k.shape[0]:
        raise ValueError(f"{op}: slot_mapping has {slot_mapping.shape[0]} entries but k has "
                         f"{k.shape[0]} rows; give one slot (or -1) per row")


def slot_out_of_range(slot: int, num_slots: int) -> ValueError:
    """store_kv's error for a slot_mapping entry past the cache's end."""
    return ValueError(f"store_kv: slot_mapping holds slot {slot} but the cache has only {num_slots} "
                      "slots (num_blocks * block_size); fix the slot mapping")


def check_paged_attention_args(q, k_cache, v_cache, block_tables, context_lens, lens_name: str,
                               num_seqs: int | None = None, op: str = "paged_attention_decode") -> None:
    _check_cache(op, k_cache, v_cache)
    if q.dim() != 3:
        raise ValueError(f"{op}: q must be [tokens, num_q_heads, head_dim], got shape {_shape(q)}")
    if q.shape[2] != k_cache.shape[3]:
        raise ValueError(f"{op}: q head_dim {q.shape[2]} differs from the cache head_dim {k_cache.shape[3]}")
    if q.shape[1] % k_cache.shape[2] != 0:
        raise ValueError(f"{op}: num_q_heads {q.shape[1]} must be a multiple of num_kv_heads "
                         f"{k_cache.shape[2]} (grouped-query attention)")
    num_seqs = q.shape[0] if num_seqs is None else num_seqs
    _check_int(op, "block_tables", block_tables, 2)
    _check_int(op, lens_name, context_lens, 1)
    if block_tables.shape[0] != num_seqs or context_lens.shape[0] != num_seqs:
        raise ValueError(f"{op}: block_tables {_shape(block_tables)} and {lens_name} "
                         f"{_shape(context_lens)} need one row per sequence ({num_seqs})")


def check_prefill_args(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens) -> None:
    op = "paged_attention_prefill"
    _check_int(op, "cu_seqlens_q", cu_seqlens_q, 1)
    if cu_seqlens_q.shape[0] < 1:
        raise ValueError(f"{op}: cu_seqlens_q must hold num_seqs + 1 offsets starting at 0, got an empty tensor")
    check_paged_attention_args(q, k_cache, v_cache, block_tables, context_lens, "context_lens",
                               num_seqs=cu_seqlens_q.shape[0] - 1, op=op)


def check_prefill_chunks(cu_seqlens_q, context_lens, num_rows: int) -> None:
    """Each sequence's query rows lie inside q's num_rows and number at most its context
    (reads the values: a device sync on a GPU, so the CPU paths call it)."""
    op = "paged_attention_prefill"
    starts, lens = cu_seqlens_q.tolist(), context_lens.tolist()
    for i, n in enumerate(lens):
        lo, hi = starts[i], starts[i + 1]
        if lo < 0 or hi < lo or hi > num_rows:
            raise ValueError(f"{op}: cu_seqlens_q must be non-decreasing offsets into q's "
                             f"{num_rows} rows, got {lo}, {hi} at sequence {i}")
        if hi - lo > n:
            raise ValueError(f"{op}: sequence {i} has {hi - lo} queries but context_lens[{i}]={n}; "
                             f"context_lens must count the tokens in the cache after this chunk "
                             f"was stored (>= the chunk length)")


def check_rotary_args(x, cos, sin) -> int:
    """Validate apply_rotary's inputs and return the rotary dim R."""
    if x.dim() != 3:
        raise ValueError(f"apply_rotary: x must be [T, H, D], got shape {_shape(x)}")
    if cos.dim() != 2 or sin.shape != cos.shape or cos.shape[0] != x.shape[0]:
        raise ValueError(f"apply_rotary: cos and sin must both be [T, R/2] with T={x.shape[0]}, "
                         f"got cos {_shape(cos)} and sin {_shape(sin)}")
    rot = 2 * cos.shape[1]
    if rot == 0 or rot > x.shape[2]:
        raise ValueError(f"apply_rotary: rotary dim R = 2 * cos.shape[1] = {rot} must be in "
                         f"[2, head_dim={x.shape[2]}]")
    return rot


def check_rope_args(positions, inv_freq) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate rope_cos_sin's inputs; returns (inv_freq_h, inv_freq_w) (equal for 1D)."""
    if isinstance(inv_freq, (tuple, list)):
        if len(inv_freq) != 2:
            raise ValueError(f"rope_cos_sin: inv_freq as a sequence must be the pair "
                             f"(inv_freq_h, inv_freq_w), got {len(inv_freq)} items")
        inv_h, inv_w = inv_freq
    else:
        inv_h = inv_w = inv_freq
    if inv_h.dim() != 1 or inv_w.shape != inv_h.shape:
        raise ValueError(f"rope_cos_sin: inv_freq must be 1-D (a pair of equal length for 2D), got "
                         f"{_shape(inv_h)} and {_shape(inv_w)}")
    if positions.dim() == 1:
        if isinstance(inv_freq, (tuple, list)):
            raise ValueError("rope_cos_sin: 1-D positions take one inv_freq tensor, not a pair")
    elif positions.dim() != 2 or positions.shape[1] != 2:
        raise ValueError(f"rope_cos_sin: positions must be [T] (1D) or [T, 2] (h, w) for 2D rope, "
                         f"got shape {_shape(positions)}")
    return inv_h, inv_w


def check_moe_gemm_args(x: torch.Tensor, w: torch.Tensor, expert_offsets: torch.Tensor) -> None:
    """moe_grouped_gemm: x [S, K] rows grouped by expert, w [E, N, K], expert_offsets [E + 1]."""
    if x.dim() != 2 or w.dim() != 3 or x.shape[1] != w.shape[2]:
        raise ValueError(f"moe_grouped_gemm: x must be [S, K] and w [E, N, K] with the same K, got "
                         f"x {tuple(x.shape)}, w {tuple(w.shape)}")
    if expert_offsets.shape != (w.shape[0] + 1,) or expert_offsets.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"moe_grouped_gemm: expert_offsets must be int32/int64 [E + 1] = "
                         f"[{w.shape[0] + 1}], got {expert_offsets.dtype} {tuple(expert_offsets.shape)}")
