"""The CPU fast path: a step of a Llama-style model (Llama, Qwen2, Qwen3, and the MoE families
Qwen3-MoE and GLM-4.5) whose linears are all in the C layout (a quantized engine) runs every
layer in one C call (graft.kernels.cpu_decode) instead of ~12 Python-dispatched ops per layer.
Same C functions, same order: the same numbers as the per-op path. Activations fp32, or bf16
(a bf16 engine: dense layers over a bf16 KV cache). All-decode steps always; steps with prompt
chunks where the per-op path would run the C prefill attention and the C linears too."""

from __future__ import annotations

import ctypes
import os

import torch

from graft.kernels import cpu_decode, cpu_ops
from graft.kernels.dispatch import kernels_mode
from graft.serving.models.layers import AttentionMetadata

CACHE_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.int8: 3}  # decode_step_cpu.c codes
ACT_DTYPES = {torch.float32: 0, torch.bfloat16: 1}


def unsupported_reason(model, layer_class) -> str | None:
    """None when FusedDecode can run `model`, whose layers must have `layer_class`'s forward
    (norm, attention, norm, MLP: the layout the C step mirrors), else why not (for the log).
    A layer's MLP is a silu GatedMLP or an MoE block that runs in C (`c_desc()`), every
    linear in the C layout. GRAFT_FUSED_DECODE=0 turns it off (op by op, the same C linears:
    what `graft bench profile` needs to split a decode step into its parts)."""
    if os.environ.get("GRAFT_FUSED_DECODE", "1").strip() == "0":
        return "turned off by GRAFT_FUSED_DECODE=0"
    if not cpu_ops.available():
        return f"C kernels unavailable: {cpu_ops.unavailable_reason()}"
    act = model.embed_tokens.weight.dtype
    if act not in ACT_DTYPES:
        return f"activations are {act}, not fp32 or bf16"
    for i, layer in enumerate(model.layers):
        if not (isinstance(layer, layer_class) and type(layer).forward is layer_class.forward):
            return f"{type(layer).__name__} has its own layer layout"
        attn, mlp = layer.self_attn, layer.mlp
        linears = [attn.qkv_proj, attn.o_proj]
        if hasattr(mlp, "c_desc"):
            if act != torch.float32:
                return "the C MoE block takes fp32 activations"
            if mlp.c_desc() is None:
                return f"layer {i}'s MoE block cannot run in C (its experts are not C-layout silu MLPs)"
        elif not getattr(mlp, "is_silu", False):
            return "the MLP activation is not silu"
        else:
            linears += [mlp.gate_up_proj, mlp.down_proj]
        for lin in linears:
            if lin.quantized is None or "cpu" not in lin.quantized.packed:
                return f"layer {i} has a linear outside the C layout"
        if (attn.k_cache is None or attn.k_cache.dtype not in CACHE_DTYPES
                or not attn.k_cache.is_contiguous()):
            return "the KV cache is not a contiguous fp32, bf16 or int8 pool"
        if act != torch.float32 and attn.k_cache.dtype != act:
            return "bf16 activations need a bf16 KV cache"
    return None


