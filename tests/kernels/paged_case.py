"""Build random paged-KV test cases (dense K/V per sequence + the same data in a shuffled paged cache)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedCase:
    q: torch.Tensor  # [total_q, Hq, D]
    k_cache: torch.Tensor  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [S, max_blocks] int32, unused entries -1
    context_lens: torch.Tensor  # [S] int32
    cu_seqlens_q: torch.Tensor  # [S + 1] int32
    keys: list  # per sequence [n, Hkv, D]
    values: list
    scale: float


def make_case(context_lens: list[int], q_lens: list[int], block_size: int, num_kv_heads: int,
              group: int, head_dim: int, dtype=torch.float32, seed: int = 0,
              unused_fill: int = -1) -> PagedCase:
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-n // block_size) for n in context_lens]
    num_blocks = sum(blocks_per_seq) + 3  # spare blocks hold garbage that must never be read
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    max_blocks = max(blocks_per_seq + [1]) + 1
    block_tables = torch.full((len(context_lens), max_blocks), unused_fill, dtype=torch.int32)
    keys, values, used = [], [], 0
    for i, (n, nb) in enumerate(zip(context_lens, blocks_per_seq)):
        ids = perm[used:used + nb]
        used += nb
        block_tables[i, :nb] = torch.tensor(ids, dtype=torch.int32)
        k = torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype)
        v = torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype)
        for t in range(n):
            k_cache[ids[t // block_size], t % block_size] = k[t]
            v_cache[ids[t // block_size], t % block_size] = v[t]
        keys.append(k)
        values.append(v)
    total_q = sum(q_lens)
    q = torch.randn(total_q, num_kv_heads * group, head_dim, generator=gen).to(dtype)
    cu = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    return PagedCase(q, k_cache, v_cache, block_tables, torch.tensor(context_lens, dtype=torch.int32),
                     cu, keys, values, head_dim ** -0.5)


def dense_attention(case: PagedCase) -> torch.Tensor:
    """Naive fp64 causal attention per sequence over its dense K/V, for the last q_len positions."""
    out = torch.zeros(case.q.shape, dtype=torch.float64)
    cu = case.cu_seqlens_q.tolist()
    for i, n in enumerate(case.context_lens.tolist()):
        lo, hi = cu[i], cu[i + 1]
        if hi == lo or n == 0:
            continue
        q = case.q[lo:hi].double().transpose(0, 1)  # [Hq, q_len, D]
        group = q.shape[0] // case.keys[i].shape[1]
        k = case.keys[i].double().repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, n, D]
        v = case.values[i].double().repeat_interleave(group, dim=1).transpose(0, 1)
        q_pos = torch.arange(n - (hi - lo), n)
        allowed = torch.arange(n)[None, :] <= q_pos[:, None]  # [q_len, n]
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=case.scale)
        out[lo:hi] = o.transpose(0, 1)
    return out


def bad_block_tables(case: PagedCase):
    """Copies of the case's block tables whose row 1 points outside the cache within its
    context (its third block: an id past the last block, then -1); the case needs 2 sequences,
    the second over more than 2 blocks."""
    for bad in (case.k_cache.shape[0], -1):
        tables = case.block_tables.clone()
        tables[1, 2] = bad
        yield tables
