"""GLM-4 decoder: Llama layout plus post-attention / post-MLP norms and interleaved partial RoPE."""

from __future__ import annotations

from graft.serving.models.layers import RMSNorm
from graft.serving.models.llama import CausalLM, DecoderLayer


class Glm4DecoderLayer(DecoderLayer):
    def __init__(self, cfg, flags: dict):
        super().__init__(cfg, flags)
        self.post_self_attn_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_mlp_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, h, residual, cos, sin, meta):
        h, residual = self.input_norm(h, residual)
        h = self.post_self_attn_layernorm(self.self_attn(h, cos, sin, meta))
        h, residual = self.post_attention_layernorm(h, residual)
        return self.post_mlp_layernorm(self.mlp(h)), residual


class Glm4CausalLM(CausalLM):
    layer_cls = Glm4DecoderLayer
    interleaved_rope = True  # GLM rotates (2i, 2i+1) pairs of the first rotary_dim dims


def glm4_flags(cfg) -> dict:
    return dict(qkv_bias=bool(getattr(cfg, "attention_bias", True)), o_bias=False,
                mlp_bias=False, qk_norm=False)
