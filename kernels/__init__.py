"""Triton kernels, each with a pure-PyTorch reference of the same signature.

The engine calls these ops only through this module; graft.kernels.dispatch picks Triton on
CUDA, and on CPU the C kernels of cpu_ops where they apply (decode attention; fp32/bf16
norm, rotary, KV store, silu * up) and the reference for the rest (GRAFT_KERNELS=reference forces
the reference). cpu_linear holds the oneDNN-prepacked
linears the engine's CPU model runs its projections on.
"""

from graft.kernels.dispatch import (apply_rotary, argmax, backend_name, moe_grouped_gemm,
                                    paged_attention_decode, paged_attention_prefill, quant_linear,
                                    rms_norm, rope_cos_sin, silu_mul, store_kv)

__all__ = ["apply_rotary", "argmax", "backend_name", "moe_grouped_gemm", "paged_attention_decode",
           "paged_attention_prefill", "quant_linear", "rms_norm", "rope_cos_sin", "silu_mul",
           "store_kv"]
