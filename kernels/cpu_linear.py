"""Linear layers on oneDNN-prepacked weights, for CPU inference.

torch's F.linear on CPU calls MKL's sgemm. On the AMD EPYC this project is measured on, that
runs the skinny products of decoding (32 rows against SmolLM2's weights) at 50-80 GFLOP/s per
core; oneDNN, with each weight reordered once into its blocked layout, runs them at 85-110
(1.7x over a decode step's matmuls, 1.2-1.35x at 512 rows). These are the ops torch's own
compiler uses for frozen CPU weights. Results differ from MKL's only in float rounding
(summation order), as any two GEMM libraries do.

GRAFT_KERNELS=reference or GRAFT_CPU_KERNELS=0 turns it off (plain F.linear).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

DTYPES = (torch.float32, torch.bfloat16)


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """An opaque oneDNN copy of weight [out, in], for packed_linear."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] @ weight.T + bias, with the weight from pack_weight."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@functools.cache
def unavailable_reason(dtype: torch.dtype) -> str | None:
    """None when packed linears work for dtype on this machine, else why not (checked once)."""
    if dtype not in DTYPES:
        return f"packed linears take {', '.join(map(str, DTYPES))}, not {dtype}"
    if not torch.backends.mkldnn.is_available():
        return "this torch was built without oneDNN (mkldnn)"
    ops = torch.ops.mkldnn
    if not (hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")):
        return "this torch has no mkldnn._reorder_linear_weight / _linear_pointwise"
    if dtype == torch.bfloat16 and not ops._is_mkldnn_bf16_supported():
        return "this CPU has no native bf16 for oneDNN"
    try:  # a self-check against F.linear in fp32, bias included
        g = torch.Generator().manual_seed(0)
        w, x, b = (torch.randn(*s, generator=g) for s in ((40, 24), (3, 24), (40,)))
        got = packed_linear(x.to(dtype), pack_weight(w.to(dtype)), b.to(dtype)).float()
    except RuntimeError as err:
        return f"oneDNN packed linear failed: {err}"
    want = F.linear(x.to(dtype).float(), w.to(dtype).float(), b.to(dtype).float())
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    if not torch.allclose(got, want, atol=tol * want.abs().max().item(), rtol=tol):
        return "oneDNN packed linear failed its self-check against F.linear"
    return None


def enabled(dtype: torch.dtype) -> bool:
    """Whether the engine should prepack its CPU linears of this dtype."""
    from graft.kernels.cpu_ops import disabled_by_env
    from graft.kernels.dispatch import kernels_mode

    if kernels_mode() == "reference" or disabled_by_env():
        return False
    return unavailable_reason(dtype) is None