class FusedDecode:
    """Descriptors of every layer, built once after the weights are packed and the KV cache
    is allocated; call it on an all-decode batch, or step() for ids to logits. An MoE layer's
    MLP is its block's C descriptor (router, experts, shared experts: kernels/csrc/moe_cpu.c)."""

    def __init__(self, model):
        layers = model.layers
        attn0 = layers[0].self_attn
        self.dtype = model.embed_tokens.weight.dtype
        cfg = model.config
        k_cache = attn0.k_cache
        self.dims = cpu_decode.Dims(
            hidden=cfg.hidden_size, num_heads=attn0.num_heads, num_kv_heads=attn0.num_kv_heads,
            head_dim=attn0.head_dim, rot=0, interleaved=int(attn0.interleaved),
            block_size=k_cache.shape[1], num_blocks=k_cache.shape[0], max_blocks=0,
            cache_dtype=CACHE_DTYPES[k_cache.dtype], act_dtype=ACT_DTYPES[self.dtype],
            eps=layers[0].input_layernorm.eps,
            qk_eps=attn0.q_norm.eps if attn0.q_norm is not None else 0.0, scale=attn0.scale)
        descs, moes, self._keep, self._linears = [], [], [], []
        for layer in layers:
            a, m = layer.self_attn, layer.mlp
            moe = m.c_desc() if hasattr(m, "c_desc") else None
            own = [a.qkv_proj, a.o_proj]
            own += [] if moe is not None else [m.gate_up_proj, m.down_proj]
            self._linears += own  # an MoE block's experts run in C whatever their buckets
            lin = [self._linear(x) for x in own] + [cpu_decode.LinearDesc()] * (4 - len(own))
            descs.append(cpu_decode.LayerDesc(
                *lin, layer.input_layernorm.weight.data_ptr(),
                layer.post_attention_layernorm.weight.data_ptr(),
                None if a.q_norm is None else a.q_norm.weight.data_ptr(),
                None if a.k_norm is None else a.k_norm.weight.data_ptr(),
                a.k_cache.data_ptr(), a.v_cache.data_ptr(),
                None if a.k_scale is None else a.k_scale.data_ptr(),
                None if a.v_scale is None else a.v_scale.data_ptr()))
            moes.append(None if moe is None else ctypes.addressof(moe))
            self._keep.append(moe)
        self.layers = (cpu_decode.LayerDesc * len(descs))(*descs)
        self.moes = (ctypes.c_void_p * len(moes))(*moes) if any(moes) else None
        self._scratch = torch.empty(0)
        self.step_desc = self._step_desc(model)
        # prompt chunks: where the per-op path runs the C prefill attention (head size, build)
        self.prefill_ok = cpu_ops.supports_prefill(
            torch.empty((1, attn0.num_heads, attn0.head_dim), dtype=self.dtype), k_cache)

    def _linear(self, lin) -> cpu_decode.LinearDesc:
        """The C view of a linear; a bf16 bias as an fp32 copy, which the C adds before the
        rounding, as the per-op path adds bias.float()."""
        bias = lin.bias
        if bias is not None and bias.dtype != torch.float32:
            bias = bias.float()
            self._keep.append(bias)
        return cpu_decode.linear_desc(lin.quantized, bias)

    @staticmethod
    def _step_desc(model) -> cpu_decode.StepDesc | None:
        """The embedding, final norm and head for whole steps, or None when the head is not
        a C-layout linear (then the model runs the head after the layers)."""
        head = model.head_quantized if model.lm_head is None else model.lm_head.quantized
        bias = None if model.lm_head is None else model.lm_head.bias
        if head is None or "cpu" not in head.packed or bias is not None:
            return None
        embedding = cpu_decode.embedding_fields(model.embed_tokens.weight, model.embed_quantized)
        if embedding is None:
            return None
        return cpu_decode.StepDesc(final_norm=model.norm.weight.data_ptr(), final_eps=model.norm.eps,
                                   head=cpu_decode.linear_desc(head, None), max_pos=0, **embedding)

    def step_applies(self, num_decodes: int, num_seqs: int) -> bool:
        """Whether step() can run a batch of num_seqs sequences, num_decodes of them decoding
        one token each (no image rows, no proposals: the runner checks those)."""
        return (self.step_desc is not None and num_decodes == num_seqs > 0
                and kernels_mode() in ("auto", "cpu"))

    def step(self, ids: list[int], positions: list[int], slots: list[int],
             tables: list[list[int]], lens: list[int], cos_table: torch.Tensor,
             sin_table: torch.Tensor) -> torch.Tensor:
        """A whole all-decode step in one C call: token ids -> logits [T, vocab] fp32 (the
        KV cache written), the same bits as embedding, __call__, final norm and head."""
        desc = self.step_desc
        desc.cos_table, desc.sin_table = cos_table.data_ptr(), sin_table.data_ptr()
        desc.max_pos = cos_table.shape[0]
        self.dims.rot = 2 * cos_table.shape[1]
        need = cpu_decode.step_scratch_floats(self.layers, self.moes, self.dims, len(ids))
        if self._scratch.numel() < need:
            self._scratch = torch.empty(need)
        return cpu_decode.decode_step(self.layers, self.moes, self.dims, desc, ids, positions,
                                      slots, tables, lens, self._scratch)

    def applies(self, meta: AttentionMetadata, h: torch.Tensor) -> bool:
        """Whether __call__ runs this step's layers: an all-decode step, or one with prompt
        chunks whose every linear takes the C kernel at this row count (a linear that
        graft.kernels.linear_dispatch measured faster on torch keeps the per-op path)."""
        rows = h.shape[0]
        if not (rows > 0 and h.dtype == self.dtype and kernels_mode() in ("auto", "cpu")):
            return False
        if meta.num_decodes == rows:
            return True
        return self.prefill_ok and not any(lin.on_torch(rows) for lin in self._linears)

    def __call__(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """(last MLP output, residual), as the per-layer loop returns them."""
        nd, rows = meta.num_decodes, h.shape[0]
        tables = lens = prefill = None
        if nd:
            tables = meta.decode_block_tables.to(torch.int32).contiguous()
            lens = meta.decode_context_lens.to(torch.int32).contiguous()
            self.dims.max_blocks = tables.shape[1]
        if nd < rows:  # the tensors stay referenced here until the call returns
            chunks = [t.to(torch.int32).contiguous() for t in (
                meta.prefill_block_tables, meta.prefill_cu_seqlens, meta.prefill_context_lens)]
            prefill = cpu_decode.prefill_desc(nd, *chunks, rows)
        self.dims.rot = 2 * cos.shape[1]  # cos/sin [T, R/2]: the first R dims rotate
        need = cpu_decode.scratch_floats(self.layers, self.moes, self.dims, rows)
        if self._scratch.numel() < need:
            self._scratch = torch.empty(need)
        h = h.contiguous()  # the embeddings' fresh tensor: overwritten in place
        cos, sin = cos.contiguous(), sin.contiguous()
        slots = meta.slot_mapping.to(torch.int64).contiguous()
        residual = cpu_decode.decode_layers(self.layers, self.moes, self.dims, h, cos, sin, slots,
                                            tables, lens, self._scratch, prefill)
        return h, residual
