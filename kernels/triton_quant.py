"""Triton weight-only linears for bf16, int8 and int4 weights (the formats of graft.kernels.quant_formats).

`quant_linear` has the contract of graft.kernels.quant_formats.quant_linear (the reference): x [..., K]
in fp32 / bf16 / fp16 times the dequantized weight, fp32 accumulation, x's dtype out. It reads
the canonical tensors as they are (int8 [N, K]; int4 bytes [N, K/2], low nibble = even column,
fp16 scales and mins [N, K/G], w = q * scale + min), so a weight needs no second copy on the GPU.

One kernel, two inner products, on the same [BN, BK] weight tiles (K contiguous, as stored):
- GEMM (more than 4 rows): `tl.dot` on tiles. Integer weights enter the dot as integers
  (q: exact in bf16 and fp16), and the scales multiply the fp32 partial sums afterwards
  (int8: once per output channel; int4 and int8-gG: once per K tile, the tile lying inside one
  group, so BLOCK_K divides G, plus for int4 min times the tile's sum of x). The products are then as exact as the
  reference's fp32 ones, where dequantizing to bf16 first would round every weight to 8 bits.
  fp32 activations use a TF32x3 dot on the GPU (not plain TF32) for the same reason.
- GEMV (1-4 rows, decode): broadcast multiply and sum in fp32, no padding of the rows to the
  dot's minimum of 16; the same scale placement.
Both can split K over programs (decode needs it to fill the GPU when N is small); the partial
sums land in an fp32 buffer summed in a fixed order, so results are deterministic. A row's
result can differ in the last bits between the two paths (summation order), as with any
batch-size-dependent GEMM.

Import it only after deciding about TRITON_INTERPRET (graft.kernels.dispatch does so lazily).
The interpreter rounds fp32 -> bf16 wrongly (truncates), so there the kernel stores fp32 and
torch casts, and every dot runs in fp32.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from graft.kernels.quant_formats import QuantizedWeight, QuantScheme, round_activations
from graft.kernels.triton_ops import INTERPRET, _check_device

__all__ = ["quant_linear", "launch_config", "compile_specs", "INTERPRET"]

_KIND = {"fp32": 0, "bf16": 0, "int8": 1, "int4": 2}  # 0: float weights, no scales
INT8_GROUPS = 3  # int8-gG: the kernel's KIND for int8 with a group size
_FLOAT_WEIGHT = {"fp32": torch.float32, "bf16": torch.bfloat16}
_X_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
GEMV_MAX_ROWS = 4
# fp32 dots on the GPU: three TF32 products (~fp32 accuracy; the integer weights are exact in
# TF32, so only x's rounding is split off) instead of the FMA "ieee" dot, which spills at these
# tiles; the interpreter computes in fp32 anyway
_F32_PRECISION = "ieee" if INTERPRET else "tf32x3"


@triton.jit
def _product(x, w, USE_DOT: tl.constexpr, DOT_F32: tl.constexpr, F32_PRECISION: tl.constexpr):
    """x [BM, BK] @ w [BN, BK]^T -> fp32 [BM, BN] (w as stored: K contiguous)."""
    if USE_DOT:
        if DOT_F32:
            p = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision=F32_PRECISION)
        else:  # integer / same-dtype weights are exact in x's dtype; the dot accumulates in fp32
            p = tl.dot(x, tl.trans(w.to(x.dtype)))
    else:
        p = tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
    return p


@triton.jit
def _quant_matmul_kernel(x_ptr, w_ptr, s_ptr, mn_ptr, b_ptr, out_ptr,
                         M, N, K, k_per_split, stride_xm, stride_wn, stride_sn, stride_split, stride_om,
                         KIND: tl.constexpr, GROUP: tl.constexpr, HAS_BIAS: tl.constexpr,
                         PARTIAL: tl.constexpr, USE_DOT: tl.constexpr, DOT_F32: tl.constexpr,
                         F32_PRECISION: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # one program: a BLOCK_M x BLOCK_N tile of the output over one K split
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    s_offs = offs_n.to(tl.int64) * stride_sn
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < k_end
        x = tl.load(x_rows + offs_k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        if KIND == 2:
            # BLOCK_K / 2 contiguous bytes per row; low nibble = even column (join interleaves)
            offs_b = k0 // 2 + tl.arange(0, BLOCK_K // 2)
            b = tl.load(w_rows + offs_b[None, :], mask=n_mask[:, None] & (offs_b < k_end // 2)[None, :], other=0)
            q = tl.join(b & 0xF, b >> 4).reshape(BLOCK_N, BLOCK_K).to(tl.int32)  # [BN, BK]
            # the launch keeps BLOCK_K | GROUP: the whole tile lies in group k0 // GROUP
            lo = tl.load(mn_ptr + s_offs + k0 // GROUP, mask=n_mask, other=0.0).to(tl.float32)
            s = tl.load(s_ptr + s_offs + k0 // GROUP, mask=n_mask, other=0.0).to(tl.float32)
            xsum = tl.sum(x.to(tl.float32), axis=1)  # [BM]: the min's share, sum_k x * min
            acc += _product(x, q, USE_DOT, DOT_F32, F32_PRECISION) * s[None, :] + xsum[:, None] * lo[None, :]
        else:
            w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0)
            if KIND == 3:  # int8-gG: the tile's group scale, as int4's
                s = tl.load(s_ptr + s_offs + k0 // GROUP, mask=n_mask, other=0.0)
                acc += _product(x, w, USE_DOT, DOT_F32, F32_PRECISION) * s[None, :]
            else:
                acc += _product(x, w, USE_DOT, DOT_F32, F32_PRECISION)
    if KIND == 1:  # int8: one scale per output channel
        acc *= tl.load(s_ptr + s_offs, mask=n_mask, other=0.0)[None, :]
    out_mask = m_mask[:, None] & n_mask[None, :]
    if PARTIAL:  # split K: fp32 partial sums, the wrapper adds them up (and the bias)
        tl.store(out_ptr + pid_k * stride_split + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :],
                 acc, mask=out_mask)
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :],
                 acc.to(out_ptr.dtype.element_ty), mask=out_mask)


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def launch_config(m: int, n: int, k: int, scheme: QuantScheme, x_dtype: torch.dtype,
                  device: torch.device, **tuning) -> dict:
    """Block sizes, split-K and warps for an [m, k] x [k, n] product; tuning overrides any of
    block_m, block_n, block_k, split_k, num_warps, num_stages. The defaults are chosen from
    sm_90 register/spill counts of the compiled kernels; the int4 128-row tile from an H200 sweep."""
    gemv = m <= GEMV_MAX_ROWS
    if gemv:  # 4 rows hold 4x the products in registers: narrower tiles
        cfg = dict(block_m=triton.next_power_of_2(max(m, 1)), block_n=64 if m <= 2 else 32, block_k=128,
                   num_warps=4, num_stages=3)
    elif _dot_in_f32(scheme, x_dtype):  # a TF32x3 dot keeps three products of each tile live
        block_m = min(64, max(16, triton.next_power_of_2(m)))
        cfg = dict(block_m=block_m, block_n=64, block_k=32, num_warps=8 if block_m == 64 else 4, num_stages=3)
    else:
        block_m = min(128, max(16, triton.next_power_of_2(m)))
        cfg = dict(block_m=block_m, block_n=128 if m > 64 else 64, block_k=64,
                   num_warps=8 if block_m == 128 else 4, num_stages=3)
    group = scheme.group_size
    if group:  # int4, int8-gG: a K tile must lie inside one group
        if scheme.kind == "int4" and not gemv and cfg["block_m"] == 128:
            # 128x128 int4 tiles spill; 128x64 at 4 warps took half the time at 512 rows on
            # an H200 (--sweep)
            cfg.update(block_n=64, num_warps=4)
        block_k = min(cfg["block_k"], group)
        if gemv:  # as many weights per tile as int8's: wider in N when the group narrows K
            cfg["block_n"] = cfg["block_n"] * cfg["block_k"] // block_k
        cfg["block_k"] = block_k
    unknown = set(tuning) - {*cfg, "split_k"}
    if unknown:
        raise ValueError(f"quant_linear (triton): unknown tuning {sorted(unknown)}; valid: {sorted({*cfg, 'split_k'})}")
    cfg.update({key: val for key, val in tuning.items() if key != "split_k"})
    if group and group % cfg["block_k"]:
        raise ValueError(f"quant_linear (triton): block_k={cfg['block_k']} must divide the {scheme.kind} group size {group}")
    k_tiles = triton.cdiv(k, cfg["block_k"])
    split = tuning.get("split_k")
    if split is None:  # split K until the programs fill the SMs (GEMV: two waves, to hide latency)
        tiles = triton.cdiv(m, cfg["block_m"]) * triton.cdiv(n, cfg["block_n"])
        target = 1 if device.type != "cuda" else (2 if gemv else 1) * _num_sms(device.index or 0)
        split = max(1, min(k_tiles, target // max(tiles, 1)))
    tiles_per_split = triton.cdiv(k_tiles, max(1, min(split, k_tiles)))
    cfg["k_per_split"] = tiles_per_split * cfg["block_k"]
    cfg["split_k"] = triton.cdiv(k_tiles, tiles_per_split)  # no empty splits
    cfg["gemv"] = gemv
    return cfg


def _dot_in_f32(scheme: QuantScheme, x_dtype: torch.dtype) -> bool:
    """Whether the GEMM dot takes fp32 operands: where one is not exact in x's dtype (fp32 x;
    float weights of another dtype)."""
    return x_dtype == torch.float32 or _FLOAT_WEIGHT.get(scheme.kind, x_dtype) != x_dtype


def _constexprs(scheme: QuantScheme, x_dtype: torch.dtype, cfg: dict, has_bias: bool) -> dict:
    # always fp32 in the interpreter, whose bf16 arithmetic is wrong
    kind = INT8_GROUPS if scheme.kind == "int8" and scheme.group_size else _KIND[scheme.kind]
    return dict(KIND=kind, GROUP=max(scheme.group_size, 1), HAS_BIAS=has_bias,
                PARTIAL=cfg["split_k"] > 1, USE_DOT=not cfg["gemv"],
                DOT_F32=INTERPRET or _dot_in_f32(scheme, x_dtype),
                F32_PRECISION=_F32_PRECISION, BLOCK_M=cfg["block_m"], BLOCK_N=cfg["block_n"],
                BLOCK_K=cfg["block_k"])


def compile_specs(dt: str) -> list[tuple]:
    """(name, kernel, pointer dtypes, float args, constexprs) of the default launches for
    activations of dtype dt ("fp16" | "bf16" | "fp32"), in graft.kernels.compile_check's format,
    so that the kernels can be built for sm_90 on a machine without a GPU."""
    x_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dt]
    cpu = torch.device("cpu")
    specs = []
    for name, scheme, m, split_k, w_ptr, s_ptr in (
            ("int8_gemv_split_k", "int8", 1, 4, "i8", "fp32"), ("int4_g32_gemv", "int4-g32", 4, 1, "u8", "fp16"),
            ("int4_g128_gemm", "int4-g128", 512, 1, "u8", "fp16"), ("int8_gemm", "int8", 64, 1, "i8", "fp32"),
            ("bf16_gemm", "bf16", 256, 1, "bf16", "bf16"), ("int8_g16_gemv", "int8-g16", 1, 1, "i8", "fp32"),
            ("int8_g32_gemm", "int8-g32", 128, 1, "i8", "fp32")):
        sc = QuantScheme.parse(scheme)
        cfg = launch_config(m, 4096, 4096, sc, x_dtype, cpu, split_k=split_k)
        pointers = dict(x_ptr=dt, w_ptr=w_ptr, s_ptr=s_ptr, mn_ptr="fp16", b_ptr="fp32",
                        out_ptr="fp32" if split_k > 1 else dt)
        specs.append((name, _quant_matmul_kernel, pointers, set(), _constexprs(sc, x_dtype, cfg, True)))
    return specs


def _on_device(weight: QuantizedWeight, device: torch.device) -> list[torch.Tensor]:
    """The weight's canonical tensors on `device`, contiguous; a copy made once and cached in
    weight.packed["triton"] when they live elsewhere (e.g. loaded on the CPU)."""
    tensors = [t for t in (weight.qweight, weight.scales, weight.mins) if t is not None]
    if all(t.device == device and t.is_contiguous() for t in tensors):
        return tensors
    cached = weight.packed.get("triton")
    if cached is None or cached[0] != device:
        cached = (device, [t.to(device).contiguous() for t in tensors])
        weight.packed["triton"] = cached
    return cached[1]


def quant_linear(x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None = None,
                 **tuning) -> torch.Tensor:
    """Same contract as graft.kernels.quant_formats.quant_linear. tuning: see launch_config."""
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"quant_linear: x has {x.shape[-1]} input features, the weight takes {k}")
    if weight.scheme.act8:  # the -a8 schemes: x rounded in torch, the int4 kernel on that fp32 x_hat
        return _launch(round_activations(x), weight, bias, **tuning).to(x.dtype)
    return _launch(x, weight, bias, **tuning)


def _launch(x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None, **tuning) -> torch.Tensor:
    """quant_linear on x as the kernel multiplies it (x's last dim checked by the caller)."""
    n, k = weight.shape
    kind = weight.scheme.kind
    if kind not in _KIND or x.dtype not in _X_DTYPES:
        raise ValueError(f"quant_linear (triton) takes {', '.join(_KIND)} weights and float32/bfloat16/"
                         f"float16 x, got {weight.scheme.name} and {x.dtype}")
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"quant_linear: bias shape {tuple(bias.shape)} must be ({n},)")
    _check_device("quant_linear", x, *([] if bias is None else [bias]))
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    if m == 0 or n == 0:
        return x.new_zeros(*lead, n)
    tensors = _on_device(weight, x.device)
    qweight = tensors[0]
    scales = tensors[1] if len(tensors) > 1 else qweight  # unused by float weights
    mins = tensors[2] if len(tensors) > 2 else qweight
    bias_c = None if bias is None else bias.contiguous()
    cfg = launch_config(m, n, k, weight.scheme, x.dtype, x.device, **tuning)
    partial = cfg["split_k"] > 1
    out_dtype = torch.float32 if partial or (INTERPRET and x.dtype == torch.bfloat16) else x.dtype
    out = torch.empty((cfg["split_k"], m, n) if partial else (m, n), dtype=out_dtype, device=x.device)
    grid = (triton.cdiv(m, cfg["block_m"]), triton.cdiv(n, cfg["block_n"]), cfg["split_k"])
    _quant_matmul_kernel[grid](
        x2, qweight, scales, mins, qweight if bias_c is None else bias_c, out,
        m, n, k, cfg["k_per_split"], x2.stride(0), qweight.stride(0),
        scales.stride(0) if weight.scheme.group_size else 1, m * n if partial else 0, n,
        **_constexprs(weight.scheme, x.dtype, cfg, bias_c is not None),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    if partial:
        out = out.sum(0)
        if bias_c is not None:
            out += bias_c.float()
    return out.to(x.dtype).reshape(*lead, n)
