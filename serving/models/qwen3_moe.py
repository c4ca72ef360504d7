"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3 attention, softmax top-k routed experts."""

from __future__ import annotations

from graft.serving.models.llama import qwen3_flags


def qwen3_moe_flags(cfg) -> dict:
    sparse_step = int(getattr(cfg, "decoder_sparse_step", 1) or 1)
    dense = set(getattr(cfg, "mlp_only_layers", None) or [])
    num_experts = int(cfg.num_experts)
    return dict(qwen3_flags(cfg), moe=dict(
        scoring="softmax", num_experts=num_experts,
        # transformers' rule: a layer is sparse unless listed in mlp_only_layers or off the step
        sparse=lambda i: i not in dense and num_experts > 0 and (i + 1) % sparse_step == 0))
