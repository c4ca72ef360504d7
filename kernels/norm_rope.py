"""Triton RMSNorm (optionally fused with the residual add), rotary embedding, and the KV-cache store."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, y_ptr, new_res_ptr, eps, n_cols,
                     stride_x, stride_r, stride_y, stride_nr,
                     HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_N)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)  # rounded like x + residual
        tl.store(new_res_ptr + row * stride_nr + offs, x, mask=mask)
    h = x.to(tl.float32)
    var = tl.sum(h * h, 0) / n_cols
    # HF order: normalise in fp32, round to the input dtype, then multiply by the weight
    normed = (h * tl.rsqrt(var + eps)).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + offs, (w * normed).to(y_ptr.dtype.element_ty), mask=mask)


def _rows(t: torch.Tensor, n_cols: int) -> torch.Tensor:
    t2 = t.reshape(-1, n_cols)
    return t2 if t2.stride(1) == 1 else t2.contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    n_cols = x.shape[-1]
    x2 = _rows(x, n_cols)
    y = torch.empty_like(x2)
    rows = x2.shape[0]
    if residual is not None:
        r2 = _rows(residual, n_cols)
        new_res = torch.empty_like(x2)
    else:
        r2 = new_res = x2  # unused when HAS_RESIDUAL is false
    if rows:
        _rms_norm_kernel[(rows,)](x2, r2, weight, y, new_res, eps, n_cols,
                                  x2.stride(0), r2.stride(0), y.stride(0), new_res.stride(0),
                                  HAS_RESIDUAL=residual is not None,
                                  BLOCK_N=triton.next_power_of_2(n_cols), num_warps=4 if n_cols <= 4096 else 8)
    y = y.view(x.shape)
    return y if residual is None else (y, new_res.view(x.shape))


@triton.jit
def _rotary_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, n_heads,
                   stride_xt, stride_xh, stride_ot, stride_oh, stride_ct, stride_st,
                   HALF: tl.constexpr, PASS: tl.constexpr, INTERLEAVED: tl.constexpr,
                   BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr):
    # one program: all heads of one token; pairs (i, i + HALF) or (2i, 2i + 1)
    t = tl.program_id(0).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    offs_r = tl.arange(0, BLOCK_R)
    h_mask = offs_h < n_heads
    r_mask = offs_r < HALF
    c = tl.load(cos_ptr + t * stride_ct + offs_r, mask=r_mask, other=0.0).to(tl.float32)[None, :]
    s = tl.load(sin_ptr + t * stride_st + offs_r, mask=r_mask, other=0.0).to(tl.float32)[None, :]
    if INTERLEAVED:
        i1 = 2 * offs_r
        i2 = 2 * offs_r + 1
    else:
        i1 = offs_r
        i2 = offs_r + HALF
    mask = h_mask[:, None] & r_mask[None, :]
    x_row = x_ptr + t * stride_xt + offs_h[:, None] * stride_xh
    o_row = out_ptr + t * stride_ot + offs_h[:, None] * stride_oh
    x1 = tl.load(x_row + i1[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_row + i2[None, :], mask=mask, other=0.0).to(tl.float32)
    # same order as HF: x * cos + rotate(x) * sin, rotate(x) = (-x2, x1)
    tl.store(o_row + i1[None, :], (x1 * c + (-x2) * s).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(o_row + i2[None, :], (x2 * c + x1 * s).to(out_ptr.dtype.element_ty), mask=mask)
    if PASS > 0:
        offs_p = 2 * HALF + tl.arange(0, BLOCK_P)
        p_mask = h_mask[:, None] & (offs_p < 2 * HALF + PASS)[None, :]
        tl.store(o_row + offs_p[None, :], tl.load(x_row + offs_p[None, :], mask=p_mask), mask=p_mask)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False):
    tokens, heads, head_dim = x.shape
    half = cos.shape[1]
    out = torch.empty_like(x)
    if x.stride(2) != 1 or cos.stride(1) != 1 or sin.stride(1) != 1:
        raise ValueError("apply_rotary (triton): the last dim of x, cos and sin must be contiguous")
    passthrough = head_dim - 2 * half
    if tokens:
        _rotary_kernel[(tokens,)](x, cos, sin, out, heads, x.stride(0), x.stride(1), out.stride(0),
                                  out.stride(1), cos.stride(0), sin.stride(0),
                                  HALF=half, PASS=passthrough, INTERLEAVED=interleaved,
                                  BLOCK_H=triton.next_power_of_2(heads),
                                  BLOCK_R=triton.next_power_of_2(half),
                                  BLOCK_P=triton.next_power_of_2(max(passthrough, 1)), num_warps=4)
    return out


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, n_heads, block_size,
                     stride_kt, stride_kh, stride_vt, stride_vh,
                     stride_kcb, stride_kct, stride_kch, stride_vcb, stride_vct, stride_vch,
                     HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (slot >= 0) & (offs_h[:, None] < n_heads) & (offs_d[None, :] < HEAD_DIM)  # slot -1: skipped
    blk = slot // block_size
    off = slot % block_size
    k = tl.load(k_ptr + t * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)
    v = tl.load(v_ptr + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    kc = kc_ptr + blk * stride_kcb + off * stride_kct + offs_h[:, None] * stride_kch + offs_d[None, :]
    vc = vc_ptr + blk * stride_vcb + off * stride_vct + offs_h[:, None] * stride_vch + offs_d[None, :]
    tl.store(kc, k.to(kc_ptr.dtype.element_ty), mask=mask)
    tl.store(vc, v.to(vc_ptr.dtype.element_ty), mask=mask)


def store_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    tokens, heads, head_dim = k.shape
    if k.stride(2) != 1 or v.stride(2) != 1 or k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError("store_kv (triton): the head_dim axis of k, v and the caches must be contiguous")
    if tokens:
        _store_kv_kernel[(tokens,)](k, v, k_cache, v_cache, slot_mapping, heads, k_cache.shape[1],
                                    k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                                    k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                                    v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
                                    HEAD_DIM=head_dim, BLOCK_H=triton.next_power_of_2(heads),
                                    BLOCK_D=triton.next_power_of_2(head_dim), num_warps=4)
