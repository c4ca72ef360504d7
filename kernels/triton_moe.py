"""Triton grouped GEMM over experts: the MoE layer's expert matmuls in one launch.

`moe_grouped_gemm(x, w, expert_offsets)` has the contract of graft.kernels.reference's: x [S, K]
holds the step's (token, slot) rows grouped by expert, rows expert_offsets[e]:[e + 1] belong to
expert e, w [E, N, K] stacks the experts' float weights (K contiguous, as nn.Linear stores
them). Each program computes one BLOCK_M x BLOCK_N tile of one expert's rows: the host lists
the M tiles of the active experts (an expert with no rows gets no tile, so its weights are
never read), and every tile loops over K with `tl.dot` in fp32 accumulation.

Import it only after deciding about TRITON_INTERPRET (graft.kernels.dispatch does so lazily).
In the interpreter, whose bf16 arithmetic is wrong, the dot runs in fp32 and the kernel stores
fp32 that torch casts.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from graft.kernels.checks import check_moe_gemm_args
from graft.kernels.triton_ops import INTERPRET, _check_device

__all__ = ["moe_grouped_gemm", "compile_spec", "INTERPRET"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# fp32 operands on the GPU: TF32x3 (about fp32 accuracy), as graft.kernels.triton_quant does
_F32_PRECISION = "ieee" if INTERPRET else "tf32x3"


@triton.jit
def _moe_gemm_kernel(x_ptr, w_ptr, out_ptr, tile_expert_ptr, tile_row_ptr, offsets_ptr,
                     N, K, stride_xm, stride_we, stride_wn, stride_om,
                     DOT_F32: tl.constexpr, F32_PRECISION: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    tile = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(tile_expert_ptr + tile).to(tl.int64)
    row0 = tl.load(tile_row_ptr + tile)
    row_end = tl.load(offsets_ptr + expert + 1)
    offs_m = row0 + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < row_end
    n_mask = offs_n < N
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    w_rows = w_ptr + expert * stride_we + offs_n.to(tl.int64)[:, None] * stride_wn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        x = tl.load(x_rows + offs_k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        if DOT_F32:
            acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision=F32_PRECISION)
        else:
            acc += tl.dot(x, tl.trans(w.to(x.dtype)))
    tl.store(out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def _blocks(m: int, x_dtype: torch.dtype, w_dtype: torch.dtype) -> dict:
    """Tile sizes: narrow M (rows per expert are few in decode), wider K for 16-bit operands."""
    f32 = INTERPRET or torch.float32 in (x_dtype, w_dtype) or x_dtype != w_dtype
    return dict(BLOCK_M=16 if m <= 16 else 32 if m <= 32 else 64, BLOCK_N=64,
                BLOCK_K=32 if f32 else 64, DOT_F32=f32)


def _tiles(expert_offsets: torch.Tensor, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert of each M tile, its first row), active experts only, as int32 on x's device."""
    offsets = expert_offsets.long()
    counts = offsets[1:] - offsets[:-1]  # [E]
    per_expert = (counts + block_m - 1) // block_m
    experts = torch.repeat_interleave(torch.arange(len(counts), device=offsets.device), per_expert)
    first_tile = torch.cumsum(per_expert, 0) - per_expert
    index = torch.arange(len(experts), device=offsets.device) - first_tile[experts]
    rows = offsets[:-1][experts] + index * block_m
    return experts.to(torch.int32), rows.to(torch.int32)


def moe_grouped_gemm(x: torch.Tensor, w: torch.Tensor, expert_offsets: torch.Tensor) -> torch.Tensor:
    """Same contract as graft.kernels.reference.moe_grouped_gemm."""
    check_moe_gemm_args(x, w, expert_offsets)
    if x.dtype not in _DTYPES or w.dtype not in _DTYPES:
        raise ValueError(f"moe_grouped_gemm (triton) takes float32/bfloat16/float16 x and w, "
                         f"got {x.dtype} and {w.dtype}")
    _check_device("moe_grouped_gemm", x, w, expert_offsets)
    s, n = x.shape[0], w.shape[1]
    if x.stride(1) != 1:
        x = x.contiguous()
    if w.stride(2) != 1:
        w = w.contiguous()
    out_dtype = torch.float32 if INTERPRET and x.dtype == torch.bfloat16 else x.dtype
    out = torch.zeros(s, n, dtype=out_dtype, device=x.device)
    if s == 0 or n == 0:
        return out.to(x.dtype)
    avg_rows = -(-s // max(1, w.shape[0]))
    cfg = _blocks(avg_rows, x.dtype, w.dtype)
    tile_expert, tile_row = _tiles(expert_offsets, cfg["BLOCK_M"])
    if len(tile_expert):
        grid = (len(tile_expert), triton.cdiv(n, cfg["BLOCK_N"]))
        _moe_gemm_kernel[grid](x, w, out, tile_expert, tile_row, expert_offsets.to(torch.int32),
                               n, x.shape[1], x.stride(0), w.stride(0), w.stride(1), out.stride(0),
                               F32_PRECISION=_F32_PRECISION, num_warps=4, **cfg)
    return out.to(x.dtype)


def compile_spec(dt: str) -> tuple:
    """(name, kernel, pointer dtypes, float args, constexprs) of a decode-sized launch with x
    and w of dtype dt, in graft.kernels.compile_check's format."""
    f32 = dt == "fp32"
    pointers = dict(x_ptr=dt, w_ptr=dt, out_ptr=dt, tile_expert_ptr="i32", tile_row_ptr="i32",
                    offsets_ptr="i32")
    return ("moe_grouped_gemm", _moe_gemm_kernel, pointers, set(),
            dict(DOT_F32=f32, F32_PRECISION="tf32x3", BLOCK_M=16, BLOCK_N=64,
                 BLOCK_K=32 if f32 else 64))
