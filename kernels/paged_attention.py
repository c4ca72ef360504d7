"""Triton paged attention: split-KV decode (+ reduce) and varlen causal prefill over block tables.

K/V tokens are gathered one tile at a time through the block table, so the tile length is
independent of the cache's block size. Softmax is online, in fp32 and in base 2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
DECODE_PARTITION = 512  # tokens per split-KV partition of the decode kernel
INTERPRET = bool(triton.knobs.runtime.interpret)  # captured when the kernels below are defined


@triton.jit
def _load_kv_tile(cache_ptr, bt_row_ptr, offs_n, n_mask, kvh, offs_d, d_mask,
                  stride_b, stride_t, stride_h, stride_d, BLOCK_SIZE: tl.constexpr):
    blk = tl.load(bt_row_ptr + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
    row = blk * stride_b + (offs_n % BLOCK_SIZE) * stride_t + kvh * stride_h  # [TILE_N]
    ptrs = cache_ptr + row[:, None] + offs_d[None, :] * stride_d
    return tl.load(ptrs, mask=n_mask[:, None] & d_mask[None, :], other=0.0)  # [TILE_N, BLOCK_D]


@triton.jit
def _qk(q, k, DOT_F32: tl.constexpr):
    if DOT_F32:
        s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    return s


@triton.jit
def _softmax_update(s, v, m_i, l_i, acc, DOT_F32: tl.constexpr):
    """Fold one tile of masked log2-scores s [rows, TILE_N] and values v into (m, l, acc)."""
    # a row that has seen no key yet keeps a finite max, so masked rows never produce NaN
    m_new = tl.maximum(tl.maximum(m_i, tl.max(s, 1)), -1e30)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if DOT_F32:
        pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc * alpha[:, None] + pv


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, ctx_ptr, out_ptr, part_acc_ptr, part_ml_ptr,
                   qk_scale, num_parts,
                   stride_qs, stride_qh, stride_qd,
                   stride_kb, stride_kt, stride_kh, stride_kd,
                   stride_vb, stride_vt, stride_vh, stride_vd,
                   stride_bt, stride_os, stride_oh, stride_od,
                   GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr,
                   BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr,
                   PARTITION: tl.constexpr, SPLIT: tl.constexpr, DOT_F32: tl.constexpr):
    # one program: all GROUP query heads of one kv head of one sequence, one KV partition
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    part = tl.program_id(2)
    ctx = tl.load(ctx_ptr + seq)
    start = part * PARTITION
    if SPLIT:
        end = tl.minimum(start + PARTITION, ctx)
    else:  # a single program walks the whole context
        end = ctx
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_g
    q = tl.load(q_ptr + seq * stride_qs + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                mask=g_mask[:, None] & d_mask[None, :], other=0.0)  # [BLOCK_G, BLOCK_D]
    if DOT_F32:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    bt_row = bt_ptr + seq * stride_bt
    for t0 in range(start, end, TILE_N):
        offs_n = t0 + tl.arange(0, TILE_N)
        n_mask = offs_n < end
        k = _load_kv_tile(k_ptr, bt_row, offs_n, n_mask, kvh, offs_d, d_mask,
                          stride_kb, stride_kt, stride_kh, stride_kd, BLOCK_SIZE)
        v = _load_kv_tile(v_ptr, bt_row, offs_n, n_mask, kvh, offs_d, d_mask,
                          stride_vb, stride_vt, stride_vh, stride_vd, BLOCK_SIZE)
        s = tl.where(n_mask[None, :], _qk(q, k, DOT_F32) * qk_scale, float("-inf"))  # [BLOCK_G, TILE_N]
        m_i, l_i, acc = _softmax_update(s, v, m_i, l_i, acc, DOT_F32)
    out_mask = g_mask[:, None] & d_mask[None, :]
    if SPLIT:
        # partials: acc [S, Hq, P, D] (unnormalised), (m, l) [S, Hq, P, 2]
        row = (seq * (tl.num_programs(1) * GROUP) + heads) * num_parts + part  # [BLOCK_G]
        tl.store(part_acc_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=out_mask)
        tl.store(part_ml_ptr + row * 2, m_i, mask=g_mask)
        tl.store(part_ml_ptr + row * 2 + 1, l_i, mask=g_mask)
    else:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # context 0 -> acc is 0 -> zeros
        tl.store(out_ptr + seq * stride_os + heads[:, None] * stride_oh + offs_d[None, :] * stride_od,
                 out.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _decode_reduce_kernel(part_acc_ptr, part_ml_ptr, ctx_ptr, out_ptr, num_parts,
                          stride_os, stride_oh, stride_od,
                          HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr,
                          PARTITION: tl.constexpr):
    # merge the partitions of one (sequence, query head): rescale each by 2^(m_p - m_max)
    seq = tl.program_id(0)
    head = tl.program_id(1)
    row0 = (seq * tl.num_programs(1) + head) * num_parts
    used = tl.cdiv(tl.load(ctx_ptr + seq), PARTITION)
    offs_p = tl.arange(0, BLOCK_P)
    p_mask = offs_p < used
    m = tl.load(part_ml_ptr + (row0 + offs_p) * 2, mask=p_mask, other=float("-inf"))
    l = tl.load(part_ml_ptr + (row0 + offs_p) * 2 + 1, mask=p_mask, other=0.0)
    m_max = tl.where(used > 0, tl.max(m, 0), 0.0)
    w = tl.where(p_mask, tl.exp2(m - m_max), 0.0)  # [BLOCK_P]
    denom = tl.sum(w * l, 0)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    acc = tl.zeros([BLOCK_D], tl.float32)
    for p in range(0, used):
        m_p = tl.load(part_ml_ptr + (row0 + p) * 2)
        acc += tl.exp2(m_p - m_max) * tl.load(part_acc_ptr + (row0 + p) * HEAD_DIM + offs_d, mask=d_mask,
                                              other=0.0)
    out = acc / tl.where(denom > 0, denom, 1.0)
    tl.store(out_ptr + seq * stride_os + head * stride_oh + offs_d * stride_od,
             out.to(out_ptr.dtype.element_ty), mask=d_mask)


@triton.jit
def _prefill_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, cu_ptr, ctx_ptr, out_ptr, qk_scale,
                    stride_qt, stride_qh, stride_qd,
                    stride_kb, stride_kt, stride_kh, stride_kd,
                    stride_vb, stride_vt, stride_vh, stride_vd,
                    stride_bt, stride_ot, stride_oh, stride_od,
                    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr,
                    DOT_F32: tl.constexpr):
    # one program: BLOCK_M queries of one sequence's chunk, one query head
    m_tile = tl.program_id(0)
    seq = tl.program_id(1)
    head = tl.program_id(2)
    kvh = head // GROUP
    q_start = tl.load(cu_ptr + seq)
    q_len = tl.load(cu_ptr + seq + 1) - q_start
    if m_tile * BLOCK_M < q_len:
        ctx = tl.load(ctx_ptr + seq)
        offs_m = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
        m_mask = offs_m < q_len
        q_pos = ctx - q_len + offs_m  # absolute position of each query: the chunk ends the sequence
        offs_d = tl.arange(0, BLOCK_D)
        d_mask = offs_d < HEAD_DIM
        q_rows = (q_start + offs_m).to(tl.int64)
        q = tl.load(q_ptr + q_rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :] * stride_qd,
                    mask=m_mask[:, None] & d_mask[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
        if DOT_F32:
            q = q.to(tl.float32)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        bt_row = bt_ptr + seq * stride_bt
        kv_end = tl.minimum(ctx, ctx - q_len + (m_tile + 1) * BLOCK_M)  # causal: nothing past the tile
        for t0 in range(0, kv_end, TILE_N):
            offs_n = t0 + tl.arange(0, TILE_N)
            n_mask = offs_n < kv_end
            k = _load_kv_tile(k_ptr, bt_row, offs_n, n_mask, kvh, offs_d, d_mask,
                              stride_kb, stride_kt, stride_kh, stride_kd, BLOCK_SIZE)
            v = _load_kv_tile(v_ptr, bt_row, offs_n, n_mask, kvh, offs_d, d_mask,
                              stride_vb, stride_vt, stride_vh, stride_vd, BLOCK_SIZE)
            allowed = n_mask[None, :] & (offs_n[None, :] <= q_pos[:, None])  # causal on absolute positions
            s = tl.where(allowed, _qk(q, k, DOT_F32) * qk_scale, float("-inf"))  # [BLOCK_M, TILE_N]
            m_i, l_i, acc = _softmax_update(s, v, m_i, l_i, acc, DOT_F32)
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + q_rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :] * stride_od,
                 out.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


def _dot_f32(t: torch.Tensor) -> bool:
    # fp32 caches need IEEE dots (TF32 would cost ~1e-3); the interpreter cannot do half dots
    return INTERPRET or t.dtype == torch.float32


def _block_g(group: int) -> int:
    return max(16, triton.next_power_of_2(group))  # tl.dot needs >= 16 rows


def _block_d(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))  # padded (masked) when not a power of two


def _stages(num_stages: int | None) -> dict:
    return {} if num_stages is None else {"num_stages": num_stages}


def decode(q, k_cache, v_cache, block_tables, context_lens, scale, max_context_len=None,
           partition_size=DECODE_PARTITION, tile_n=64, num_warps=4, num_stages=None):
    num_seqs, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_q_heads // num_kv_heads
    out = torch.empty_like(q)
    if num_seqs == 0:
        return out
    if max_context_len is None:
        # no host sync: the block table's width bounds every context (partitions past a
        # sequence's end exit at once), so size block_tables to the batch, not the model
        max_context_len = block_tables.shape[1] * block_size
    tile_n = min(tile_n, partition_size)
    if partition_size % tile_n or tile_n < 16:
        raise ValueError(f"paged_attention_decode: partition_size {partition_size} must be a multiple of "
                         f"tile_n {tile_n} (>= 16)")
    num_parts = max(1, triton.cdiv(max_context_len, partition_size))
    split = num_parts > 1
    block_d = _block_d(head_dim)
    if split:
        part_acc = torch.empty(num_seqs, num_q_heads, num_parts, head_dim, dtype=torch.float32, device=q.device)
        part_ml = torch.empty(num_seqs, num_q_heads, num_parts, 2, dtype=torch.float32, device=q.device)
    else:
        part_acc = part_ml = out  # unused by the single-partition kernel
    _decode_kernel[(num_seqs, num_kv_heads, num_parts)](
        q, k_cache, v_cache, block_tables, context_lens, out, part_acc, part_ml,
        scale * LOG2E, num_parts, *q.stride(), *k_cache.stride(), *v_cache.stride(),
        block_tables.stride(0), *out.stride(),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_G=_block_g(group), BLOCK_D=block_d,
        BLOCK_SIZE=block_size, TILE_N=tile_n, PARTITION=partition_size, SPLIT=split,
        DOT_F32=_dot_f32(q), num_warps=num_warps, **_stages(num_stages))
    if split:
        _decode_reduce_kernel[(num_seqs, num_q_heads)](
            part_acc, part_ml, context_lens, out, num_parts, *out.stride(),
            HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_P=triton.next_power_of_2(num_parts),
            PARTITION=partition_size, num_warps=4)
    return out


def prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, max_q_len=None,
            block_m=64, tile_n=64, num_warps=4, num_stages=None):
    total_q, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    num_seqs = cu_seqlens_q.shape[0] - 1
    out = torch.empty_like(q)
    if total_q == 0 or num_seqs == 0:
        return out
    if max_q_len is None:
        max_q_len = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())  # one host sync
    _prefill_kernel[(triton.cdiv(max_q_len, block_m), num_seqs, num_q_heads)](
        q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, out, scale * LOG2E,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), block_tables.stride(0), *out.stride(),
        GROUP=num_q_heads // num_kv_heads, HEAD_DIM=head_dim, BLOCK_M=block_m,
        BLOCK_D=_block_d(head_dim), BLOCK_SIZE=block_size, TILE_N=tile_n,
        DOT_F32=_dot_f32(q), num_warps=num_warps, **_stages(num_stages))
    return out
