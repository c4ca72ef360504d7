"""Pure-PyTorch references of every kernel: the CPU path, and the ground truth for Triton.

Same signatures as graft.kernels.triton_ops; numerics follow HF transformers (see each op).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from graft.kernels.checks import (check_kv_scales, check_moe_gemm_args, check_paged_attention_args,
                                  check_prefill_args, check_prefill_chunks, check_rope_args,
                                  check_rotary_args, check_store_kv_args, slot_out_of_range)


def quantize_kv(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """KV rows [T, Hkv, D] -> (int8 [T, Hkv, D], fp32 scales [T, Hkv]): each token's head
    vector on its own absmax scale (x ~ q * scale), so an appended token never changes the
    rows already cached and a shared prefix block reads the same numbers in every sequence."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1) / 127.0  # [T, Hkv]
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(xf / safe[..., None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def dequantize_kv(q: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """Cached rows as fp32: int8 rows times their scales, other dtypes converted."""
    return q.float() * scale[..., None] if scale is not None else q.float()


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, k_scale: torch.Tensor | None = None,
             v_scale: torch.Tensor | None = None) -> None:
    """Scatter rows k[t], v[t] into cache slot slot_mapping[t]; slots equal to -1 are skipped.
    An int8 cache takes quantize_kv's rows, and their scales into k_scale/v_scale
    [num_blocks, block_size, Hkv]."""
    check_store_kv_args(k, v, k_cache, v_cache, slot_mapping)
    check_kv_scales("store_kv", k_cache, k_scale, v_scale)
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    keep = slot_mapping >= 0  # [T]
    slots = slot_mapping[keep].long()
    if slots.numel() and int(slots.max()) >= num_slots:
        raise slot_out_of_range(int(slots.max()), num_slots)
    k_flat = k_cache.view(num_slots, *k_cache.shape[2:])  # [num_slots, Hkv, D]
    v_flat = v_cache.view(num_slots, *v_cache.shape[2:])
    if k_scale is None:
        k_flat.index_copy_(0, slots, k[keep].to(k_cache.dtype))
        v_flat.index_copy_(0, slots, v[keep].to(v_cache.dtype))
        return
    for rows, flat, scales in ((k[keep], k_flat, k_scale), (v[keep], v_flat, v_scale)):
        q, s = quantize_kv(rows)
        flat.index_copy_(0, slots, q)
        scales.view(num_slots, -1).index_copy_(0, slots, s)


def _gather_tokens(cache: torch.Tensor, block_rows: torch.Tensor, n: int) -> torch.Tensor:
    """The first n tokens of each sequence whose block table row is in block_rows [S, *] from
    the paged cache: [S, n, Hkv, D], one index op for all S."""
    block_size = cache.shape[1]
    n_blocks = -(-n // block_size)
    blocks = block_rows[:, :n_blocks].long()
    if n_blocks and bool(((blocks < 0) | (blocks >= cache.shape[0])).any()):
        raise ValueError(f"paged attention: block_tables rows hold block ids {blocks.tolist()} outside "
                         f"[0, {cache.shape[0]}) for the first {n} tokens; fix the block table")
    return cache[blocks].reshape(len(blocks), n_blocks * block_size, *cache.shape[2:])[:, :n]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of the last q_len positions of a sequence over its n cached tokens.

    q: [q_len, Hq, D]; k, v: [n, Hkv, D], or [B, ...] of each for B sequences of the same
    q_len and n (one call; each sequence's result is the one it gets alone). Runs in fp32
    through torch's fused SDPA (2-3x faster on CPU than einsum + mask + softmax, and the same
    kernel HF's default "sdpa" attention uses); the causal mask is aligned to the end (query i
    sits at n - q_len + i).
    """
    if q.dim() == 3:
        return _attend(q[None], k[None], v[None], scale)[0]
    q_len, n = q.shape[1], k.shape[1]
    qh, kh, vh = (t.float().transpose(1, 2) for t in (q, k, v))  # [B, H, len, D]
    if q_len == n:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale,
                                             enable_gqa=True)
    else:  # a chunk after cached tokens: query i may see keys 0 .. n - q_len + i
        allowed = (torch.arange(n, device=q.device)[None, :]
                   <= torch.arange(n - q_len, n, device=q.device)[:, None])
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=allowed, scale=scale,
                                             enable_gqa=True)
    return out.transpose(1, 2).to(q.dtype)  # [B, q_len, Hq, D]


def paged_attention_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           scale: float, k_scale: torch.Tensor | None = None,
                           v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """One query token per sequence over its context_lens[i] cached tokens (zeros when 0).
    The cache may hold another dtype than q (bf16, or int8 with k_scale/v_scale); scores and
    sums are fp32 either way.

    Batched over sequences (one gather, two batched products, a length mask): on CPU the
    engine's decode step is dominated by per-sequence Python overhead otherwise.
    """
    check_paged_attention_args(q, k_cache, v_cache, block_tables, context_lens, "context_lens")
    check_kv_scales("paged_attention_decode", k_cache, k_scale, v_scale)
    num_seqs, num_q_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    lens = context_lens.long()
    max_len = int(lens.max()) if num_seqs else 0
    if max_len == 0:
        return torch.zeros_like(q)
    n_blocks = -(-max_len // block_size)
    blocks = block_tables[:, :n_blocks].long()  # [S, nb]
    used = torch.arange(n_blocks, device=q.device)[None, :] * block_size < lens[:, None]
    if bool(((blocks < 0) | (blocks >= k_cache.shape[0]))[used].any()):
        raise ValueError(f"paged attention: block_tables hold block ids outside [0, {k_cache.shape[0]}) "
                         "within context_lens; fix the block table")
    blocks = blocks.masked_fill(~used, 0)  # padding rows read block 0 and are masked below
    group = num_q_heads // num_kv_heads
    shape = (num_seqs, n_blocks * block_size, num_kv_heads, head_dim)
    k = dequantize_kv(k_cache[blocks], None if k_scale is None else k_scale[blocks]).view(shape)
    v = dequantize_kv(v_cache[blocks], None if v_scale is None else v_scale[blocks]).view(shape)
    qf = q.float().view(num_seqs, num_kv_heads, group, head_dim)
    scores = torch.einsum("shgd,skhd->shgk", qf, k) * scale  # [S, Hkv, G, K]
    pad = torch.arange(n_blocks * block_size, device=q.device)[None, :] >= lens[:, None]  # [S, K]
    scores = scores.masked_fill(pad[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num_(0.0)  # empty sequences -> all-zero rows
    out = torch.einsum("shgk,skhd->shgd", probs, v)  # [S, Hkv, G, D]
    return out.reshape(num_seqs, num_q_heads, head_dim).to(q.dtype)


def paged_attention_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, cu_seqlens_q: torch.Tensor,
                            context_lens: torch.Tensor, scale: float,
                            k_scale: torch.Tensor | None = None,
                            v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Each sequence's query chunk (its last q_len positions) attends causally to the cache
    (of q's dtype, bf16, or int8 with k_scale/v_scale)."""
    check_prefill_args(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens)
    check_kv_scales("paged_attention_prefill", k_cache, k_scale, v_scale)
    check_prefill_chunks(cu_seqlens_q, context_lens, q.shape[0])
    out = torch.zeros_like(q)  # [total_q, Hq, D]
    starts = cu_seqlens_q.tolist()
    # sequences of the same chunk and context length go through one SDPA call: a step that
    # prefills many prompts of one length (a burst of requests) made one call per sequence
    # and layer, whose Python cost outweighed the products
    groups: dict[tuple[int, int], list[int]] = {}
    for i, n in enumerate(context_lens.tolist()):
        lo, hi = starts[i], starts[i + 1]
        if hi == lo:
            continue
        groups.setdefault((hi - lo, n), []).append(i)
    for (m, n), seqs in groups.items():
        table = block_tables[seqs]
        k, v = (dequantize_kv(_gather_tokens(cache, table, n),
                              None if sc is None else _gather_tokens(sc, table, n))
                for cache, sc in ((k_cache, k_scale), (v_cache, v_scale)))
        if len(groups) == 1 and len(seqs) * m == q.shape[0]:  # every row, in order: no scatter
            return _attend(q.view(len(seqs), m, *q.shape[1:]), k, v, scale).reshape(q.shape)
        rows = torch.tensor([r for i in seqs for r in range(starts[i], starts[i] + m)], device=q.device)
        got = _attend(q[rows].view(len(seqs), m, *q.shape[1:]), k, v, scale)
        out[rows] = got.reshape(len(seqs) * m, *q.shape[1:])
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """HF LlamaRMSNorm over the last dim; with residual, returns (rms_norm(x + residual), x + residual)."""
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"rms_norm: weight shape {tuple(weight.shape)} must be ({x.shape[-1]},), "
                         f"the last dim of x {tuple(x.shape)}")
    if residual is not None:
        if residual.shape != x.shape:
            raise ValueError(f"rms_norm: residual shape {tuple(residual.shape)} must equal x shape "
                             f"{tuple(x.shape)}")
        x = x + residual
    input_dtype = x.dtype
    hidden = x.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    hidden = hidden * torch.rsqrt(variance + eps)
    if input_dtype == torch.float32 and weight.dtype == torch.float32:
        y = hidden.mul_(weight)  # same products as weight * hidden, without another temporary
    else:
        y = (weight * hidden.to(input_dtype)).to(input_dtype)  # HF order: cast back, then scale
    return y if residual is None else (y, x)


def silu_mul(gate_up: torch.Tensor, intermediate: int) -> torch.Tensor:
    """silu(gate) * up for the fused gate|up projection [T, 2 * intermediate] (HF's
    act_fn(gate_proj(x)) * up_proj(x) for hidden_act "silu")."""
    if gate_up.shape[-1] != 2 * intermediate:
        raise ValueError(f"silu_mul: gate_up has {gate_up.shape[-1]} columns, expected 2 * "
                         f"intermediate = {2 * intermediate}")
    gate, up = gate_up.split(intermediate, dim=-1)
    return F.silu(gate).mul_(up)  # silu returns a fresh tensor: multiply into it


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 interleaved: bool = False) -> torch.Tensor:
    """Rotate the first R = 2 * cos.shape[-1] dims of x: [T, H, D]; the rest pass through.

    Arithmetic runs in promote_types(x.dtype, cos.dtype) with HF's operation order
    (x * cos + rotate(x) * sin): pass cos/sin cast to x.dtype to reproduce HF Llama/GLM4
    rounding in half precision, fp32 to reproduce vision encoders that upcast (Kimi).
    """
    rot = check_rotary_args(x, cos, sin)
    compute = torch.promote_types(x.dtype, cos.dtype)
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    xr = x_rot.to(compute)
    if interleaved:  # pairs (2i, 2i+1), GLM4 / MoonViT complex layout
        cos_full = cos.repeat_interleave(2, dim=-1)[:, None, :]  # [T, 1, R]
        sin_full = sin.repeat_interleave(2, dim=-1)[:, None, :]
        rotated = torch.stack((-xr[..., 1::2], xr[..., 0::2]), dim=-1).flatten(-2)
    else:  # pairs (i, i + R/2), HF rotate_half
        cos_full = torch.cat((cos, cos), dim=-1)[:, None, :]
        sin_full = torch.cat((sin, sin), dim=-1)[:, None, :]
        rotated = torch.cat((-xr[..., rot // 2:], xr[..., : rot // 2]), dim=-1)
    out = (xr * cos_full.to(compute)) + (rotated * sin_full.to(compute))
    if not x_pass.shape[-1]:  # full rotary: no pass-through dims to append (saves a copy)
        return out.to(x.dtype)
    return torch.cat((out.to(x.dtype), x_pass), dim=-1)


def rope_cos_sin(positions: torch.Tensor, inv_freq) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (fp32) of the rotary angles for 1D positions [T] or 2D (h, w) positions [T, 2].

    1D: angle[t, i] = positions[t] * inv_freq[i] -> [T, len(inv_freq)] (HF Llama/GLM4).
    2D: inv_freq is a pair (inv_freq_h, inv_freq_w) of equal length F (or one tensor used for
    both) and the columns interleave w and h like transformers' kimi_k25:
    [w*f0, h*f0, w*f1, h*f1, ...] -> [T, 2F], to be applied with interleaved=False.
    """
    inv_h, inv_w = check_rope_args(positions, inv_freq)
    if positions.dim() == 1:
        freqs = positions[:, None].float() * inv_h.to(device=positions.device, dtype=torch.float)
    else:
        f_h = positions[:, 0, None].float() * inv_h.to(device=positions.device, dtype=torch.float)
        f_w = positions[:, 1, None].float() * inv_w.to(device=positions.device, dtype=torch.float)
        freqs = torch.stack((f_w, f_h), dim=-1).flatten(1)  # [T, 2F]: (w_i, h_i) pairs
    return freqs.cos(), freqs.sin()


def moe_grouped_gemm(x: torch.Tensor, w: torch.Tensor, expert_offsets: torch.Tensor) -> torch.Tensor:
    """Grouped GEMM over experts: rows expert_offsets[e]:expert_offsets[e + 1] of x [S, K] times
    w[e] [N, K]^T -> [S, N] in x's dtype (fp32 accumulation; rows past expert_offsets[-1] are 0).
    Experts with no rows are never read."""
    check_moe_gemm_args(x, w, expert_offsets)
    out = x.new_zeros(x.shape[0], w.shape[1])
    bounds = expert_offsets.tolist()
    for e, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        if end > start:
            out[start:end] = F.linear(x[start:end].float(), w[e].float()).to(x.dtype)
    return out
