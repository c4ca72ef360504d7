"""Building blocks shared by the decoder families: fused projections, paged attention, RoPE.

All attention, KV-store, RMSNorm and rotary math goes through graft.kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
import torch.nn.functional as F

from graft.kernels import (apply_rotary, paged_attention_decode, paged_attention_prefill,
                           quant_linear, rms_norm, silu_mul, store_kv)
from graft.kernels.cpu_linear import pack_weight, packed_linear
from graft.kernels.linear_dispatch import bucket, torch_linear
from graft.kernels.quant_formats import QuantizedWeight, QuantScheme, quantize


@dataclass
class AttentionMetadata:
    """Batch layout of one forward: `num_decodes` single-token sequences, then prefill chunks."""

    slot_mapping: torch.Tensor  # [T] int64 cache slot of every token
    num_decodes: int  # first num_decodes tokens are one-token sequences
    decode_block_tables: torch.Tensor | None  # [num_decodes, max_blocks] int32
    decode_context_lens: torch.Tensor | None  # [num_decodes] int32
    prefill_block_tables: torch.Tensor | None  # [num_prefills, max_blocks] int32
    prefill_cu_seqlens: torch.Tensor | None  # [num_prefills + 1] int32, offsets from num_decodes
    prefill_context_lens: torch.Tensor | None  # [num_prefills] int32


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        return rms_norm(x, self.weight, self.eps, residual)


def shape_only(weight: torch.Tensor) -> nn.Parameter:
    """`weight` on meta: its shape and dtype kept, its memory freed (another copy is used)."""
    return nn.Parameter(weight.detach().to("meta"), requires_grad=False)


class Linear(nn.Linear):
    """nn.Linear that, after prepack(), runs on a oneDNN-prepacked copy of its weight (CPU
    inference, graft.kernels.cpu_linear), or after quantize(), on a low-precision copy
    (graft.kernels.quant_formats); the plain weight then keeps only its shape (meta)."""

    prepacked: torch.Tensor | None = None
    quantized: QuantizedWeight | None = None
    # row buckets whose calls run the torch path over the quantized weight, not the C kernel
    # (graft.kernels.linear_dispatch: measured on this machine at engine load)
    torch_buckets: frozenset = frozenset()

    def prepack(self) -> None:
        if self.quantized is None:
            self.prepacked = pack_weight(self.weight)
            self._drop_weight()

    def quantize(self, scheme: QuantScheme) -> None:
        self.hold(quantize(self.weight, scheme))

    def hold(self, weight: QuantizedWeight) -> None:
        """Run on `weight` from now on; the plain weight keeps only its shape (meta)."""
        self.quantized = weight
        self._drop_weight()

    def _drop_weight(self) -> None:
        self.weight = shape_only(self.weight)

    def on_torch(self, rows: int) -> bool:
        """Whether a call of `rows` rows runs the torch path, not the C kernel (torch_buckets)."""
        return bool(self.torch_buckets) and bucket(rows) in self.torch_buckets

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.quantized is not None:
            if self.on_torch(x.numel() // self.in_features):
                return torch_linear(x, self.quantized, self.bias)
            return quant_linear(x, self.quantized, self.bias)
        if self.prepacked is not None:
            return packed_linear(x, self.prepacked, self.bias)
        return super().forward(x)


class PackedLinear(Linear):
    """One matmul for several HF projections stacked on the output dim (q|k|v, gate|up)."""

    def __init__(self, in_features: int, shard_sizes: list[int], bias: bool):
        super().__init__(in_features, sum(shard_sizes), bias=bias)
        self.shard_sizes = shard_sizes

    def shard(self, param: torch.Tensor, index: int) -> torch.Tensor:
        offset = sum(self.shard_sizes[:index])
        return param.narrow(0, offset, self.shard_sizes[index])


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, act: str, bias: bool = False):
        super().__init__()
        from transformers.activations import ACT2FN

        self.gate_up_proj = PackedLinear(hidden, [intermediate, intermediate], bias)
        self.down_proj = Linear(intermediate, hidden, bias=bias)
        self.act = ACT2FN[act]
        self.is_silu = act == "silu"  # the families' usual act: one fused op (graft.kernels)
        self.intermediate = intermediate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.activate(self.gate_up_proj(x)))

    def activate(self, gate_up: torch.Tensor) -> torch.Tensor:
        """act(gate) * up of gate_up [T, 2I] -> [T, I]."""
        if self.is_silu:
            return silu_mul(gate_up, self.intermediate)
        gate, up = gate_up.split(self.intermediate, dim=-1)
        # act() returns a fresh tensor: multiply into it (one [T, I] temporary less)
        return self.act(gate).mul_(up)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float, k_scale: torch.Tensor | None = None,
                    v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """q [T, Hq, D] over the paged cache (this step's K/V already stored) -> [T, Hq, D];
    k_scale/v_scale for an int8 cache."""
    nd = meta.num_decodes
    sc = dict(k_scale=k_scale, v_scale=v_scale)  # None for float caches: dispatch drops them
    if nd == q.shape[0]:
        return paged_attention_decode(q, k_cache, v_cache, meta.decode_block_tables,
                                      meta.decode_context_lens, scale, **sc)
    if nd == 0:
        return paged_attention_prefill(q, k_cache, v_cache, meta.prefill_block_tables,
                                       meta.prefill_cu_seqlens, meta.prefill_context_lens, scale,
                                       **sc)
    out_d = paged_attention_decode(q[:nd], k_cache, v_cache, meta.decode_block_tables,
                                   meta.decode_context_lens, scale, **sc)
    out_p = paged_attention_prefill(q[nd:], k_cache, v_cache, meta.prefill_block_tables,
                                    meta.prefill_cu_seqlens, meta.prefill_context_lens, scale, **sc)
    return torch.cat([out_d, out_p])


class Attention(nn.Module):
    """GQA self-attention over the paged KV cache, with optional per-head q/k RMSNorm."""

    def __init__(self, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 qkv_bias: bool, o_bias: bool, interleaved: bool,
                 qk_norm_eps: float | None = None):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_size, self.kv_size = num_heads * head_dim, num_kv_heads * head_dim
        self.qkv_proj = PackedLinear(hidden, [self.q_size, self.kv_size, self.kv_size], qkv_bias)
        self.o_proj = Linear(self.q_size, hidden, bias=o_bias)
        self.q_norm = self.k_norm = None
        if qk_norm_eps is not None:
            self.q_norm = RMSNorm(head_dim, qk_norm_eps)
            self.k_norm = RMSNorm(head_dim, qk_norm_eps)
        self.interleaved = interleaved
        self.scale = head_dim ** -0.5
        self.k_cache = self.v_cache = None  # [num_blocks, block_size, Hkv, D], set by the runner
        self.k_scale = self.v_scale = None  # an int8 cache's [num_blocks, block_size, Hkv] scales

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        T = x.shape[0]
        qkv = self.qkv_proj(x)  # [T, (Hq + 2 Hkv) D]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(T, self.num_heads, self.head_dim)
        k = k.reshape(T, self.num_kv_heads, self.head_dim)
        v = v.reshape(T, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:  # per head: as [tokens * heads, D] rows (the C norm's shape)
            q = self.q_norm(q.reshape(-1, self.head_dim)).view(T, self.num_heads, self.head_dim)
            k = self.k_norm(k.reshape(-1, self.head_dim)).view(T, self.num_kv_heads, self.head_dim)
        # cos/sin are [T, R/2]: the first R dims rotate (R < head_dim for partial rotary)
        q = apply_rotary(q, cos, sin, self.interleaved)
        k = apply_rotary(k, cos, sin, self.interleaved)
        store_kv(k, v, self.k_cache, self.v_cache, meta.slot_mapping, self.k_scale, self.v_scale)
        out = paged_attention(q, self.k_cache, self.v_cache, meta, self.scale,
                              self.k_scale, self.v_scale)  # [T, Hq, D]
        return self.o_proj(out.reshape(T, self.q_size))


SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def rope_inv_freq(hf_config, head_dim: int) -> tuple[torch.Tensor, float, int]:
    """(inv_freq [R/2], attention scaling, rotary dim R) exactly as transformers builds them."""
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"config.json rope_scaling/rope_parameters rope_type={rope_type!r} is not supported by "
            f"the graft engine; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
    partial = params.get("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", 1.0))
    rotary_dim = int(head_dim * (partial or 1.0))
    if rope_type == "default":
        base = params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
        exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
        return 1.0 / (base ** exponents), 1.0, rotary_dim
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_config, torch.device("cpu"))
    return inv_freq.float(), float(scaling), 2 * inv_freq.shape[0]


def embed_tokens(embedding: nn.Embedding, input_ids: torch.Tensor,
                 override: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """Embedding rows for ids >= 0; negative ids (image placeholders) get `override` rows."""
    # clamp: a negative id must never index the table (the engine rejects requests whose
    # placeholders have no mm_inputs, so every negative position is overwritten below)
    embeds = F.embedding(input_ids.clamp(min=0), embedding.weight)  # [T, d_model]
    return embeds if override is None else splice_rows(embeds, override)


def splice_rows(embeds: torch.Tensor, override: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """embeds with the image placeholders' rows replaced: override = (mask [T], rows)."""
    from graft.inject import splice

    mask, rows = override
    return splice(embeds, mask, rows)
