"""Llama-style decoders (Llama/SmolLM2, Qwen2, Qwen3) over the paged KV cache.

One implementation with flags: qkv bias (Qwen2), per-head q/k RMSNorm and explicit head_dim
(Qwen3), tied embeddings (SmolLM2, Qwen3 small). Op order follows transformers so greedy
tokens match HF `generate`.
"""

from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

from graft.kernels import quant_linear
from graft.kernels.cpu_linear import pack_weight, packed_linear
from graft.kernels.quant_formats import QuantScheme, quantize
from graft.serving.models.layers import (Attention, AttentionMetadata, GatedMLP, Linear, RMSNorm,
                                         embed_tokens, shape_only, splice_rows)
from graft.serving.models.quant_config import EMBEDDING


class DecoderLayer(nn.Module):
    def __init__(self, cfg, flags: dict):
        super().__init__()
        self.self_attn = Attention(
            cfg.hidden_size, cfg.num_attention_heads, flags["num_kv_heads"], flags["head_dim"],
            qkv_bias=flags["qkv_bias"], o_bias=flags["o_bias"], interleaved=flags["interleaved"],
            qk_norm_eps=cfg.rms_norm_eps if flags["qk_norm"] else None)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act,
                            bias=flags["mlp_bias"])
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def input_norm(self, h, residual):
        """(normed, residual); the previous block's residual add is fused in (same sums as HF)."""
        if residual is None:
            return self.input_layernorm(h), h
        return self.input_layernorm(h, residual)

    def forward(self, h, residual, cos, sin, meta):
        h, residual = self.input_norm(h, residual)
        h = self.self_attn(h, cos, sin, meta)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class CausalLM(nn.Module):
    """Embedding -> decoder layers -> final norm -> logits of the selected positions."""

    layer_cls = DecoderLayer
    interleaved_rope = False
    graph_unsafe_reason: str | None = None  # why decode steps cannot be captured as CUDA graphs

    def __init__(self, cfg, flags: dict):
        super().__init__()
        self.config = cfg
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        flags = dict(flags, head_dim=head_dim, interleaved=self.interleaved_rope,
                     num_kv_heads=getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        self.head_dim, self.num_kv_heads = head_dim, flags["num_kv_heads"]
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(self.build_layer(cfg, flags, i)
                                    for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.tie_word_embeddings = bool(getattr(cfg, "tie_word_embeddings", False))
        self.lm_head = None if self.tie_word_embeddings else Linear(
            cfg.hidden_size, cfg.vocab_size, bias=False)
        self.head_prepacked = None  # tied head's oneDNN copy (the embedding stays plain)
        self.head_quantized = None  # tied head's low-precision copy
        self.embed_quantized = None  # the table in a plan's EMBEDDING scheme (canonical rows)
        self.fused_decode = None  # the CPU one-call decode step (graft.serving.models.fused_decode)

    def build_layer(self, cfg, flags: dict, index: int) -> nn.Module:
        """Decoder layer `index` (MoE families make some layers dense, some sparse)."""
        return self.layer_cls(cfg, flags)

    def prepack_linears(self) -> None:
        """Put every projection and the output head not quantized on oneDNN-prepacked weights (CPU)."""
        for module in self.modules():
            if isinstance(module, Linear):
                module.prepack()
        if self.lm_head is None and self.head_quantized is None:
            self.head_prepacked = pack_weight(self.embed_tokens.weight)

    def quantize_linears(self, plan: dict[str, QuantScheme], fp32_in_c_layout: bool = False) -> None:
        """Hold each linear in its planned scheme (graft.serving.models.quant_config). fp32 ones
        stay as they are, or with fp32_in_c_layout (CPU) move to the C kernels' layout too, so
        a decode step can run in one call (enable_fused_decode)."""
        for name, scheme in plan.items():
            if name == EMBEDDING or self.linear_weight(name) is not None \
                    or scheme.kind == "fp32" and not fp32_in_c_layout:
                continue  # (the table below; a linear held already: a GGUF's int4 blocks)
            if name == "lm_head" and self.lm_head is None:
                self.head_quantized = quantize(self.embed_tokens.weight, scheme)
            else:
                self.get_submodule(name).quantize(scheme)
        scheme = plan.get(EMBEDDING)
        if scheme is not None and scheme.kind != "fp32":  # a GGUF's blocks may hold it already
            held = self.embed_quantized
            self.hold_embedding(quantize(self.embed_tokens.weight, scheme) if held is None else held)

    def hold_embedding(self, weight) -> None:
        """Look rows up in `weight` (a QuantizedWeight [vocab, hidden], canonical) from now on;
        the table itself keeps only its shape unless an unquantized tied head multiplies by it."""
        self.embed_quantized = weight
        table = self.embed_tokens.weight
        if (self.lm_head is not None or self.head_quantized is not None) and not table.is_meta:
            self.embed_tokens.weight = shape_only(table)

    def read_table_from_head(self) -> bool:
        """Once the head is packed: a tied head held as the table's own values in the C layout
        (fp32 in an fp32 engine, bf16 in a bf16 one; its canonical copy dropped) serves the
        lookups too (graft.kernels.cpu_quant.layout_rows), and the table is freed. Whether it does."""
        head, table = self.head_quantized, self.embed_tokens.weight
        kind = {torch.float32: "fp32", torch.bfloat16: "bf16"}.get(table.dtype)
        if (self.lm_head is not None or head is None or self.embed_quantized is not None
                or table.is_meta or head.scheme.kind != kind or "cpu" not in head.packed
                or head.tensors()):
            return False
        self.hold_embedding(head)
        return True

    def embed(self, input_ids: torch.Tensor, override=None) -> torch.Tensor:
        """[T, d_model] in the activations' dtype: embed_tokens' rows, or the held table's."""
        if self.embed_quantized is None:
            return embed_tokens(self.embed_tokens, input_ids, override)
        rows = self.embed_quantized.rows(input_ids.clamp(min=0)).to(self.embed_tokens.weight.dtype)
        return rows if override is None else splice_rows(rows, override)

    def linear_weight(self, name: str):
        """What linear `name` (a module name, or "lm_head") runs on: its QuantizedWeight, or
        None for the module's own torch weight."""
        if name == "lm_head" and self.lm_head is None:
            return self.head_quantized
        return self.get_submodule(name).quantized

    def set_linear_weights(self, weights: dict) -> None:
        """Swap linears' weights in place ({name: QuantizedWeight or None}, as linear_weight
        returns them), e.g. for a quantization search over one loaded model. The one-call
        decode step reads weights through descriptors, so when it was on the new weights are
        packed in the C layout (and moved to 2 MB pages, as at load: a search then times
        every plan as a freshly loaded engine would run it) and it is rebuilt."""
        from graft.kernels import cpu_quant

        fused = self.fused_decode is not None
        for name, weight in weights.items():
            if fused and weight is not None:
                cpu_quant.pack_only(weight)
            if name == "lm_head" and self.lm_head is None:
                self.head_quantized = weight
            else:
                module = self.get_submodule(name)
                # the measured choice of path was for the old format: the C kernels until a
                # new plan_linear_paths (graft.serving.models.linear_paths)
                module.quantized, module.torch_buckets = weight, frozenset()
        if weights and fused:
            cpu_quant.gather_on_huge_pages([w for w in weights.values() if w is not None])
            self.enable_fused_decode()

    def enable_fused_decode(self) -> str | None:
        """Run all-decode steps in one C call when every layer can; returns why not, or None."""
        from graft.serving.models.fused_decode import FusedDecode, unsupported_reason

        reason = unsupported_reason(self, DecoderLayer)
        self.fused_decode = FusedDecode(self) if reason is None else None
        return reason

    def quantized_weights(self) -> list:
        """Every low-precision weight the model holds (graft.kernels.quant_formats.QuantizedWeight)."""
        found = [m.quantized for m in self.modules() if isinstance(m, Linear) and m.quantized is not None]
        return found + ([self.head_quantized] if self.head_quantized is not None else [])

    def resident_tensors(self) -> list[torch.Tensor]:
        """Every tensor that holds memory: after prepack_linears() / quantize_linears() the
        oneDNN and low-precision copies, not the shape-only (meta) plain weights."""
        tensors = [t for t in [*self.parameters(), *self.buffers()] if not t.is_meta]
        for m in self.modules():
            if isinstance(m, Linear) and m.prepacked is not None:
                tensors.append(m.prepacked)
        for q in self.quantized_weights():
            tensors += q.tensors() + [t for p in q.packed.values() for t in p.tensors()]
        tensors += self.embed_quantized.tensors() if self.embed_quantized is not None else []
        return tensors + ([self.head_prepacked] if self.head_prepacked is not None else [])

    def weight_bytes_per_token(self) -> int:
        """Bytes of linear weights one decode step reads (every projection and the head once;
        the packed layout each kernel reads, padding included)."""
        total = sum(self.linear_read_bytes(m) for m in self.modules() if isinstance(m, Linear))
        if self.lm_head is None:
            total += (self.head_quantized.read_bytes() if self.head_quantized is not None
                      else self.embed_tokens.weight.numel() * self.embed_tokens.weight.element_size())
        return total

    def linear_read_bytes(self, m: Linear) -> int:
        """Bytes one matmul of linear `m` reads (its packed layout, padding included)."""
        if m.quantized is not None:
            return m.quantized.read_bytes()
        if m.prepacked is not None or not m.weight.is_meta:
            return m.out_features * m.in_features * self.embed_tokens.weight.element_size()
        return 0

    @property
    def output_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def forward(self, input_ids: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                meta: AttentionMetadata, logits_indices: torch.Tensor,
                embeds_override: tuple[torch.Tensor, torch.Tensor] | None = None,
                hidden_indices: torch.Tensor | None = None):
        """input_ids [T] -> logits [len(logits_indices), vocab] in fp32; with hidden_indices,
        (logits, the final norm's output at those rows in fp32: what embeddings pool)."""
        h = self.embed(input_ids, embeds_override)  # [T, d_model]
        fused = self.fused_decode
        if fused is not None and fused.applies(meta, h):  # image rows are in h already
            h, residual = fused(h, cos, sin, meta)
        else:
            residual = None
            for layer in self.layers:
                h, residual = layer(h, residual, cos, sin, meta)
        # the final norm is per token: only the positions that need logits (or are pooled)
        rows = logits_indices if hidden_indices is None else torch.cat([logits_indices,
                                                                         hidden_indices])
        h, _ = self.norm(h[rows], residual[rows])
        if hidden_indices is None:
            return self._logits(h)
        n = logits_indices.shape[0]
        return self._logits(h[:n]), h[n:].float()

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        if self.lm_head is not None:
            return self.lm_head(h).float()  # [B, vocab]
        if self.head_quantized is not None:
            return quant_linear(h, self.head_quantized).float()
        if self.head_prepacked is not None:
            return packed_linear(h, self.head_prepacked).float()
        return F.linear(h, self.embed_tokens.weight).float()

    # HF checkpoint name -> (our packed parameter, shard index)
    packed_names = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1),
                    "v_proj": ("qkv_proj", 2), "gate_proj": ("gate_up_proj", 0),
                    "up_proj": ("gate_up_proj", 1)}


def llama_flags(cfg) -> dict:
    bias = bool(getattr(cfg, "attention_bias", False))
    return dict(qkv_bias=bias, o_bias=bias, mlp_bias=bool(getattr(cfg, "mlp_bias", False)),
                qk_norm=False)


def qwen2_flags(cfg) -> dict:
    return dict(qkv_bias=True, o_bias=False, mlp_bias=False, qk_norm=False)


def qwen3_flags(cfg) -> dict:
    bias = bool(getattr(cfg, "attention_bias", False))
    return dict(qkv_bias=bias, o_bias=bias, mlp_bias=False, qk_norm=True)
